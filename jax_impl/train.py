"""Train the U-Net with JAX: ``python -m jax_impl.train --config cpu_default [overrides]``.

JAX's side of the kit's training loop. :func:`train_and_evaluate` is the whole loop, the same in both
frameworks and in the same order: open the run, build the state, resume, the input pipelines,
compile the steps, then per epoch train (:func:`train_epoch`) over ``Nsamples`` crops, validate on
``Nsamples_val``, checkpoint and predict for the quality check (scored
while the next epoch trains). What is not framework code (run folder,
resume rule, log lines, metrics, TensorBoard, the command line) is :mod:`shared_data.runtime`.

JAX: the state is a value the step returns anew (``state, metrics = train_fn(state, batch)``); the
weight average is a parameter tree of the state; a device queue is drained with
``jax.block_until_ready``. The steps themselves (what XLA compiles) are :mod:`jax_impl.step`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from shared_data.core.config import Config
from shared_data.core.errors import run_cli
from shared_data.inference import quality_check
from shared_data.model import unet_spec
from shared_data.runtime import agreement, cli, nvtx, preemption, saves, signals
from shared_data.runtime import resume as resume_mod
from shared_data.runtime.epoch_report import EpochReport
from shared_data.runtime.nvtx import nvtx_range
from shared_data.runtime.run_folder import RunFolder
from shared_data.runtime.steps import EpochTiming, epoch_steps

from jax_impl import cluster, distribute, ema, predict
from jax_impl import data as data_mod
from jax_impl import model as model_mod
from jax_impl.checkpoints import Checkpoints
from jax_impl.step import TrainState, compile_steps, create_train_state, make_optimizer

log = logging.getLogger("dlas.jax")
FRAMEWORK = "jax"


def evaluate(eval_fn, state, val_in) -> float:
    """Mean validation loss of the weights the run evaluates (the average with ``ema_decay``,
    :func:`jax_impl.ema.averaged`) over ``Nsamples_val`` crops: the batches' loss sums and sample
    counts, summed on the host. A stop signal that arrives meanwhile ends the pass between batches
    (every process agrees) and the loss is NaN, recorded as not measured (``val_cut_short_by``): the
    epoch's checkpoint follows, then the stop."""
    sums = []
    with ema.averaged(state) as weights:
        for batch in val_in.epoch(0):
            flag = distribute.any_process(signals.pending() is not None)
            if signals.cut_short(preemption.waiting_signal(flag), "validation"):
                return float("nan")
            sums.append(eval_fn(weights, batch))
    totals = jax.device_get(jax.tree.map(lambda *xs: jnp.sum(jnp.stack(xs)), *sums))
    return float(totals["loss_sum"] / max(float(totals["count"]), 1.0))


def train_epoch(state, train_fn, batches, epoch: int, start, folder: RunFolder, report, mid_epoch, window, monitor):
    """The steps of ``epoch`` (from ``start``'s data cursor in a run resumed mid-epoch); returns the
    state, the epoch's losses on the host, the last step's metrics and the epoch's clock. A stop signal
    saves the state at the next step boundary (``mid_epoch()``'s checkpoints) and stops the run; a
    quality verdict that met the target (``monitor``'s, scored on a host thread) ends the steps."""
    losses, timing = start.losses_before(epoch), EpochTiming(folder.steps_per_epoch, start.first_step(epoch))
    metrics, n = {}, folder.steps_per_epoch
    with signals.stoppable():  # SIGTERM / SIGUSR1 ask for a stop at the next step boundary
        for i in epoch_steps(folder, epoch, timing.first):  # the progress bar; the run's place for a signal's line
            # --- the stop checks: a signal to any process stops every process here, after a save; a quality
            #     verdict that met the target ends the run here, with the epoch it judged ---
            if preemption.stop_agreed(distribute.any_process(preemption.stop_requested())):
                with mid_epoch() as mid, preemption.stopping(folder, report, epoch, i, jax.device_get(losses)) as step:
                    mid.save(step, state)
                    mid.wait()  # a stop's save is written before the run stops
            if monitor.target_met():
                break
            window.before_step(epoch * n + i)  # the profiler's capture window (profile_steps)
            with nvtx.step_range(folder.cfg.enable_manual_profiling, epoch * n + i):
                # --- input: the host's wait for the batch (a sampled step drains the device queue first) ---
                timed = timing.sampled(i)
                if timed:
                    jax.block_until_ready(state)
                # (signal_first: a loader whose worker the same group signal killed reports that signal)
                with nvtx_range("data wait", "yellow"), timing.input_wait(timed), signals.signal_first():
                    batch = next(batches)
                    if timed:
                        jax.block_until_ready(batch)
                # --- the step: compiled (XLA where cfg and the devices allow), dispatched asynchronously ---
                with nvtx_range("step dispatch", "blue"):
                    state, metrics = train_fn(state, batch)
            losses.append(metrics["loss"])
    # waits for the epoch's steps (none where a met target ended the epoch before its first step)
    losses = jax.device_get(jnp.stack(losses)) if losses else np.zeros(0, np.float32)
    timing.stop()
    return state, losses, metrics, timing


