"""Train the U-Net with JAX: ``python -m jax_impl.train --config cpu_default [overrides]``.

``train_step(state, batch) -> (state, metrics)`` is a pure function, compiled once (ahead of time,
so compile time is measured and kept out of the epoch timings) with the state buffers donated.
The loop around it reads like the tutorial's ``train.py``: per epoch, train over ``Nsamples``
crops, validate on ``Nsamples_val``, log, write TensorBoard scalars and a checkpoint.
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training.dynamic_scale import DynamicScale

from jax_impl import data as data_mod
from jax_impl import distribute
from jax_impl import model as model_mod
from shared_data import config as config_mod
from shared_data import runlog, schedule, unet_spec
from shared_data.config import Config
from shared_data.errors import UserError, run_cli
from shared_data.nvtx import CaptureWindow, nvtx_range

log = logging.getLogger("dlas.jax")
FRAMEWORK = "jax"


class TrainState(struct.PyTreeNode):
    """Everything a step changes: step count, float32 params, Adam state, fp16 loss scale (or None)."""

    step: jax.Array
    params: Any
    opt_state: Any
    dynamic_scale: Optional[DynamicScale]


def configure_xla(cfg: Config) -> dict:
    """The one place that sets JAX/XLA options; returns what was set (logged by the caller).

    The persistent compilation cache makes a second run of the same config skip compilation.
    """
    settings = {}
    if cfg.xla_cache_dir:
        cache = str(cfg.resolve_path(cfg.xla_cache_dir))
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        settings["jax_compilation_cache_dir"] = cache
    settings["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    return settings


def make_optimizer(lr_table: np.ndarray) -> optax.GradientTransformation:
    """Adam (PyTorch defaults: betas 0.9/0.999, eps 1e-8) with the shared LR table indexed by the
    optimizer's step count, clamped to the last entry."""
    table = jnp.asarray(lr_table, jnp.float32)
    return optax.adam(lambda count: table[jnp.minimum(count, table.shape[0] - 1)], b1=0.9, b2=0.999, eps=1e-8)


def create_train_state(cfg: Config, params: dict, tx: optax.GradientTransformation) -> TrainState:
    """Fresh state around float32 ``params``; a dynamic loss scale only for float16 compute.

    The scale doubles on the ``loss_scale_period``-th consecutive finite step, as Keras'
    ``LossScaleOptimizer(dynamic_growth_steps=...)`` does (Flax grows after ``growth_interval``
    finite steps, on the next one, hence the - 1), and halves on a non-finite one.
    """
    dyn = None
    if cfg.precision == "float16":
        dyn = DynamicScale(growth_interval=cfg.loss_scale_period - 1, scale=jnp.float32(cfg.loss_scale_init),
                           fin_steps=jnp.int32(0))
    return TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params), dynamic_scale=dyn)


def loss_fn(pred: jax.Array, batch: dict, cfg: Config) -> jax.Array:
    """Masked mean over samples of L1(pred, target) + lambda_rho x L1(exp(s pred_rho), exp(s target_rho)).

    ``pred``/targets (B, s, s, s, N_out); ``mask`` (B,). The rho term compares the density channel
    in physical space, rho = exp(density_scale x) (the tutorial's ``lambda_rho``). Float32 result.
    """
    y = batch["targets"].astype(jnp.float32)
    pred = pred.astype(jnp.float32)
    per_sample = jnp.mean(jnp.abs(pred - y), axis=(1, 2, 3, 4))
    if cfg.lambda_rho:
        d, s = cfg.density_channel, cfg.density_scale
        rho = jnp.mean(jnp.abs(jnp.exp(s * pred[..., d]) - jnp.exp(s * y[..., d])), axis=(1, 2, 3))
        per_sample = per_sample + cfg.lambda_rho * rho
    mask = batch["mask"]
    return jnp.sum(per_sample * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def train_step(state: TrainState, batch: dict, *, model, tx, cfg: Config,
               sync_grads: Optional[Callable] = None) -> tuple[TrainState, dict]:
    """One optimizer step on ``batch``; with fp16 a non-finite gradient skips the update.

    With ``grad_allreduce_dtype: bfloat16`` the loss is differentiated with respect to a bfloat16
    copy of the parameters, so each gradient is born in bfloat16 and the all-reduce that XLA's SPMD
    partitioner inserts for a batch-sharded step sums bfloat16 (half the bytes; the counterpart
    of PyTorch DDP's ``bf16_compress_hook``); the gradients are then cast back to float32 for Adam.
    On GPUs XLA already places that all-reduce on the bf16 weight gradients with the default
    ``float32`` too (same compiled schedule, ``scripts/gpu/allreduce_schedule.py``); the key makes
    it explicit and independent of XLA's choice. (XLA:CPU widens bf16 all-reduces to float32.)

    ``sync_grads`` (optional) maps ``(loss, grads)`` to their replica means when the step runs per
    device inside ``shard_map(..., check_vma=False)`` (an explicit ``lax.pmean``; with ``check_vma``
    on, JAX itself sums the gradients of replicated parameters) instead of on the sharded batch;
    float32 and bfloat16 compute only (ValueError with float16, whose finite check is per replica).
    """
    if sync_grads is not None and state.dynamic_scale is not None:
        raise ValueError("train_step: sync_grads is for float32/bfloat16 compute, not float16's dynamic loss scale")
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
    if sync_grads is not None:
        loss, grads = sync_grads((loss, grads))
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if dyn is not None:
        keep = functools.partial(jnp.where, finite)
        params = jax.tree.map(keep, params, state.params)
        opt_state = jax.tree.map(keep, opt_state, state.opt_state)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "finite": finite}
    if dyn is not None:
        metrics["loss_scale"] = dyn.scale
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, dynamic_scale=dyn), metrics


