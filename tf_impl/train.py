"""Train the U-Net with TensorFlow: ``python -m tf_impl.train --config cpu_default [overrides]``.

Mirrors :mod:`jax_impl.train`: ``train_step`` and ``eval_step`` are ``tf.function``s compiled with
XLA (``jit_compile=enable_jit``), run per replica by the ``tf.distribute`` strategy; the loop,
log lines, metrics file, TensorBoard scalars and per-epoch checkpoints are the same as JAX's.
TensorFlow's GPU path follows TF's and DALI's documentation but is run on CPU here (the GPU
machine has no TensorFlow); see README.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from shared_data import config as config_mod  # noqa: E402
from shared_data import runlog, schedule, unet_spec  # noqa: E402
from shared_data.config import Config  # noqa: E402
from shared_data.errors import UserError, run_cli  # noqa: E402
from shared_data.nvtx import CaptureWindow, nvtx_range  # noqa: E402
from tf_impl import data as data_mod  # noqa: E402
from tf_impl import distribute  # noqa: E402
from tf_impl import model as model_mod  # noqa: E402

log = logging.getLogger("dlas.tf")
FRAMEWORK = "tf"


def configure_xla(cfg: Config) -> dict:
    """The one place that sets TF/XLA options; returns what was set (logged by the caller)."""
    tf.config.optimizer.set_jit(False)  # XLA only where asked: the steps' jit_compile=enable_jit
    return {"jit_compile": cfg.enable_jit, "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "TF_XLA_FLAGS": os.environ.get("TF_XLA_FLAGS", "")}


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
    """Adam (betas 0.9/0.999, eps 1e-8, as JAX) on the shared LR table; wrapped in Keras'
    ``LossScaleOptimizer`` (dynamic) for float16 compute. Keras applies eps as
    ``m / (sqrt(v) + eps)`` on uncorrected moments, optax as ``m_hat / (sqrt(v_hat) + eps)``: the
    effective eps differs by 1 / sqrt(1 - beta_2^t), negligible unless gradients are ~1e-7."""
    opt = keras.optimizers.Adam(learning_rate=TableSchedule(lr_table), beta_1=0.9, beta_2=0.999, epsilon=1e-8)
    if cfg.precision == "float16":
        opt = keras.optimizers.LossScaleOptimizer(opt, initial_scale=cfg.loss_scale_init,
                                                  dynamic_growth_steps=cfg.loss_scale_period)
    return opt


def loss_fn(pred: tf.Tensor, batch: dict, cfg: Config) -> tf.Tensor:
    """Masked mean over samples of L1(pred, target) + lambda_rho x L1(exp(s pred_rho), exp(s target_rho)).

    ``pred``/targets (B, s, s, s, N_out); ``mask`` (B,). Float32 result (as :func:`jax_impl.train.loss_fn`).
    """
    y = tf.cast(batch["targets"], tf.float32)
    pred = tf.cast(pred, tf.float32)
    per_sample = tf.reduce_mean(tf.abs(pred - y), axis=(1, 2, 3, 4))
    if cfg.lambda_rho:
        d, s = cfg.density_channel, cfg.density_scale
        rho = tf.reduce_mean(tf.abs(tf.exp(s * pred[..., d]) - tf.exp(s * y[..., d])), axis=(1, 2, 3))
        per_sample = per_sample + cfg.lambda_rho * rho
    mask = batch["mask"]
    return tf.reduce_sum(per_sample * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)


def train_step(model: keras.Model, optimizer, batch: dict, cfg: Config, replicas: int) -> dict:
    """One replica's part of an optimizer step: its loss / replicas, so the summed gradients are
    those of the global-batch mean; with fp16 a non-finite gradient skips the update. With
    ``grad_allreduce_dtype: bfloat16`` the gradients are summed over replicas in bfloat16
    (PyTorch DDP's ``bf16_compress_hook``); Keras' Adam casts them back to float32."""
    with tf.GradientTape() as tape:
        loss = loss_fn(model(batch["inputs"], training=True), batch, cfg)
        scaled = optimizer.scale_loss(loss / replicas)
    grads = tape.gradient(scaled, model.trainable_variables)
    if cfg.grad_allreduce_dtype == "bfloat16":  # Keras sums the replicas' gradients in this dtype; Adam casts back
        grads = [tf.cast(g, tf.bfloat16) for g in grads]
    optimizer.apply(grads, model.trainable_variables)
    metrics = {"loss": loss}
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        metrics["loss_scale"] = tf.identity(optimizer.dynamic_scale)
    return metrics


def eval_step(model: keras.Model, batch: dict, cfg: Config) -> dict:
    """Masked loss sum and sample count of one replica's validation batch."""
    n = tf.reduce_sum(batch["mask"])
    return {"loss_sum": loss_fn(model(batch["inputs"], training=False), batch, cfg) * n, "count": n}


def compile_steps(cfg: Config, strategy, model, optimizer, batch):
    """Build the distributed, XLA-compiled step functions and compile them by running each once on
    ``batch`` (``data.batch_spec``: zeros), then restore every variable, so training starts from the
    same state as with JAX's ahead-of-time compilation; return ``(train_fn, eval_fn, seconds)``,
    seconds being the train step's trace + compile (+ one run) time."""
    replicas = distribute.num_replicas(strategy)
    # XLA compiles each replica's step (the pattern of TF's XLA notes for tf.distribute). With
    # several logical CPU devices (tests) XLA cannot reach the other replicas' variables
    # ("tf.Variable on a different device"), so there the replicas run without XLA.
    jit = cfg.enable_jit and (replicas == 1 or bool(tf.config.list_logical_devices("GPU")))
    if cfg.enable_jit and not jit:
        log.info("XLA off: %d replicas on CPU devices", replicas)
    replica_train = tf.function(lambda b: train_step(model, optimizer, b, cfg, replicas), jit_compile=jit)
    replica_eval = tf.function(lambda b: eval_step(model, b, cfg), jit_compile=jit)

    @tf.function
    def train_fn(batch):
        out = strategy.run(replica_train, args=(batch,))
        return {k: strategy.reduce("MEAN", v, axis=None) for k, v in out.items()}

    @tf.function
    def eval_fn(batch):
        out = strategy.run(replica_eval, args=(batch,))
        return {k: strategy.reduce("SUM", v, axis=None) for k, v in out.items()}

    with strategy.scope():
        optimizer.build(model.trainable_variables)
    variables = list(model.variables) + list(optimizer.variables)
    saved = [v.numpy() for v in variables]
    t0 = time.perf_counter()
    np.asarray(train_fn(batch)["loss"])
    t_train = time.perf_counter() - t0
    np.asarray(eval_fn(batch)["count"])
    log.info("compile: train step %.1f s, eval step %.1f s", t_train, time.perf_counter() - t0 - t_train)
    for v, value in zip(variables, saved):
        v.assign(value)
    return train_fn, eval_fn, t_train


class Checkpoints:
    """``tf.train.CheckpointManager`` checkpoints of model, optimizer (with loss scale) and epoch;
    a checkpoint becomes visible only once its index file is written, so a crash leaves the last
    complete one."""

    def __init__(self, directory: Path, keep: int, model, optimizer):
        self.directory = directory
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)
        self.manager = tf.train.CheckpointManager(self.ckpt, str(directory), max_to_keep=keep)

    def latest_epoch(self) -> Optional[int]:
        path = self.manager.latest_checkpoint
        return int(path.rsplit("-", 1)[1]) if path else None

    def save(self, epoch: int) -> None:
        self.epoch.assign(epoch)
        self.manager.save(checkpoint_number=epoch)

    def restore(self, epoch: int) -> None:
        try:
            self.ckpt.restore(str(self.directory / f"ckpt-{epoch}")).assert_existing_objects_matched()
        except (ValueError, AssertionError, tf.errors.OpError) as err:
            raise UserError(f"checkpoint {self.directory}/ckpt-{epoch} does not match this config ({str(err).splitlines()[0]}); "
                            f"use another --workdir or --overwrite") from None


