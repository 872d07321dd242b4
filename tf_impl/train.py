"""Train the U-Net with TensorFlow: ``python -m tf_impl.train --config cpu_default [overrides]``.

Mirrors :mod:`jax_impl.train`: ``train_step`` and ``eval_step`` are ``tf.function``s compiled with
XLA (``jit_compile=enable_jit``), run per replica by the ``tf.distribute`` strategy;
:func:`train_and_evaluate` is the same loop in the same order, and what is not TensorFlow (run
folder, resume rule, log lines, metrics, TensorBoard, the command line) is :mod:`shared_data.runtime`.
TensorFlow's GPU path follows TF's and DALI's documentation and runs on CPU in this kit's tests.
"""

from __future__ import annotations

import dataclasses
import functools
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
from shared_data.model import unet_spec
from shared_data.runtime import cli, logs, nvtx, preemption, saves, signals
from shared_data.runtime import resume as resume_mod
from shared_data.runtime.epoch_report import EpochReport
from shared_data.runtime.nvtx import nvtx_range
from shared_data.runtime.run_folder import RunFolder
from shared_data.runtime.steps import EpochTiming, epoch_steps
from tf_impl import data as data_mod
from tf_impl import distribute, ema, predict
from tf_impl import model as model_mod
from tf_impl.checkpoints import Checkpoints
from tf_impl.loss import loss_fn

log = logging.getLogger("dlas.tf")
FRAMEWORK = "tf"


@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a step changes, held by TensorFlow in variables the step updates in place: the model's
    weights and the optimizer's (Adam's moments, its step count, fp16's loss scale, the weight average
    of ``ema_decay``), and the variables that keep the trained weights while the average is read
    (:func:`tf_impl.ema.averaged`). The counterpart of :class:`jax_impl.train.TrainState`."""

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


def compile_steps(cfg: Config, strategy, state: TrainState, spec: dict, eval_spec: dict | None = None):
    """Build the distributed, XLA-compiled step functions of ``state`` (its model and optimizer) and
    compile them by running each once on a
    batch of zeros of ``spec`` (the train step) and ``eval_spec`` (the eval step; default ``spec``)
    (``data.input_spec``), then restore every variable, so training starts from the same state as with
    JAX's ahead-of-time compilation; return ``(train_fn, eval_fn, seconds)``, seconds being the train
    step's trace + compile (+ one run) time."""
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


def train_epoch(strategy, train_fn, batches, epoch: int, start, folder: RunFolder, report, mid_epoch, window):
    """The steps of ``epoch`` (from ``start``'s data cursor in a run resumed mid-epoch); returns the
    epoch's losses on the host, the last step's metrics and the epoch's clock. A stop signal saves the
    model and optimizer at the next step boundary (``mid_epoch()``'s checkpoints) and stops the run."""
    losses, timing = start.losses_before(epoch), EpochTiming(folder.steps_per_epoch, start.first_step(epoch))
    metrics, n = {}, folder.steps_per_epoch
    with signals.stoppable():  # SIGTERM / SIGUSR1 ask for a stop at the next step boundary
        for i in epoch_steps(folder, epoch, timing.first):  # the progress bar; the run's place for a signal's line
            # --- the stop check: a signal to any process stops every process here, after a save ---
            if preemption.stop_agreed(distribute.any_process(strategy, preemption.stop_requested())):
                with (
                    mid_epoch() as mid,
                    preemption.stopping(folder, report, epoch, i, [float(x) for x in losses]) as step,
                ):
                    mid.save(step)
            window.before_step(epoch * n + i)  # the profiler's capture window (profile_steps)
            with nvtx.step_range(folder.cfg.enable_manual_profiling, epoch * n + i):
                # --- input: the host's wait for the batch (a sampled step drains the device queue first) ---
                timed = timing.sampled(i)
                if timed:
                    distribute.sync_devices(strategy)
                with nvtx_range("data wait", "yellow"), timing.input_wait(timed), signals.signal_first():
                    batch = next(batches)
                    if timed:
                        distribute.sync_devices(strategy)
                # --- the step: XLA-compiled, dispatched asynchronously (the host runs ahead) ---
                with nvtx_range("step dispatch", "blue"):
                    metrics = train_fn(batch)
            losses.append(metrics["loss"])
    losses = tf.stack(losses).numpy()  # waits for the epoch's steps
    timing.stop()
    return losses, metrics, timing


def open_run(
    cfg: Config, workdir: Path, num_devices: int | None, overwrite: bool
) -> tuple[tf.distribute.Strategy, RunFolder]:
    """XLA's settings (before the first device query reads ``TF_XLA_FLAGS``), the distribution strategy,
    then the run folder."""
    settings = distribute.configure_xla(cfg)
    strategy = distribute.make_strategy(num_devices)
    replicas, rank = distribute.num_replicas(strategy), distribute.process_index()
    banner = distribute.banner()
    return strategy, RunFolder(
        cfg, workdir, FRAMEWORK, banner, settings, replicas, process_index=rank, overwrite=overwrite
    )