def open_run(cfg: Config, workdir: Path, num_devices: int | None, overwrite: bool) -> tuple[Mesh, RunFolder]:
    """XLA's settings (before the first device query), the device mesh, the processes' agreement on the
    experiment (:mod:`shared_data.runtime.agreement`), then the run folder."""
    settings = distribute.configure_xla(cfg)
    mesh = distribute.make_mesh(num_devices)
    replicas, rank = distribute.num_replicas(mesh), distribute.process_index()
    names, texts, row = agreement.fingerprint(cfg)  # every process trains one experiment, or none
    agreement.check(names, texts, distribute.process_rows(row), rank)
    banner = distribute.banner()
    return mesh, RunFolder(cfg, workdir, FRAMEWORK, banner, settings, replicas, process_index=rank, overwrite=overwrite)


def initial_state(cfg: Config, lr_table: np.ndarray, init_weights: str | None, mesh: Mesh):
    """The model (its precision policy: ``cfg.precision``), Adam on ``lr_table`` and the train state
    from ``init_weights`` (or the contract's init), replicated over ``mesh``: ``(model, tx, state)``."""
    model, tx = model_mod.build_model(cfg), make_optimizer(cfg, lr_table)
    params = model_mod.params_from_canonical(unet_spec.starting_weights(cfg, init_weights))
    return model, tx, jax.device_put(create_train_state(cfg, params, tx), distribute.replicated(mesh))


def capture_window(cfg: Config, folder: RunFolder) -> nvtx.CaptureWindow:
    """The profiler's capture window (``profile_steps``, ``enable_manual_profiling``), inside which every
    NVTX range is also a trace annotation: JAX's trace into
    ``<workdir>/profile`` and, on a GPU, the CUDA profiler API (``nsys --capture-range=cudaProfilerApi``)."""
    start = functools.partial(jax.profiler.start_trace, str(folder.workdir / "profile"))
    gpu = jax.default_backend() == "gpu"
    return nvtx.capture_window(
        cfg, folder.steps_per_epoch, start, jax.profiler.stop_trace, gpu, jax.profiler.TraceAnnotation
    )


def quality_monitor(folder: RunFolder, report: EpochReport, first_epoch: int, mesh: Mesh):
    """The time-to-quality monitor (:class:`shared_data.inference.quality_check.Monitor`; off unless
    ``quality_target`` is set), its verdicts agreed on process 0's, and the forward pass it evaluates
    (compiled at the first evaluation): ``(monitor, forward)``."""
    agree = distribute.main_process_flag
    monitor = quality_check.Monitor(folder, report.metrics, distribute.device_kind(), first_epoch, agree)
    return monitor, predict.forward_fn(monitor.predict_cfg)