def eval_step(params: dict, batch: dict, *, model, cfg: Config) -> dict:
    """Masked loss sum and sample count of one validation batch (summed on the host over batches)."""
    pred = model.apply({"params": params}, batch["inputs"])
    n = jnp.sum(batch["mask"])
    return {"loss_sum": loss_fn(pred, batch, cfg) * n, "count": n}


def compile_steps(cfg: Config, model, tx, state: TrainState, batch: dict, compiler_options: Optional[dict] = None,
                  wrap_step: Optional[Callable] = None):
    """Jit ``train_step`` (state donated) and ``eval_step`` and compile both ahead of time for the
    abstract ``batch`` (``data.batch_spec``); return ``(train_fn, eval_fn, seconds)`` where seconds
    is the train step's compile time (logged with the eval step's). ``compiler_options`` go to the
    train step's ``Lowered.compile`` (e.g. ``{"fdo_profile": bytes}``, a PGLE profile).
    ``wrap_step`` (optional) maps the step function ``(state, batch) -> (state, metrics)`` to
    another with the same signature before it is jitted (the GPU diagnostics' ``shard_map`` forms)."""
    t0 = time.perf_counter()
    step = functools.partial(train_step, model=model, tx=tx, cfg=cfg)
    train_fn = jax.jit(wrap_step(step) if wrap_step else step, donate_argnums=0)
    eval_fn = jax.jit(functools.partial(eval_step, model=model, cfg=cfg))
    spec = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree)  # noqa: E731
    train_c = train_fn.lower(spec(state), batch).compile(compiler_options)
    t_train = time.perf_counter() - t0
    eval_c = eval_fn.lower(spec(state.params), batch).compile()
    log.info("compile: train step %.1f s, eval step %.1f s", t_train, time.perf_counter() - t0 - t_train)
    if jax.config.jax_enable_pgle:
        # auto-PGLE (JAX's GPU performance tips; JAX_ENABLE_PGLE=yes): only jit's dispatch path
        # profiles the first jax_pgle_profiling_runs calls and recompiles with the measured op costs
        # for XLA's latency-hiding scheduler, so the jitted functions are returned, not the AOT ones
        log.info("auto-PGLE: recompiling after %d profiled steps", jax.config.jax_pgle_profiling_runs)
        return train_fn, eval_fn, t_train
    return train_c, eval_c, t_train


class Checkpoints:
    """Orbax checkpoints of the train state, one per epoch (``step`` = epochs done), written atomically."""

    def __init__(self, directory: Path, keep: int):
        import orbax.checkpoint as ocp
        self._ocp = ocp
        self.directory = directory
        self.manager = ocp.CheckpointManager(directory.absolute(), options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def latest_epoch(self) -> Optional[int]:
        return self.manager.latest_step()

    def save(self, epoch: int, state: TrainState) -> None:
        self.manager.save(epoch, args=self._ocp.args.StandardSave(state))
        self.manager.wait_until_finished()

    def restore(self, epoch: int, like: TrainState) -> TrainState:
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), like)
        try:
            return self.manager.restore(epoch, args=self._ocp.args.StandardRestore(abstract))
        except (ValueError, KeyError) as err:
            self.manager.close()
            detail = str(err).split(". ")[0]
            raise UserError(f"checkpoint {self.directory}/{epoch} does not match this config ({detail}); "
                            f"use another --workdir or --overwrite") from None


