"""Train the U-Net with JAX: ``python -m jax_impl.train --config cpu_default [overrides]``.

``train_step(state, batch) -> (state, metrics)`` is a pure function, compiled once (ahead of time,
so compile time is measured and kept out of the epoch timings) with the state buffers donated.
:func:`train_and_evaluate` is the whole loop, in the order of :mod:`tf_impl.train`: build the state,
compile the steps, then per epoch train over ``Nsamples`` crops, validate on ``Nsamples_val`` and
checkpoint. What is not JAX (run folder, resume rule, log lines, metrics, TensorBoard, the command
line) is :mod:`shared_data.runtime`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training.dynamic_scale import DynamicScale

from jax_impl import data as data_mod
from jax_impl import distribute, ema, predict
from jax_impl import model as model_mod
from jax_impl.checkpoints import Checkpoints
from jax_impl.loss import loss_fn
from shared_data.core.config import Config
from shared_data.core.errors import run_cli
from shared_data.inference import quality
from shared_data.runtime import cli, logs
from shared_data.runtime import run as run_mod
from shared_data.runtime.nvtx import nvtx_range

log = logging.getLogger("dlas.jax")
FRAMEWORK = "jax"


class TrainState(struct.PyTreeNode):
    """Everything a step changes: step count, float32 params, Adam state, fp16 loss scale (or None),
    the weight average of ``ema_decay`` (or None)."""

    step: jax.Array
    params: Any
    opt_state: Any
    dynamic_scale: DynamicScale | None
    ema_params: Any = None


def make_optimizer(lr_table: np.ndarray, adam_update: str = "per_tensor") -> optax.GradientTransformation:
    """Adam (PyTorch defaults: betas 0.9/0.999, eps 1e-8) with the shared LR table indexed by the
    optimizer's step count, clamped to the last entry. ``adam_update: flat`` wraps it in
    ``optax.flatten``: gradients, moments and updates are one vector, so the update is one elementwise
    pass over all parameters (the same arithmetic; the moments are then stored as one vector)."""
    table = jnp.asarray(lr_table, jnp.float32)
    tx = optax.adam(lambda count: table[jnp.minimum(count, table.shape[0] - 1)], b1=0.9, b2=0.999, eps=1e-8)
    return optax.flatten(tx) if adam_update == "flat" else tx


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
    average = jax.tree.map(jnp.copy, params) if cfg.ema_decay else None
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
    """Masked loss sum and sample count of one validation batch (summed on the host over batches)."""
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
    eval_c = eval_fn.lower(distribute.abstract(ema.weights(state)), eval_batch or batch).compile()
    log.info(logs.compile_line(t_train, t_trace, time.perf_counter() - t0 - t_train))
    return train_c, eval_c, t_train


def evaluate(eval_fn, params, val_in) -> float:
    """Mean validation loss over ``Nsamples_val`` crops."""
    sums = [eval_fn(params, batch) for batch in val_in.epoch(0)]
    totals = jax.device_get(jax.tree.map(lambda *xs: jnp.sum(jnp.stack(xs)), *sums))
    return float(totals["loss_sum"] / max(float(totals["count"]), 1.0))


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
) -> tuple[TrainState, dict]:
    """Train ``cfg`` in ``workdir`` (checkpoints, ``metrics.jsonl``, TensorBoard, ``out.log``); return the
    final ``state`` and the last epoch's metrics (``train_loss``, ``val_loss``, ``samples_per_sec``,
    ``compile_sec``, ``epoch``; ``time_to_quality_sec``, ... with ``quality_every_epochs``, which stops the
    run at the target: :mod:`shared_data.inference.quality`). ``stop_after_epoch`` ends this invocation early,
    as a job's time limit would; the schedule is still that of ``num_epochs``, and ``resume=True`` continues it."""
    settings = distribute.configure_xla(cfg)  # before the first device query, as TF needs
    mesh = distribute.make_mesh(num_devices)
    run = run_mod.Run(
        cfg,
        workdir,
        FRAMEWORK,
        distribute.banner(),
        settings,
        distribute.num_replicas(mesh),
        process_index=distribute.process_index(),
        resume=resume,
        overwrite=overwrite,
    )
    model, tx = model_mod.build_model(cfg), make_optimizer(run.lr_table, cfg.adam_update)
    params = model_mod.params_from_canonical(run.initial_weights(init_weights))
    state = jax.device_put(create_train_state(cfg, params, tx), distribute.replicated(mesh))
    mid_epoch = lambda: Checkpoints(run.mid_epoch_dir / "checkpoints", 1, state)  # a stop's save, numbered by step
    with Checkpoints(workdir / "checkpoints", cfg.keep_checkpoints, state) as ckpt:  # closed on every exit
        start, restored = run.resume(ckpt, mid_epoch)
        if restored is not None:
            state = restored
        train_in = data_mod.make_input(cfg, "train", mesh, start, run.first_step)
        val_in = data_mod.make_input(cfg, "val", mesh)
        compiled = run.trains(start, stop_after_epoch)  # a finished run resumed compiles nothing
        specs = [data_mod.input_spec(inp, cfg, mesh) for inp in (train_in, val_in)]
        train_fn, eval_fn, compile_s = compile_steps(cfg, model, tx, state, *specs) if compiled else (None, None, 0.0)
        run.begin(start, compile_s, distribute.versions(), lambda: evaluate(eval_fn, ema.weights(state), val_in))
        monitor = quality.Monitor(run, distribute.device_kind(), start, distribute.main_process_flag)
        forward = predict.forward_fn(monitor.predict_cfg)  # compiled at the first evaluation

        sync = lambda batch: jax.block_until_ready((state, batch))  # the newest state: Run.steps' input wait
        trace = (lambda: jax.profiler.start_trace(str(workdir / "profile")), jax.profiler.stop_trace)
        with run.profile(*trace, use_cuda=jax.default_backend() == "gpu", annotate=jax.profiler.TraceAnnotation):
            for epoch in monitor.remaining(run.epochs(start, stop_after_epoch)):
                losses = run.losses_before(epoch)
                for batch in run.steps(train_in.epoch(epoch), epoch, sync, distribute.any_process):
                    with nvtx_range("step dispatch", "blue"):
                        state, m = train_fn(state, batch)
                    losses.append(m["loss"])
                if run.stopped_at:  # a stop signal: save at this step boundary and stop
                    with mid_epoch() as mid:
                        run.preempt(lambda step: mid.save(step, state), lambda: jax.device_get(losses))
                run.end_epoch(
                    epoch,
                    jax.device_get(jnp.stack(losses)),
                    lambda: evaluate(eval_fn, ema.weights(state), val_in),
                    step=int(state.step),
                    loss_scale=m.get("loss_scale"),
                )
                with run.saving(epoch + 1):
                    ckpt.save(epoch + 1, state)
                if monitor.after_epoch(epoch, int(state.step), lambda: lambda x: forward(ema.weights(state), x)):
                    break

        weights = lambda: model_mod.params_to_canonical(jax.device_get(ema.weights(state)))
        run_mod.save_final_weights(save_weights, weights, distribute.is_main_process())
        reached = monitor.finish()
        return state, {**run.finish(distribute.peak_memory_bytes()), **reached}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jax_impl.train``: the shared command line (:func:`shared_data.runtime.cli.main`)."""
    return cli.main(
        FRAMEWORK, train_and_evaluate, argv, initialize=distribute.initialize, process_index=distribute.process_index
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