def initial_state(cfg: Config, lr_table: np.ndarray, init_weights: str | None, strategy: tf.distribute.Strategy):
    """The model (its precision policy: ``cfg.precision``), Adam on ``lr_table`` and the train state from
    ``init_weights`` (or the contract's init), under ``strategy``'s scope: ``(model, optimizer, state)``."""
    with strategy.scope():
        model, optimizer = model_mod.build_model(cfg), make_optimizer(cfg, lr_table)
        model_mod.params_from_canonical(model, unet_spec.starting_weights(cfg, init_weights))
        optimizer.build(model.trainable_variables)
    return model, optimizer, TrainState(model, optimizer, ema.initial(model, optimizer, strategy))


def capture_window(cfg: Config, folder: RunFolder) -> nvtx.CaptureWindow:
    """The profiler's capture window (``profile_steps``, ``enable_manual_profiling``), inside which every
    NVTX range is also a trace annotation: TF's trace into
    ``<workdir>/profile`` and, on a GPU, the CUDA profiler API (``nsys --capture-range=cudaProfilerApi``)."""
    start = functools.partial(tf.profiler.experimental.start, str(folder.workdir / "profile"))
    gpu = bool(tf.config.list_logical_devices("GPU"))
    return nvtx.capture_window(
        cfg, folder.steps_per_epoch, start, tf.profiler.experimental.stop, gpu, tf.profiler.experimental.Trace
    )


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
    """Train ``cfg`` in ``workdir``; return the trained model and the last epoch's metrics (and the time to
    quality's: :mod:`shared_data.inference.quality`). ``stop_after_epoch``: as a job's time limit."""
    strategy, folder = open_run(cfg, workdir, num_devices, overwrite)
    model, optimizer, state = initial_state(cfg, folder.lr_table, init_weights, strategy)
    with Checkpoints(folder.workdir / "checkpoints", cfg.keep_checkpoints, state) as ckpt:  # closed on every exit
        # --- resume: the newest checkpoint that restores, or a stop's mid-epoch save ---
        mid_epoch = functools.partial(Checkpoints, folder.mid_epoch_dir / "checkpoints", 1, state)
        start = resume_mod.resume(folder, ckpt, mid_epoch, resume)
        state = state if start.restored is None else start.restored
        # --- the input pipelines, then XLA: the steps compiled ahead of time ---
        train_in = data_mod.make_input(cfg, "train", strategy, start.epoch, start.step)
        val_in = data_mod.make_input(cfg, "val", strategy)
        specs = [data_mod.input_spec(inp, cfg, strategy) for inp in (train_in, val_in)]
        compiled = folder.trains(start.epoch, stop_after_epoch)  # a finished run resumed compiles nothing
        train_fn, eval_fn, compile_s = compile_steps(cfg, strategy, state, *specs) if compiled else (None, None, 0.0)
        report = EpochReport(folder, compile_s)
        if report.begin(start.epoch, distribute.versions()):  # a fresh run: TensorBoard's step-0 loss
            with ema.averaged(state):  # the model holds the weight average inside
                report.step0(evaluate(eval_fn, val_in))
        agree, device = functools.partial(distribute.main_process_flag, strategy), distribute.device_kind()
        monitor = quality.Monitor(folder, report.metrics, device, start.epoch, agree)
        forward = predict.forward_fn(monitor.predict_cfg)  # compiled at the first evaluation
        with capture_window(cfg, folder) as window, signals.deferred():  # a signal stops the run between steps
            for epoch in monitor.remaining(folder.epochs(start.epoch, stop_after_epoch)):
                # --- train: the epoch's steps ---
                losses, metrics, timing = train_epoch(
                    strategy, train_fn, train_in.epoch(epoch), epoch, start, folder, report, mid_epoch, window
                )
                report.check_finite(epoch, losses)
                # --- validate: Nsamples_val crops of the validation volume ---
                with report.validating(), ema.averaged(state):
                    val_loss = evaluate(eval_fn, val_in)
                step = int(optimizer.iterations.numpy())
                report.epoch(epoch, timing, losses, val_loss, step, metrics.get("loss_scale"))
                # --- checkpoint ---
                with saves.saving(folder, epoch + 1):
                    ckpt.save(epoch + 1)
                # --- time to quality: judge the whole validation volume; stop at the target ---
                if monitor.due(epoch):
                    with ema.averaged(state) as weights:
                        monitor.evaluate(epoch + 1, step, forward(weights))
                if monitor.stops(epoch):
                    break
        if save_weights:  # the weights the run evaluated: the average with ema_decay
            with ema.averaged(state) as weights:
                weights = model_mod.params_to_canonical(weights)
            saves.save_final_weights(save_weights, weights, distribute.is_main_process())
        reached = monitor.finish()
        return model, {**report.finish(distribute.peak_memory_bytes()), **reached}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tf_impl.train``: the shared command line (:func:`shared_data.runtime.cli.main`)."""
    return cli.main(
        FRAMEWORK, train_and_evaluate, argv, initialize=distribute.initialize, process_index=distribute.process_index
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