class ScalarWriter:
    """TensorBoard scalars via ``tensorboard.summary.Writer`` (needs neither TF nor tensorboardX);
    a warning and no-op when ``tensorboard`` is missing or ``cfg.tensorboard`` is off."""

    def __init__(self, logdir: Path, enabled: bool):
        self._writer = None
        if not enabled:
            return
        try:
            from tensorboard.summary import Writer
        except ImportError:
            log.warning("tensorboard is not installed: no TensorBoard scalars (pip install tensorboard)")
            return
        # tensorboard does its file I/O through TensorFlow when TF is installed, unless its "notf"
        # marker module exists when that choice is first made (it is cached). JAX runs keep TF out
        # of the process; the marker is removed again so a later tf.summary user is unaffected.
        marker = "tensorboard.compat.notf"
        added = "tensorflow" not in sys.modules and marker not in sys.modules
        if added:
            sys.modules[marker] = types.ModuleType(marker)
        try:
            self._writer = Writer(str(logdir))
        finally:
            if added:
                del sys.modules[marker]

    def scalars(self, step: int, values: dict) -> None:
        if self._writer is not None:
            for tag, value in values.items():
                self._writer.add_scalar(tag, float(value), step)
            self._writer.flush()


def versions() -> dict:
    import flax
    return {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
            "devices": [str(d) for d in jax.devices()], "backend": jax.default_backend()}


