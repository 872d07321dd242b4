"""Train the U-Net with TensorFlow: ``python -m tf_impl.train --config cpu_default [overrides]``.

Mirrors :mod:`jax_impl.train`: ``train_step`` and ``eval_step`` are ``tf.function``s compiled with
XLA (``jit_compile=enable_jit``), run per replica by the ``tf.distribute`` strategy;
:func:`train_and_evaluate` is the same loop in the same order, and what is not TensorFlow (run
folder, resume rule, log lines, metrics, TensorBoard, the command line) is :mod:`shared_data.runtime`.
TensorFlow's GPU path follows TF's and DALI's documentation and runs on CPU in this kit's tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from shared_data.core.config import Config
from shared_data.core.errors import UserError, run_cli
from shared_data.inference import quality
from shared_data.runtime import cli, logs
from shared_data.runtime import run as run_mod
from shared_data.runtime.nvtx import nvtx_range
from tf_impl import data as data_mod
from tf_impl import distribute, ema, predict
from tf_impl import model as model_mod
from tf_impl.checkpoints import Checkpoints
from tf_impl.loss import loss_fn

log = logging.getLogger("dlas.tf")
FRAMEWORK = "tf"


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
    ema_kw = dict(use_ema=True, ema_momentum=cfg.ema_decay) if cfg.ema_decay else {}
    opt = keras.optimizers.Adam(TableSchedule(lr_table), beta_1=0.9, beta_2=0.999, epsilon=1e-8, **ema_kw)
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
    """Masked loss sum and sample count of one replica's validation batch."""
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


def compile_steps(cfg: Config, strategy, model, optimizer, spec: dict, eval_spec: dict | None = None):
    """Build the distributed, XLA-compiled step functions and compile them by running each once on a
    batch of zeros of ``spec`` (the train step) and ``eval_spec`` (the eval step; default ``spec``)
    (``data.input_spec``), then restore every variable, so training starts from the same state as with
    JAX's ahead-of-time compilation; return ``(train_fn, eval_fn, seconds)``, seconds being the train
    step's trace + compile (+ one run) time."""
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
    saved = [v.numpy() for v in variables]
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


def evaluate(eval_fn, val_in) -> float:
    """Mean validation loss over ``Nsamples_val`` crops."""
    loss_sum, count = 0.0, 0.0
    for batch in val_in.epoch(0):
        out = eval_fn(batch)
        loss_sum += float(out["loss_sum"])
        count += float(out["count"])
    return loss_sum / max(count, 1.0)


def train_and_evaluate(
    cfg: Config,
    workdir: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    num_devices: int | None = None,
    init_weights: str | None = None,
    stop_after_epoch: int | None = None,
    save_weights: str | None = None,
) -> tuple[keras.Model, dict]:
    """Train ``cfg`` in ``workdir`` (checkpoints, ``metrics.jsonl``, TensorBoard, ``out.log``); return the
    trained ``model`` and the last epoch's metrics (``train_loss``, ``val_loss``, ``samples_per_sec``,
    ``compile_sec``, ``epoch``; ``time_to_quality_sec``, ... with ``quality_every_epochs``, which stops the
    run at the target: :mod:`shared_data.inference.quality`). ``stop_after_epoch`` ends this invocation early,
    as a job's time limit would; the schedule is still that of ``num_epochs``, and ``resume=True`` continues it."""
    settings = distribute.configure_xla(cfg)  # before the first device query reads TF_XLA_FLAGS
    strategy = distribute.make_strategy(num_devices)
    run = run_mod.Run(
        cfg,
        workdir,
        FRAMEWORK,
        distribute.banner(),
        settings,
        distribute.num_replicas(strategy),
        process_index=distribute.process_index(),
        resume=resume,
        overwrite=overwrite,
    )
    with strategy.scope():
        model, optimizer = model_mod.build_model(cfg), make_optimizer(cfg, run.lr_table)
        model_mod.params_from_canonical(model, run.initial_weights(init_weights))
        optimizer.build(model.trainable_variables)
    mid_epoch = lambda: Checkpoints(run.mid_epoch_dir / "checkpoints", 1, model, optimizer)  # a stop's save, by step
    with Checkpoints(workdir / "checkpoints", cfg.keep_checkpoints, model, optimizer) as ckpt:  # closed on every exit
        start, _ = run.resume(ckpt, mid_epoch)
        train_in = data_mod.make_input(cfg, "train", strategy, start, run.first_step)
        val_in = data_mod.make_input(cfg, "val", strategy)
        specs = [data_mod.input_spec(inp, cfg, strategy) for inp in (train_in, val_in)]
        compiled = run.trains(start, stop_after_epoch)  # a finished run resumed compiles nothing
        train_fn, eval_fn, compile_s = (
            compile_steps(cfg, strategy, model, optimizer, *specs) if compiled else (None, None, 0.0)
        )
        averaged = ema.AveragedWeights(model, optimizer, strategy)
        validation = lambda: averaged.read(lambda _: evaluate(eval_fn, val_in))
        run.begin(start, compile_s, distribute.versions(), validation)
        agree = lambda flag: distribute.main_process_flag(strategy, flag)
        monitor = quality.Monitor(run, distribute.device_kind(), start, agree)
        forward = predict.forward_fn(monitor.predict_cfg)  # compiled at the first evaluation

        sync = lambda _: distribute.sync_devices(strategy)  # the devices' queued work: Run.steps' input wait
        trace = (lambda: tf.profiler.experimental.start(str(workdir / "profile")), tf.profiler.experimental.stop)
        gpu = bool(tf.config.list_logical_devices("GPU"))
        with run.profile(*trace, use_cuda=gpu, annotate=tf.profiler.experimental.Trace):
            for epoch in monitor.remaining(run.epochs(start, stop_after_epoch)):
                losses = run.losses_before(epoch)
                agree = lambda stop: distribute.any_process(strategy, stop)
                for batch in run.steps(train_in.epoch(epoch), epoch, sync, agree):
                    with nvtx_range("step dispatch", "blue"):
                        m = train_fn(batch)
                    losses.append(m["loss"])
                if run.stopped_at:  # a stop signal: save at this step boundary and stop
                    with mid_epoch() as mid:
                        run.preempt(mid.save, lambda: [float(x) for x in losses])
                step = int(optimizer.iterations.numpy())
                run.end_epoch(epoch, tf.stack(losses).numpy(), validation, step=step, loss_scale=m.get("loss_scale"))
                with run.saving(epoch + 1):
                    ckpt.save(epoch + 1)
                if monitor.after_epoch(epoch, step, lambda: averaged.read(lambda m: forward(m.trainable_variables))):
                    break

        weights = lambda: averaged.read(model_mod.params_to_canonical)
        run_mod.save_final_weights(save_weights, weights, distribute.is_main_process())
        reached = monitor.finish()
        return model, {**run.finish(distribute.peak_memory_bytes()), **reached}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tf_impl.train``: the shared command line (:func:`shared_data.runtime.cli.main`)."""
    return cli.main(
        FRAMEWORK, train_and_evaluate, argv, initialize=distribute.initialize, process_index=distribute.process_index
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
