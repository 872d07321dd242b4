"""The train and eval steps of JAX: what XLA compiles, the counterpart of :mod:`tf_impl.step`.

The train state and what changes it: Adam on the shared LR table, fp16's dynamic loss scale, the
weight average, the train step (the loss, its gradients, the update) and the eval step, compiled once
ahead of the first epoch (:func:`compile_steps`). The loop that runs them is :mod:`jax_impl.train`.

JAX: ``train_step(state, batch) -> (state, metrics)`` is a pure function with the state's buffers
donated; a batch sharded over the mesh makes XLA insert the gradient all-reduce.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training.dynamic_scale import DynamicScale

from shared_data.core.config import Config
from shared_data.runtime import logs

from jax_impl import data as data_mod
from jax_impl import distribute, ema
from jax_impl.loss import loss_fn

log = logging.getLogger("dlas.jax")


class TrainState(struct.PyTreeNode):
    """Everything a step changes: the step count, the float32 parameters, Adam's state, fp16's loss
    scale (or None) and the weight average of ``ema_decay`` (or None).

    JAX: an immutable tree of arrays; the step returns a new one."""

    step: jax.Array
    params: Any
    opt_state: Any
    dynamic_scale: DynamicScale | None
    ema_params: Any = None


def make_optimizer(cfg: Config, lr_table: np.ndarray) -> optax.GradientTransformation:
    """Adam (PyTorch defaults: betas 0.9/0.999, eps 1e-8) with the shared LR table indexed by the
    optimizer's step count, clamped to the last entry. ``adam_update: flat`` wraps it in
    ``optax.flatten``: gradients, moments and updates are one vector, so the update is one elementwise
    pass over all parameters (the same arithmetic; the moments are then stored as one vector)."""
    table = jnp.asarray(lr_table, jnp.float32)
    tx = optax.adam(lambda count: table[jnp.minimum(count, table.shape[0] - 1)], b1=0.9, b2=0.999, eps=1e-8)
    return optax.flatten(tx) if cfg.adam_update == "flat" else tx


def create_train_state(cfg: Config, params: dict, tx: optax.GradientTransformation) -> TrainState:
    """Fresh state around float32 ``params``; a dynamic loss scale only for float16 compute.

    The scale doubles on the ``loss_scale_period``-th consecutive finite step, as Keras'
    ``LossScaleOptimizer(dynamic_growth_steps=...)`` does (Flax grows after ``growth_interval``
    finite steps, on the next one, hence the - 1), and halves on a non-finite one.
    """
    dyn = None
    if cfg.precision == "float16":
        dyn = DynamicScale(
            growth_interval=cfg.loss_scale_period - 1, scale=jnp.float32(cfg.loss_scale_init), fin_steps=jnp.int32(0)
        )
    average = ema.initial(params, cfg.ema_decay)
    return TrainState(jnp.int32(0), params, tx.init(params), dyn, average)


def train_step(state: TrainState, batch: dict, *, model, tx, cfg: Config) -> tuple[TrainState, dict]:
    """One optimizer step on ``batch``; with fp16 a non-finite gradient skips the update.

    With ``grad_allreduce_dtype: bfloat16`` the loss is differentiated with respect to a bfloat16
    copy of the parameters, so each gradient is born in bfloat16 and the all-reduce that XLA's SPMD
    partitioner inserts for a batch-sharded step sums bfloat16 (half the bytes; the counterpart of
    PyTorch DDP's ``bf16_compress_hook``); the gradients are then cast back to float32 for Adam.
    XLA:GPU already sums the bf16 weight gradients under bf16 compute with the default ``float32``;
    the key makes it explicit and independent of XLA's choice (XLA:CPU widens bf16 all-reduces).
    """

    batch = data_mod.crops(batch, cfg)  # a device loader's crops, cut inside this step

    def compute_loss(params):
        return loss_fn(model.apply({"params": params}, batch["inputs"]), batch, cfg)

    params = state.params
    if cfg.grad_allreduce_dtype == "bfloat16":
        params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    if state.dynamic_scale is not None:
        dyn, finite, loss, grads = state.dynamic_scale.value_and_grad(compute_loss)(params)
    else:
        dyn, finite = None, jnp.bool_(True)
        loss, grads = jax.value_and_grad(compute_loss)(params)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    average = None if state.ema_params is None else ema.update(state.ema_params, params, state.step, cfg.ema_decay)
    if dyn is not None:
        keep = functools.partial(jnp.where, finite)
        params, opt_state, average = jax.tree.map(
            keep, (params, opt_state, average), (state.params, state.opt_state, state.ema_params)
        )
    metrics = {"loss": loss, "finite": finite}
    if dyn is not None:
        metrics["loss_scale"] = dyn.scale
    new = dict(step=state.step + 1, params=params, opt_state=opt_state, dynamic_scale=dyn, ema_params=average)
    return state.replace(**new), metrics


def eval_step(params: dict, batch: dict, *, model, cfg: Config) -> dict:
    """Masked loss sum and sample count of one validation batch (summed over batches by :func:`evaluate`)."""
    batch = data_mod.crops(batch, cfg)
    pred = model.apply({"params": params}, batch["inputs"])
    n = jnp.sum(batch["mask"])
    return {"loss_sum": loss_fn(pred, batch, cfg) * n, "count": n}


def compile_steps(cfg: Config, model, tx, state: TrainState, batch: dict, eval_batch: dict | None = None):
    """Jit ``train_step`` (state donated) and ``eval_step`` and compile both ahead of time for the
    abstract ``batch`` and ``eval_batch`` (default ``batch``) (``data.input_spec``); return
    ``(train_fn, eval_fn, seconds)``, seconds being the train step's compile time (logged with the
    eval step's)."""
    t0 = time.perf_counter()
    train_fn = jax.jit(functools.partial(train_step, model=model, tx=tx, cfg=cfg), donate_argnums=0)
    eval_fn = jax.jit(functools.partial(eval_step, model=model, cfg=cfg))
    lowered = train_fn.lower(distribute.abstract(state), batch)
    t_trace = time.perf_counter() - t0
    train_c = lowered.compile()
    t_train = time.perf_counter() - t0
    with ema.averaged(state) as weights:  # what the run evaluates
        eval_c = eval_fn.lower(distribute.abstract(weights), eval_batch or batch).compile()
    log.info(logs.compile_line(t_train, t_trace, time.perf_counter() - t0 - t_train))
    return train_c, eval_c, t_train