def write_weights(state, path: str | None) -> None:
    """Write the weights the run evaluated (the average with ``ema_decay``) to ``path`` in the
    canonical layout (:func:`shared_data.runtime.saves.save_final_weights`; process 0 alone); nothing
    where ``path`` is None or empty."""
    if not path:
        return
    with ema.averaged(state) as weights:
        weights = model_mod.params_to_canonical(jax.device_get(weights))
    saves.save_final_weights(path, weights, distribute.is_main_process())


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
    """Train ``cfg`` in ``workdir``; return the final state and the last epoch's metrics (and the time to
    quality's: :mod:`shared_data.inference.quality`). ``stop_after_epoch``: as a job's time limit."""
    mesh, folder = open_run(cfg, workdir, num_devices, overwrite)
    # --- the model and its mixed-precision policy (cfg.precision), the optimizer, the train state ---
    model, tx, state = initial_state(cfg, folder.lr_table, init_weights, mesh)
    # (closed on every exit; the position names the newest finished checkpoint where a lost process cuts a save)
    with Checkpoints(folder.workdir / "checkpoints", cfg.keep_checkpoints, state, position=folder.position) as ckpt:
        # --- resume: the newest checkpoint that restores, or a stop's mid-epoch save ---
        mid_epoch = functools.partial(Checkpoints, folder.mid_epoch_dir / "checkpoints", keep=1, state=state)
        start = resume_mod.resume(folder, ckpt, mid_epoch, resume)
        state = state if start.restored is None else start.restored
        # --- the input pipelines, then XLA: the steps compiled ahead of time ---
        train_in = data_mod.make_input(cfg, "train", mesh, start.epoch, start.step)
        val_in = data_mod.make_input(cfg, "val", mesh)
        specs = [data_mod.input_spec(inp, cfg, mesh) for inp in (train_in, val_in)]
        trains = folder.trains(start.epoch, stop_after_epoch)  # a finished run resumed compiles nothing
        train_fn, eval_fn, compile_s = compile_steps(cfg, model, tx, state, *specs) if trains else (None, None, 0.0)
        report = EpochReport(folder, compile_s)
        if report.begin(start.epoch, distribute.versions()):  # a fresh run: TensorBoard's step-0 loss
            report.step0(evaluate(eval_fn, state, val_in))
        monitor, forward = quality_monitor(folder, report, start.epoch, mesh)
        with capture_window(cfg, folder) as window, signals.deferred():  # a signal stops the run between steps
            for epoch in monitor.remaining(folder.epochs(start.epoch, stop_after_epoch)):
                # --- train: the epoch's steps ---
                state, losses, metrics, timing = train_epoch(
                    state, train_fn, train_in.epoch(epoch), epoch, start, folder, report, mid_epoch, window, monitor
                )
                if monitor.target_met(wait=True):  # the verdict on an earlier epoch, scored while this one trained
                    break  # met: this epoch's steps are dropped
                report.check_finite(epoch, losses)
                # --- validate: Nsamples_val crops of the validation volume ---
                with report.validating():
                    val_loss = evaluate(eval_fn, state, val_in)
                step = int(state.step)
                report.epoch(epoch, timing, losses, val_loss, step, metrics.get("loss_scale"))
                # --- checkpoint: written in the background while the next epoch trains ---
                with report.on_path("checkpoint"), saves.saving(folder, epoch + 1, ckpt):
                    ckpt.save(epoch + 1, state)
                # --- time to quality: predict the whole validation volume; scored while the next epoch trains ---
                if monitor.due(epoch):
                    with report.on_path("quality check"), ema.averaged(state) as weights:
                        monitor.evaluate(epoch + 1, step, forward(weights))
                report.parts(epoch, timing)  # the epoch's wall time: steps, validation, checkpoint, quality check
                if monitor.stops(epoch):  # the budget is spent
                    break
            saves.written(folder, ckpt)  # the last checkpoint complete, or its failure raised
            if monitor.judged_epoch() is not None:  # the model that met the target, not the steps after it
                state = ckpt.restore(monitor.judged_epoch())  # a new state: the one returned
        write_weights(state, save_weights)  # --save_weights: the weights the run evaluated
        return state, {**monitor.finish(), **report.finish(distribute.peak_memory_bytes())}  # the run closed last


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jax_impl.train``: the shared command line (:func:`shared_data.runtime.cli.main`)."""
    return cli.main(
        FRAMEWORK,
        train_and_evaluate,
        argv,
        initialize=cluster.initialize,
        process_index=distribute.process_index,
        lost_peer=distribute.lost_peer,
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