def peak_memory_bytes() -> Optional[int]:
    """Peak bytes in use on the first local device, if the backend reports it (GPU)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def train_and_evaluate(cfg: Config, workdir: Path, *, resume: bool = False, overwrite: bool = False,
                       num_devices: Optional[int] = None, init_weights: Optional[str] = None,
                       stop_after_epoch: Optional[int] = None) -> dict:
    """Train ``cfg`` in ``workdir`` (checkpoints, ``metrics.jsonl``, TensorBoard); return the last
    epoch's metrics (``train_loss``, ``val_loss``, ``samples_per_sec``, ``compile_sec``, ``epoch``)
    and the final ``state``. ``stop_after_epoch`` ends this invocation early, as a job's time limit
    would; the schedule is still that of ``num_epochs``, and ``resume=True`` continues the run."""
    log.info("JAX %s on %s; config %r from %s", jax.__version__, jax.default_backend(), cfg.name, cfg.source)
    settings = configure_xla(cfg)
    mesh = distribute.make_mesh(num_devices)
    global_bs, local_bs = runlog.log_setup(cfg, settings, distribute.num_replicas(mesh))

    runlog.check_data(cfg)  # bad data must fail before --overwrite clears anything
    workdir.mkdir(parents=True, exist_ok=True)
    runlog.clear_checkpoints(workdir, overwrite)
    ckpt = Checkpoints(workdir / "checkpoints", cfg.keep_checkpoints)
    start_epoch = runlog.start_epoch(ckpt.latest_epoch(), resume, workdir)
    train_in = data_mod.make_input(cfg, "train", mesh, start_epoch)
    val_in = data_mod.make_input(cfg, "val", mesh)
    steps = train_in.steps
    lr_tab = schedule.lr_table(cfg, global_bs, steps * cfg.num_epochs)
    model, tx = model_mod.build_model(cfg), make_optimizer(lr_tab)
    weights = unet_spec.load_weights(init_weights, cfg) if init_weights else unet_spec.init_weights(cfg, cfg.seed)
    state = jax.device_put(create_train_state(cfg, model_mod.params_from_canonical(weights), tx), distribute.replicated(mesh))
    log.info("model: %.2f M parameters, %.2f GFLOP per sample per training step", unet_spec.num_params(cfg) / 1e6,
             unet_spec.train_flops_per_sample(cfg) / 1e9)

    if start_epoch:
        state = ckpt.restore(start_epoch, state)
        log.info("resumed from %s at epoch %d (step %d)", ckpt.directory, start_epoch, int(state.step))
    main_process = distribute.is_main_process()
    metrics_log = runlog.MetricsLog(workdir, cfg, FRAMEWORK, versions(), enabled=main_process)
    metrics_log.truncate_after(start_epoch)
    writer = ScalarWriter(workdir / "tb", cfg.tensorboard and main_process)

    train_fn, eval_fn, compile_s = compile_steps(cfg, model, tx, state, data_mod.batch_spec(cfg, mesh))

    window = CaptureWindow(cfg.profile_steps, on_start=[lambda: jax.profiler.start_trace(str(workdir / "profile"))],
                           on_stop=[jax.profiler.stop_trace], use_cuda=jax.default_backend() == "gpu")
    last: dict = {"epoch": start_epoch, "compile_sec": compile_s}
    end_epoch = cfg.num_epochs if stop_after_epoch is None else min(stop_after_epoch, cfg.num_epochs)
    for epoch in range(start_epoch, end_epoch):
        t0 = time.perf_counter()
        losses = []
        batches = train_in.epoch(epoch)
        for i in runlog.progress(range(steps), steps, f"epoch {epoch + 1}", cfg.progress_bar):
            window.before_step(epoch * steps + i)
            with nvtx_range("data wait", "yellow"):
                batch = next(batches)
            with nvtx_range("step dispatch", "blue"):
                state, m = train_fn(state, batch)
            losses.append(m["loss"])
        train_losses = np.asarray(jax.device_get(jnp.stack(losses)))
        seconds = time.perf_counter() - t0
        if not np.isfinite(train_losses).all() and cfg.precision != "float16":
            bad = int(np.argmax(~np.isfinite(train_losses)))
            raise UserError(f"training diverged: loss is {train_losses[bad]} at step {epoch * steps + bad} "
                            f"of config {cfg.name!r}; lower start_lr or enable loss scaling")
        val_loss, val_seconds = evaluate(eval_fn, state.params, val_in)
        train_loss = float(np.mean(train_losses[np.isfinite(train_losses)]))
        samples_per_sec = steps * global_bs / seconds
        for line in runlog.epoch_lines(epoch + 1, seconds, steps * global_bs, train_loss, val_loss, val_seconds):
            log.info(line)
        lr = float(lr_tab[min(int(state.step), len(lr_tab)) - 1])
        last = dict(epoch=epoch + 1, step=int(state.step), train_loss=train_loss, val_loss=val_loss, lr=lr,
                    samples_per_sec=samples_per_sec, epoch_sec=seconds, val_sec=val_seconds, compile_sec=compile_s)
        if m.get("loss_scale") is not None:
            last["loss_scale"] = float(m["loss_scale"])
        metrics_log.append(last)
        writer.scalars(epoch + 1, {"train/loss": train_loss, "val/loss": val_loss, "learning_rate": lr,
                                   "iterations_per_sec": steps / seconds})
        ckpt.save(epoch + 1, state)
    window.close()
    peak = peak_memory_bytes()
    if peak:
        log.info("peak device memory: %.2f GiB", peak / 2 ** 30)
        last["peak_memory_bytes"] = peak
    last["state"] = state
    return last


def evaluate(eval_fn, params, val_in) -> tuple[float, float]:
    """Mean validation loss over ``Nsamples_val`` crops, and the seconds it took."""
    t0 = time.perf_counter()
    sums = [eval_fn(params, batch) for batch in val_in.epoch(0)]
    totals = jax.device_get(jax.tree.map(lambda *xs: jnp.sum(jnp.stack(xs)), *sums))
    return float(totals["loss_sum"] / max(float(totals["count"]), 1.0)), time.perf_counter() - t0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jax_impl.train", description="Train the cosmology U-Net with JAX.")
    config_mod.add_config_args(parser)
    runlog.add_run_args(parser, FRAMEWORK)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runlog.setup_logging()
    cfg = config_mod.config_from_args(args)
    workdir = runlog.workdir_for(cfg, FRAMEWORK, args.workdir)
    runlog.check_run_args(args, workdir, FRAMEWORK)
    distribute.initialize()
    result = train_and_evaluate(cfg, workdir, resume=args.resume,
                                overwrite=args.overwrite, num_devices=args.num_devices, init_weights=args.init_weights,
                                stop_after_epoch=args.stop_after_epoch)
    if args.save_weights and distribute.is_main_process():
        unet_spec.save_weights(args.save_weights, model_mod.params_to_canonical(jax.device_get(result["state"].params)))
        log.info("wrote %s", args.save_weights)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
