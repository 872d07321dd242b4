"""The train and eval steps of TensorFlow: what XLA compiles, the counterpart of :mod:`jax_impl.step`.

The train state and what changes it: Adam on the shared LR table, fp16's dynamic loss scale, the
weight average, the train step (the loss, its gradients, the update) and the eval step, compiled once
ahead of the first epoch (:func:`compile_steps`). The loop that runs them is :mod:`tf_impl.train`.

TensorFlow: ``tf.function``s compiled with XLA (``jit_compile=enable_jit``), run per replica by the
``tf.distribute`` strategy, which sums the gradients over the replicas; the step updates the model's
and the optimizer's variables in place.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import keras
import numpy as np
import tensorflow as tf

from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.runtime import logs

from tf_impl import data as data_mod
from tf_impl import distribute, ema
from tf_impl.loss import loss_fn

log = logging.getLogger("dlas.tf")


@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a step changes: the step count, the float32 parameters, Adam's state, fp16's loss
    scale (or None) and the weight average of ``ema_decay`` (or None).

    TensorFlow: variables the step updates in place, of the model and of the optimizer (which holds the
    step count, the loss scale and the average), and the variables that keep the trained weights while
    the average is read (:func:`tf_impl.ema.averaged`)."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer | None = None  # None: the model alone (inference)
    ema_backup: list | None = None


class TableSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The shared LR table indexed by the optimizer's step count, clamped to the last entry."""

    def __init__(self, table: np.ndarray):
        self.table = np.asarray(table, np.float32)

    def __call__(self, step):
        idx = tf.minimum(tf.cast(step, tf.int32), len(self.table) - 1)
        return tf.gather(tf.constant(self.table), idx)

    def get_config(self):
        return {"table": self.table.tolist()}


def make_optimizer(cfg: Config, lr_table: np.ndarray) -> keras.optimizers.Optimizer:
    """Adam (betas 0.9/0.999, eps 1e-8, as JAX) on the shared LR table, with the weight average of
    ``ema_decay`` (:mod:`tf_impl.ema`); in Keras' ``LossScaleOptimizer`` for float16. Keras applies eps as
    ``m / (sqrt(v) + eps)`` on uncorrected moments, optax as ``m_hat / (sqrt(v_hat) + eps)``: the
    effective eps differs by 1 / sqrt(1 - beta_2^t), negligible unless gradients are ~1e-7."""
    if cfg.adam_update != "per_tensor":  # Keras' Adam updates each variable; JAX's flat form is optax.flatten
        raise UserError(f"config key 'adam_update': TensorFlow has only per_tensor, got {cfg.adam_update!r}")
    averaging = ema.optimizer_options(cfg.ema_decay)
    opt = keras.optimizers.Adam(TableSchedule(lr_table), beta_1=0.9, beta_2=0.999, epsilon=1e-8, **averaging)
    if cfg.precision == "float16":
        opt = keras.optimizers.LossScaleOptimizer(
            opt, initial_scale=cfg.loss_scale_init, dynamic_growth_steps=cfg.loss_scale_period
        )
    return opt


def replica_gradients(model: keras.Model, optimizer, batch: dict, cfg: Config, replicas: int):
    """One replica's loss and the gradients of its loss / replicas (scaled by the fp16 loss scale),
    so the summed gradients are those of the global-batch mean. With ``grad_allreduce_dtype:
    bfloat16`` the gradients are summed over replicas in bfloat16 (PyTorch DDP's
    ``bf16_compress_hook``); Keras' Adam casts them back to float32. A ``device`` loader's batch is
    cut into crops here (:func:`tf_impl.data.crops`)."""
    batch = data_mod.crops(batch, cfg)
    with tf.GradientTape() as tape:
        loss = loss_fn(model(batch["inputs"], training=True), batch, cfg)
        scaled = optimizer.scale_loss(loss / replicas)
    grads = tape.gradient(scaled, model.trainable_variables)
    if cfg.grad_allreduce_dtype == "bfloat16":  # Keras sums the replicas' gradients in this dtype
        grads = [tf.cast(g, tf.bfloat16) for g in grads]
    return loss, grads


def apply_gradients(model: keras.Model, optimizer, loss: tf.Tensor, grads: list) -> dict:
    """Sum the replicas' gradients and update (with fp16 a non-finite gradient skips the update)."""
    optimizer.apply(grads, model.trainable_variables)
    metrics = {"loss": loss}
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        metrics["loss_scale"] = tf.identity(optimizer.dynamic_scale)
    return metrics