class ScalarWriter:
    """TensorBoard scalars through ``tf.summary``; a no-op when ``cfg.tensorboard`` is off."""

    def __init__(self, logdir: Path, enabled: bool):
        self._writer = tf.summary.create_file_writer(str(logdir)) if enabled else None

    def scalars(self, step: int, values: dict) -> None:
        if self._writer is not None:
            with self._writer.as_default():
                for tag, value in values.items():
                    tf.summary.scalar(tag, float(value), step=step)
            self._writer.flush()


def versions() -> dict:
    return {"tensorflow": tf.__version__, "keras": keras.__version__,
            "devices": [d.name for d in tf.config.list_logical_devices()], "backend": "gpu" if tf.config.list_logical_devices("GPU") else "cpu"}


def peak_memory_bytes() -> Optional[int]:
    """Peak bytes in use on the first GPU, if there is one."""
    if not tf.config.list_logical_devices("GPU"):
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"]


def train_and_evaluate(cfg: Config, workdir: Path, *, resume: bool = False, overwrite: bool = False,
                       num_devices: Optional[int] = None, init_weights: Optional[str] = None,
                       stop_after_epoch: Optional[int] = None) -> dict:
    """Train ``cfg`` in ``workdir`` (checkpoints, ``metrics.jsonl``, TensorBoard); return the last
    epoch's metrics (``train_loss``, ``val_loss``, ``samples_per_sec``, ``compile_sec``, ``epoch``)
    and the ``model``. ``stop_after_epoch`` ends this invocation early, as a job's time limit
    would; the schedule is still that of ``num_epochs``, and ``resume=True`` continues the run."""
    log.info("TensorFlow %s (Keras %s); config %r from %s", tf.__version__, keras.__version__, cfg.name, cfg.source)
    settings = configure_xla(cfg)
    strategy = distribute.make_strategy(num_devices)
    global_bs, local_bs = runlog.log_setup(cfg, settings, distribute.num_replicas(strategy))

    train_in = data_mod.make_input(cfg, "train", strategy)
    val_in = data_mod.make_input(cfg, "val", strategy)
    steps = train_in.steps
    lr_tab = schedule.lr_table(cfg, global_bs, steps * cfg.num_epochs)
    weights = unet_spec.load_weights(init_weights, cfg) if init_weights else unet_spec.init_weights(cfg, cfg.seed)
    with strategy.scope():
        model, optimizer = model_mod.build_model(cfg), make_optimizer(cfg, lr_tab)
        model_mod.set_canonical(model, weights)
    log.info("model: %.2f M parameters, %.2f GFLOP per sample per training step", unet_spec.num_params(cfg) / 1e6,
             unet_spec.train_flops_per_sample(cfg) / 1e9)

    runlog.check_data(cfg)  # bad data must fail before --overwrite clears anything
    workdir.mkdir(parents=True, exist_ok=True)
    runlog.clear_checkpoints(workdir, overwrite)
    ckpt = Checkpoints(workdir / "checkpoints", cfg.keep_checkpoints, model, optimizer)
    start_epoch = runlog.start_epoch(ckpt.latest_epoch(), resume, workdir)
    train_fn, eval_fn, compile_s = compile_steps(cfg, strategy, model, optimizer, data_mod.batch_spec(cfg, strategy))
    if start_epoch:
        ckpt.restore(start_epoch)
        log.info("resumed from %s at epoch %d (step %d)", ckpt.directory, start_epoch, int(optimizer.iterations.numpy()))
    main_process = distribute.is_main_process(strategy)
    metrics_log = runlog.MetricsLog(workdir, cfg, FRAMEWORK, versions(), enabled=main_process)
    metrics_log.truncate_after(start_epoch)
    writer = ScalarWriter(workdir / "tb", cfg.tensorboard and main_process)

    window = CaptureWindow(cfg.profile_steps, on_start=[lambda: tf.profiler.experimental.start(str(workdir / "profile"))],
                           on_stop=[tf.profiler.experimental.stop], use_cuda=bool(tf.config.list_logical_devices("GPU")))
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
                m = train_fn(batch)
            losses.append(m["loss"])
        train_losses = tf.stack(losses).numpy()
        seconds = time.perf_counter() - t0
        if not np.isfinite(train_losses).all() and cfg.precision != "float16":
            bad = int(np.argmax(~np.isfinite(train_losses)))
            raise UserError(f"training diverged: loss is {train_losses[bad]} at step {epoch * steps + bad} "
                            f"of config {cfg.name!r}; lower start_lr or enable loss scaling")
        val_loss, val_seconds = evaluate(eval_fn, val_in)
        train_loss = float(np.mean(train_losses[np.isfinite(train_losses)]))
        samples_per_sec = steps * global_bs / seconds
        for line in runlog.epoch_lines(epoch + 1, seconds, steps * global_bs, train_loss, val_loss, val_seconds):
            log.info(line)
        step = int(optimizer.iterations.numpy())  # a MirroredVariable under MirroredStrategy: no int()
        lr = float(lr_tab[min(step, len(lr_tab)) - 1])
        last = dict(epoch=epoch + 1, step=step, train_loss=train_loss, val_loss=val_loss, lr=lr,
                    samples_per_sec=samples_per_sec, epoch_sec=seconds, val_sec=val_seconds, compile_sec=compile_s)
        if "loss_scale" in m:
            last["loss_scale"] = float(m["loss_scale"])
        metrics_log.append(last)
        writer.scalars(epoch + 1, {"train/loss": train_loss, "val/loss": val_loss, "learning_rate": lr,
                                   "iterations_per_sec": steps / seconds})
        ckpt.save(epoch + 1)
    window.close()
    peak = peak_memory_bytes()
    if peak:
        log.info("peak device memory: %.2f GiB", peak / 2 ** 30)
        last["peak_memory_bytes"] = peak
    last["model"], last["strategy"] = model, strategy
    return last


def evaluate(eval_fn, val_in) -> tuple[float, float]:
    """Mean validation loss over ``Nsamples_val`` crops, and the seconds it took."""
    t0 = time.perf_counter()
    loss_sum, count = 0.0, 0.0
    for batch in val_in.epoch(0):
        out = eval_fn(batch)
        loss_sum += float(out["loss_sum"])
        count += float(out["count"])
    return loss_sum / max(count, 1.0), time.perf_counter() - t0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tf_impl.train", description="Train the cosmology U-Net with TensorFlow.")
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
    if args.save_weights and distribute.is_main_process(result["strategy"]):
        unet_spec.save_weights(args.save_weights, model_mod.get_canonical(result["model"]))
        log.info("wrote %s", args.save_weights)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