def train_step(model: keras.Model, optimizer, batch: dict, cfg: Config, replicas: int) -> dict:
    """One replica's part of an optimizer step: :func:`replica_gradients`, then
    :func:`apply_gradients`."""
    loss, grads = replica_gradients(model, optimizer, batch, cfg, replicas)
    return apply_gradients(model, optimizer, loss, grads)


def eval_step(model: keras.Model, batch: dict, cfg: Config) -> dict:
    """Masked loss sum and sample count of one validation batch (summed over batches by :func:`evaluate`)."""
    batch = data_mod.crops(batch, cfg)
    n = tf.reduce_sum(batch["mask"])
    return {"loss_sum": loss_fn(model(batch["inputs"], training=False), batch, cfg) * n, "count": n}


def step_functions(cfg: Config, strategy, model, optimizer, jit: bool | None = None):
    """The per-replica ``tf.function``s of :func:`train_step` and :func:`eval_step`, XLA-compiled when
    ``jit`` (default: ``cfg.enable_jit``, except over several logical CPU devices, where XLA cannot
    reach another replica's variables and the replicas run without it)."""
    replicas = distribute.num_replicas(strategy)
    if jit is None:
        jit = cfg.enable_jit and (replicas == 1 or bool(tf.config.list_logical_devices("GPU")))
        if cfg.enable_jit and not jit:
            log.info("XLA off: %d replicas on CPU devices", replicas)
    evaluate = tf.function(lambda b: eval_step(model, b, cfg), jit_compile=jit)
    if jit and replicas > 1:
        # The gradient sum is a cross-replica merge, which an XLA function nested in strategy.run
        # cannot hold: XLA compiles each replica's forward and backward, the update runs outside it.
        grads = tf.function(lambda b: replica_gradients(model, optimizer, b, cfg, replicas), jit_compile=True)
        return (lambda b: apply_gradients(model, optimizer, *grads(b))), evaluate
    train = tf.function(lambda b: train_step(model, optimizer, b, cfg, replicas), jit_compile=jit)
    return train, evaluate


def compile_steps(cfg: Config, strategy, state: TrainState, spec: dict, eval_spec: dict | None = None):
    """Build the distributed, XLA-compiled step functions of ``state`` (its model and optimizer) and
    compile them by running each once on a batch of zeros of ``spec`` (the train step) and
    ``eval_spec`` (the eval step; default ``spec``) (``data.input_spec``), then restore every variable
    from a copy kept on its device (a copy through the host would cost the start a round trip of the
    whole state, seconds for a state of a few GB), so training starts from the same state as with JAX's
    ahead-of-time compilation; return ``(train_fn, eval_fn, seconds)``, seconds being the train step's
    trace + compile (+ one run) time."""
    model, optimizer = state.model, state.optimizer
    replica_train, replica_eval = step_functions(cfg, strategy, model, optimizer)

    @tf.function
    def train_fn(batch):
        out = strategy.run(replica_train, args=(batch,))
        return {k: strategy.reduce("MEAN", v, axis=None) for k, v in out.items()}

    @tf.function
    def eval_fn(batch):
        out = strategy.run(replica_eval, args=(batch,))
        return {k: strategy.reduce("SUM", v, axis=None) for k, v in out.items()}

    if not optimizer.built:
        with strategy.scope():
            optimizer.build(model.trainable_variables)
    zeros = lambda s: distribute.per_replica(strategy, lambda: {k: tf.zeros(v.shape, v.dtype) for k, v in s.items()})
    batch = zeros(spec)
    variables = list(model.variables) + list(optimizer.variables)
    saved = [tf.identity(v) for v in variables]  # on the variable's device: no round trip through the host
    t0 = time.perf_counter()
    with logs.native_lines_filtered():  # a hit of TF's persistent XLA cache logs false errors
        train_fn.get_concrete_function(batch)
        t_trace = time.perf_counter() - t0
        np.asarray(train_fn(batch)["loss"])
        t_train = time.perf_counter() - t0
        np.asarray(eval_fn(zeros(eval_spec or spec))["count"])
    log.info(logs.compile_line(t_train, t_trace, time.perf_counter() - t0 - t_train))
    for v, value in zip(variables, saved):
        v.assign(value)
    return train_fn, eval_fn, t_train
