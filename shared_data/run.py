"""The run around a training loop, identical for TF and JAX: everything in ``train.py`` that is not
framework code.

A :class:`Run` owns the run folder and what a run prints and records:

* the set-up log lines (framework settings, precision, data-parallel layout, input), the data check
  (before anything in the run folder is touched), the resume rule and the checkpoint fallback;
* the tutorial's per-epoch log lines, followed by the share of the epoch the host waited for input::

      Time taken for epoch 1 is 12.3 sec, avg 166.4 samples/sec
        Avg train loss=0.051234
        Avg val loss=0.049876
        Total validation time: 0.8 sec
        Input wait 3.2% of the epoch, train step 96.5%

  and, once per run, a sentence when the run is input-bound;
* ``metrics.jsonl`` (one record per epoch), ``run.json`` (command line, config, code and library
  versions of every invocation), ``out.log`` (all that the run logged) and TensorBoard scalars under
  the tutorial's tags (``Loss/train``, ``Loss/valid``, ``Learning Rate``, ``Avg iters per sec``, the
  step as the x axis, a step-0 loss), the divergence check and the peak memory line.

:func:`main` is the command line of both trainers. Files are written atomically
(:mod:`shared_data.files`); records of a resumed or multi-process run are appended, never replaced.
Only the main process (process 0) prints epoch lines and writes files; the others log warnings and
errors with a rank tag.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from shared_data import config as config_mod
from shared_data import loaders, schedule, unet_spec
from shared_data.config import Config, batch_sizes, config_dict
from shared_data.errors import UserError
from shared_data.files import write_atomic
from shared_data.nvtx import CaptureWindow, nvtx_range

log = logging.getLogger("dlas")

#: A run is called input-bound when the host waits for input this share of an epoch or more.
INPUT_BOUND_SHARE = 0.3


# --- logging ---------------------------------------------------------------------------------------


def setup_logging(process_index: int = 0, level: int = logging.INFO) -> None:
    """One stream handler on stdout (idempotent). Process 0 logs at ``level``; every other process
    logs warnings and errors only, each line tagged with its rank."""
    root = logging.getLogger()
    for h in _handlers("stream"):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_formatter(process_index))
    handler._dlas = "stream"  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level if process_index == 0 else logging.WARNING)
    for noisy in ("absl", "jax._src", "orbax", "tensorflow", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _handlers(kind: str) -> list[logging.Handler]:
    """The root logger's handlers this module added: ``"stream"`` (the console) or ``"file"`` (out.log)."""
    return [h for h in logging.getLogger().handlers if getattr(h, "_dlas", False) == kind]


def _formatter(process_index: int) -> logging.Formatter:
    tag = "" if process_index == 0 else f"[rank {process_index}] %(levelname)s "
    return logging.Formatter(f"%(asctime)s {tag}%(message)s", "%H:%M:%S")


def log_to_file(path: Path, process_index: int = 0) -> None:
    """Append every log line of this process to ``path`` (``out.log``) from now on; one file handler."""
    close_log_file()
    root = logging.getLogger()
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(_formatter(process_index))
    handler._dlas = "file"  # type: ignore[attr-defined]
    root.addHandler(handler)


def log_to_file_only(level: int, message: str) -> None:
    """Write ``message`` to the run's ``out.log`` alone (not to the console), if one is open."""
    record = log.makeRecord(log.name, level, __file__, 0, message, (), None)
    for h in _handlers("file"):
        h.handle(record)


def close_log_file() -> None:
    """Stop writing log lines to the run's ``out.log``."""
    for h in _handlers("file"):
        logging.getLogger().removeHandler(h)
        h.close()


def progress(iterable: Iterable, total: int, desc: str, enabled: bool) -> Iterator:
    """A tqdm progress bar over ``iterable`` when ``enabled`` and tqdm's stream (stderr) is a terminal;
    a batch job's log (a SLURM ``.out`` file) gets no carriage-return updates."""
    if not (enabled and sys.stderr.isatty()):
        return iter(iterable)
    from tqdm import tqdm

    return iter(tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True, mininterval=1.0))


def epoch_lines(
    epoch: int, seconds: float, samples: int, train_loss: float, val_loss: float, val_seconds: float
) -> list[str]:
    """The tutorial's per-epoch log lines (``epoch`` counted from 1)."""
    return [
        f"Time taken for epoch {epoch} is {seconds:.1f} sec, avg {samples / seconds:.1f} samples/sec",
        f"  Avg train loss={train_loss:.6f}",
        f"  Avg val loss={val_loss:.6f}",
        f"  Total validation time: {val_seconds:.1f} sec",
    ]


def share_line(input_share: float, step_share: float) -> str:
    """The line after the epoch lines: shares of the epoch's wall time in input wait and in the step."""
    return f"  Input wait {100 * input_share:.1f}% of the epoch, train step {100 * step_share:.1f}%"


def input_bound_advice(loader: str) -> str:
    """What would feed an input-bound run with ``loader`` faster (the tutorial's lesson 2)."""
    kind = loaders.loader_kind(loader)
    if kind.device_volumes and not kind.dali:
        return (
            "the volumes are already in device memory, so the host itself is the limit "
            "(check for other work on the machine)"
        )
    if kind.device_volumes:
        return "data_loader_config: device (one compiled gather, no DALI kernels beside the step)"
    if kind.dali:
        return (
            "more dali_threads / num_data_workers, or data_loader_config: dali-device or device "
            "(volumes in GPU memory, no host copies)"
        )
    return (
        "more num_data_workers, data_loader_config: dali-npy (DALI), or device / dali-device (volumes in device memory)"
    )


# --- the run folder ----------------------------------------------------------------------------------


def workdir_for(cfg: Config, framework: str, workdir: str | None = None, run_num: str | None = None) -> Path:
    """The run folder: ``workdir`` if given, else ``<exp_dir>/<config>[/<run_num>]/<framework>``
    (``exp_dir`` relative to the current folder, as every relative run path)."""
    if workdir:
        return Path(workdir)
    root = cfg.resolve_path(cfg.exp_dir) / cfg.name
    return (root / run_num if run_num else root) / framework


def check_data(cfg: Config) -> None:
    """Check, before anything in a run folder is touched, that the data of ``cfg`` exist and follow the
    contract: both split files (unless ``synthetic``) and, for the DALI numpy reader, their ``.npy``
    twins. Raises the :class:`shared_data.errors.DatasetError` naming the file and the fix."""
    from shared_data import dataset

    kind = loaders.loader_kind(cfg)
    if not kind.uses_files:
        return
    for split in ("train", "val"):
        info = dataset.validate(cfg.data_file(split), cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
        if kind.reads_npy:
            dataset.check_npy_twins(info, cfg.npy_files(split))


class ScalarWriter:
    """TensorBoard scalars through ``tensorboard.summary.Writer`` (neither TF nor tensorboardX needed);
    a warning and no-op when ``tensorboard`` is missing, a no-op when disabled."""

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
        # marker module exists when that choice is first made (it is cached); a JAX run keeps TF out
        # of its process. The marker is removed again so a later tf.summary user is unaffected.
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
        """Write ``values`` (tag -> number) at global step ``step``."""
        if self._writer is not None:
            for tag, value in values.items():
                self._writer.add_scalar(tag, float(value), step)
            self._writer.flush()


class MetricsLog:
    """``<workdir>/metrics.jsonl``: one JSON object per epoch, appended; on resume the records after
    the restored epoch are dropped by an atomic rewrite. Does nothing when ``enabled`` is False."""

    def __init__(self, workdir: Path, enabled: bool = True):
        self.path, self.enabled = workdir / "metrics.jsonl", enabled

    def append(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    def truncate_after(self, epoch: int) -> None:
        """Keep the records of epochs <= ``epoch`` (and drop a torn last line)."""
        if self.enabled and self.path.exists():
            keep = [r for r in read_metrics(self.path.parent) if r["epoch"] <= epoch]
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in keep))


def read_metrics(workdir: str | Path) -> list[dict]:
    """The epoch records of ``<workdir>/metrics.jsonl`` (empty if none). A line that is not a JSON
    object with an ``epoch`` (a torn write) is skipped with a warning naming the file and line."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("epoch"), int):
            log.warning("%s line %d is not an epoch record (a torn write?): skipped", path, i)
            continue
        records.append(record)
    return records


def read_run_info(workdir: Path) -> dict:
    """``<workdir>/run.json`` as a dict; empty when missing, and empty with a warning when damaged."""
    path = workdir / "run.json"
    if not path.exists():
        return {}
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        log.warning("%s is not valid JSON (a damaged file?): a new one is written", path)
        return {}
    return info if isinstance(info, dict) else {}


def code_version() -> dict:
    """The code that runs: the git commit (and whether the tree has changes) of a checkout, else the
    installed package version."""
    root = Path(__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            )
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if commit.returncode == 0:
                return {"git_commit": commit.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
        except (OSError, subprocess.SubprocessError):
            pass
    from importlib import metadata

    try:
        return {"package_version": metadata.version("dlas-cosmo")}
    except metadata.PackageNotFoundError:
        return {"package_version": "unknown"}


# --- the run -----------------------------------------------------------------------------------------


class Run:
    """The bookkeeping of one training run in ``workdir``; the trainers call it in this order:

    ``Run(...)`` -> :meth:`resume` -> :meth:`begin` -> :meth:`epochs` (per epoch: :meth:`steps`,
    :meth:`end_epoch`) -> :meth:`finish`.

    Args:
        cfg: the frozen config.
        workdir: the run folder (created; ``out.log`` there receives every log line from here on).
        framework: ``"tf"`` or ``"jax"``.
        banner: the framework, its version and backend (the first log line).
        settings: what the framework's ``configure_xla`` set (logged).
        replicas: data-parallel replicas.
        process_index: this process's rank; process 0 alone logs epoch lines and writes files.
        resume, overwrite: the ``--resume`` / ``--overwrite`` flags.

    Raises:
        UserError: bad data (before ``--overwrite`` deletes anything), a batch that does not divide
            over the replicas, a run folder holding another framework's run.
    """

    def __init__(
        self,
        cfg: Config,
        workdir: Path,
        framework: str,
        banner: str,
        settings: dict,
        replicas: int,
        *,
        process_index: int = 0,
        resume: bool = False,
        overwrite: bool = False,
    ):
        self.cfg, self.workdir, self.framework = cfg, Path(workdir), framework
        self.main = process_index == 0
        self.resume_requested, self.overwrite = resume, overwrite
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_to_file(self.workdir / "out.log", process_index)
        log.info("%s; config %r from %s", banner, cfg.name, cfg.source)
        self.global_batch, self.local_batch = log_setup(cfg, settings, replicas)
        self.steps_per_epoch = config_mod.steps_per_epoch(cfg, replicas)
        self.lr_table = schedule.lr_table(cfg, self.global_batch, self.steps_per_epoch * cfg.num_epochs)
        check_data(cfg)  # bad data must fail before --overwrite clears anything
        if overwrite and (self.workdir / "checkpoints").exists():
            shutil.rmtree(self.workdir / "checkpoints", ignore_errors=not self.main)
        self.metrics = MetricsLog(self.workdir, enabled=self.main)
        self.writer: ScalarWriter | None = None
        self.compile_sec = 0.0
        self.last: dict = {}
        self._said_input_bound = False
        self._epoch_start = 0.0
        self._input_wait = 0.0
        self._window: CaptureWindow | None = None

    def initial_weights(self, init_weights: str | None) -> dict[str, np.ndarray]:
        """Canonical weights to start from: the file ``init_weights`` or the contract's init from ``seed``."""
        cfg = self.cfg
        return unet_spec.load_weights(init_weights, cfg) if init_weights else unet_spec.init_weights(cfg, cfg.seed)

    def resume(self, checkpoints) -> tuple[int, object]:
        """Apply the resume rule to ``checkpoints`` (``epochs()`` newest last; ``restore(epoch)``) and
        return ``(start_epoch, restored)``: ``(0, None)`` for a fresh run, else the newest checkpoint
        that restores. A checkpoint that fails to restore (a damaged file) is skipped with a warning.

        Raises:
            UserError: the folder holds checkpoints and neither ``--resume`` nor ``--overwrite`` was
                given; no checkpoint restores (the newest one's error, e.g. a config mismatch).
        """
        epochs = list(checkpoints.epochs())
        if not epochs:
            if self.resume_requested:
                log.info("no checkpoint in %s: starting from scratch", self.workdir)
            return 0, None
        if not self.resume_requested:
            raise UserError(
                f"{self.workdir} already holds checkpoints (epoch {epochs[-1]}); pass --resume to continue, "
                f"--overwrite to start again, or --workdir for a new run"
            )
        first_error = None
        for epoch in reversed(epochs):
            try:
                restored = checkpoints.restore(epoch)
            except UserError as err:
                first_error = first_error or err
                log.warning("checkpoint of epoch %d does not restore (%s); trying an older one", epoch, err)
                continue
            if epoch != epochs[-1]:
                log.warning("resuming from the checkpoint of epoch %d, the newest one that restores", epoch)
            log.info("resumed from %s at epoch %d", checkpoints.directory, epoch)
            return epoch, restored
        raise first_error

    def begin(self, start_epoch: int, compile_sec: float, versions: dict, val_loss: Callable[[], float]) -> None:
        """Record the invocation in ``run.json``, drop metrics after ``start_epoch`` and open TensorBoard;
        a fresh run writes its step-0 validation loss (``val_loss()``, one pass) there."""
        self.compile_sec = compile_sec
        self.last = {"epoch": start_epoch, "compile_sec": compile_sec}
        if not self.main:
            return
        self.metrics.truncate_after(start_epoch)
        self._record_invocation(start_epoch, versions)
        self.writer = ScalarWriter(self.workdir / "tb", self.cfg.tensorboard)
        if start_epoch == 0 and self.writer._writer is not None:
            self.writer.scalars(0, {"Loss/valid": val_loss(), "Learning Rate": float(self.lr_table[0])})

    def _record_invocation(self, start_epoch: int, versions: dict) -> None:
        info = read_run_info(self.workdir)
        invocations = info.get("invocations") if isinstance(info.get("invocations"), list) else []
        invocations.append(
            {
                "command": " ".join(shlex.quote(a) for a in sys.argv),
                "cwd": os.getcwd(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "start_epoch": start_epoch,
                "host": platform.node(),
                "python": platform.python_version(),
                "code": code_version(),
                "versions": versions,
            }
        )
        info.update(
            framework=self.framework,
            config=self.cfg.name,
            config_source=self.cfg.source,
            config_values=config_dict(self.cfg),
            invocations=invocations,
        )
        write_atomic(self.workdir / "run.json", json.dumps(info, indent=1))

    @contextlib.contextmanager
    def profile(self, start_trace: Callable[[], object], stop_trace: Callable[[], object], use_cuda: bool):
        """The capture window of ``profile_steps`` (or of ``enable_manual_profiling``: the tutorial's
        first 60 steps of epoch 2) around the body: the framework's trace and the CUDA profiler API."""
        steps = self.cfg.profile_steps
        if steps is None and self.cfg.enable_manual_profiling:
            steps = (self.steps_per_epoch, self.steps_per_epoch + 60)
        self._window = CaptureWindow(steps, on_start=[start_trace], on_stop=[stop_trace], use_cuda=use_cuda)
        try:
            yield
        finally:
            self._window.close()

    def epochs(self, start_epoch: int, stop_after_epoch: int | None = None) -> range:
        """The epochs this invocation trains (``stop_after_epoch`` ends it early, as a job's time limit);
        a resumed run that has trained all ``num_epochs`` says so."""
        end = self.cfg.num_epochs if stop_after_epoch is None else min(stop_after_epoch, self.cfg.num_epochs)
        if start_epoch >= self.cfg.num_epochs:
            log.info(
                "all %d epochs of this run are trained: nothing to do (--set num_epochs=N to continue it)",
                self.cfg.num_epochs,
            )
        return range(start_epoch, end)

    def steps(self, batches: Iterator, epoch: int) -> Iterator:
        """The training batches of ``epoch``, timed: the wait for each batch (``data wait``) is counted
        as input time; the progress bar and the capture window advance with them."""
        self._epoch_start, self._input_wait = time.perf_counter(), 0.0
        manual = self.cfg.enable_manual_profiling
        for i in progress(
            range(self.steps_per_epoch), self.steps_per_epoch, f"epoch {epoch + 1}", self.cfg.progress_bar
        ):
            step = epoch * self.steps_per_epoch + i
            if self._window is not None:
                self._window.before_step(step)
            with nvtx_range(f"step {step}", "purple") if manual else contextlib.nullcontext():
                t0 = time.perf_counter()
                with nvtx_range("data wait", "yellow"):
                    batch = next(batches)
                self._input_wait += time.perf_counter() - t0
                yield batch

    def end_epoch(
        self,
        epoch: int,
        train_losses,
        evaluate: Callable[[], float],
        step: int,
        loss_scale: float | None = None,
    ) -> dict:
        """Close epoch ``epoch`` (0-based): ``train_losses`` are its per-step losses (on the host, so
        the epoch's device work is done), ``evaluate()`` the validation loss; log, record and return
        the epoch's metrics.

        Raises:
            UserError: a non-finite training loss (without fp16 loss scaling, which skips such steps).
        """
        seconds = time.perf_counter() - self._epoch_start
        losses = np.asarray(train_losses, np.float64)
        cfg, steps = self.cfg, self.steps_per_epoch
        if not np.isfinite(losses).all() and cfg.precision != "float16":
            bad = int(np.argmax(~np.isfinite(losses)))
            raise UserError(
                f"training diverged: loss is {losses[bad]} at step {epoch * steps + bad} of config "
                f"{cfg.name!r}; lower start_lr or enable loss scaling"
            )
        t0 = time.perf_counter()
        val_loss = float(evaluate())
        val_seconds = time.perf_counter() - t0
        train_loss = float(np.mean(losses[np.isfinite(losses)])) if np.isfinite(losses).any() else float("nan")
        input_share = min(self._input_wait / seconds, 1.0)
        for line in epoch_lines(epoch + 1, seconds, steps * self.global_batch, train_loss, val_loss, val_seconds):
            log.info(line)
        log.info(share_line(input_share, 1.0 - input_share))
        self._advise(epoch, input_share)
        lr = float(self.lr_table[min(step, len(self.lr_table)) - 1])
        self.last = dict(
            epoch=epoch + 1,
            step=step,
            train_loss=train_loss,
            val_loss=val_loss,
            lr=lr,
            samples_per_sec=steps * self.global_batch / seconds,
            epoch_sec=seconds,
            val_sec=val_seconds,
            compile_sec=self.compile_sec,
            input_wait_share=input_share,
        )
        if loss_scale is not None:
            self.last["loss_scale"] = float(loss_scale)
        self.metrics.append(self.last)
        if self.writer is not None:
            if step == steps * (epoch + 1) and epoch == 0:  # a fresh run: the first step's loss is the step-0 loss
                self.writer.scalars(0, {"Loss/train": float(losses[0])})
            self.writer.scalars(
                step,
                {
                    "Loss/train": train_loss,
                    "Loss/valid": val_loss,
                    "Learning Rate": lr,
                    "Avg iters per sec": steps / seconds,
                },
            )
        return self.last

    def _advise(self, epoch: int, input_share: float) -> None:
        """Say once per run that it is input-bound, from the second epoch on (the first one includes
        the loaders' start-up) or in a one-epoch run."""
        if self._said_input_bound or input_share < INPUT_BOUND_SHARE:
            return
        if epoch == 0 and self.cfg.num_epochs > 1:
            return
        self._said_input_bound = True
        log.info(
            "This run is input-bound: the host waited for input %.0f%% of epoch %d, so the %s loader, not "
            "the step, sets the speed (the tutorial's first finding). What would fix it: %s.",
            100 * input_share,
            epoch + 1,
            self.cfg.data_loader_config,
            input_bound_advice(self.cfg.data_loader_config),
        )

    def finish(self, peak_memory_bytes: int | None) -> dict:
        """Log the peak device memory and return the last epoch's metrics (``epoch``, ``train_loss``,
        ``val_loss``, ``samples_per_sec``, ``compile_sec``, ...)."""
        if peak_memory_bytes:
            log.info("peak device memory: %.2f GiB", peak_memory_bytes / 2**30)
            self.last["peak_memory_bytes"] = peak_memory_bytes
        close_log_file()
        return dict(self.last)


def log_setup(cfg: Config, settings: dict, replicas: int) -> tuple[int, int]:
    """Log a run's framework settings (``configure_xla``'s), precision policy, data-parallel layout,
    input and paths, the same lines in TF and JAX; return ``(global, local)`` batch sizes (raises the
    :func:`shared_data.config.batch_sizes` error when the batch does not divide over ``replicas``)."""
    for note in cfg.notes:
        log.info("config: %s", note)
    for key, value in settings.items():
        log.info("  %s = %s", key, "(unset)" if value == "" else value)
    global_bs, local_bs = batch_sizes(cfg, replicas)
    log.info(
        "precision: %s compute, float32 parameters%s",
        cfg.precision,
        ", dynamic loss scaling" if cfg.precision == "float16" else "",
    )
    log.info("data parallel: %d replicas, global batch %d, local batch %d", replicas, global_bs, local_bs)
    log.info("input: %s loader, %d^3 crops, symmetries %s", cfg.data_loader_config, cfg.crop_size, cfg.symmetry_group)
    if loaders.loader_kind(cfg).uses_files:
        log.info("data: %s, %s", cfg.data_file("train"), cfg.data_file("val"))
    return global_bs, local_bs


# --- the command line ----------------------------------------------------------------------------------

#: The tutorial's DDP-only flags, each answered with what does the job here.
DDP_ONLY = {
    "--local_rank": "the process's devices come from the launcher (jax.distributed or TF_CONFIG / SLURM); "
    "see scripts/launch",
    "--bucket_cap_mb": "XLA combines and schedules the gradient all-reduces itself; its combining threshold "
    "is the XLA flag --xla_gpu_all_reduce_combine_threshold_bytes (XLA_FLAGS)",
    "--disable_broadcast_buffers": "the U-Net has no buffers to broadcast; parameters are replicated by the "
    "JAX mesh or the TF strategy",
    "--noddp": "a run without gradient all-reduce is a one-device run: --num_devices 1",
}


def add_run_args(parser: argparse.ArgumentParser, framework: str) -> None:
    """The trainers' run flags (both frameworks take the same): run folder, resume, devices, weights,
    the tutorial's ``--run_num``, ``--enable_benchy``, ``--enable_apex``, and its DDP-only flags
    (refused with the equivalent here)."""
    run = parser.add_argument_group("run")
    run.add_argument("--workdir", help=f"run folder (default: <exp_dir>/<config>[/<run_num>]/{framework})")
    run.add_argument("--run_num", help="tag of this run: the run folder is <exp_dir>/<config>/<run_num>/<framework>")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run folder")
    run.add_argument("--overwrite", action="store_true", help="delete the run folder's checkpoints and start again")
    run.add_argument("--num_devices", type=int, help="use the first N devices (default: all)")
    run.add_argument("--init_weights", help="canonical weights file (.npz) to start from")
    run.add_argument(
        "--stop_after_epoch",
        type=int,
        help="end this invocation after that epoch (like a job time limit); --resume continues",
    )
    run.add_argument("--save_weights", help="write the final weights to this canonical .npz file")
    run.add_argument(
        "--enable_benchy",
        action="store_true",
        help="instead of training, run the benchmark's IO, SYNTHETIC and FULL modes on this config",
    )
    run.add_argument(
        "--enable_apex",
        action="store_true",
        help="accepted for the tutorial's commands: Adam already runs fused inside the compiled step",
    )
    for flag in DDP_ONLY:
        run.add_argument(flag, nargs="?", const=True, help=argparse.SUPPRESS)


def check_run_args(args: argparse.Namespace, workdir: Path, framework: str) -> None:
    """Reject run flags that cannot work before any training starts.

    Raises:
        UserError: a DDP-only flag; ``--resume`` with ``--overwrite``; a run folder that is a file or
            belongs to the other framework; ``--num_devices`` below 1; a ``--save_weights`` folder
            that does not exist.
    """
    for flag, instead in DDP_ONLY.items():
        if getattr(args, flag.lstrip("-")) is not None:
            raise UserError(f"{flag} is PyTorch DDP's; not needed here: {instead}")
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite conflict: give one")
    if workdir.exists() and not workdir.is_dir():
        raise UserError(f"--workdir {workdir} is a file, expected a folder")
    other = read_run_info(workdir).get("framework") if workdir.is_dir() else None
    if other and other != framework:
        raise UserError(f"{workdir} holds a {other} run; use another --workdir for {framework}")
    if args.num_devices is not None and args.num_devices < 1:
        raise UserError(f"--num_devices {args.num_devices}: expected at least 1")
    if args.stop_after_epoch is not None and args.stop_after_epoch < 1:
        raise UserError(f"--stop_after_epoch {args.stop_after_epoch}: expected at least 1")
    if args.save_weights:
        folder = Path(args.save_weights).absolute().parent
        if not folder.is_dir() and folder != workdir.absolute():  # the run folder itself is made by the run
            raise UserError(f"--save_weights {args.save_weights}: folder {folder} does not exist")


def build_parser(framework: str) -> argparse.ArgumentParser:
    """The trainer's parser: the config flags (:func:`shared_data.config.add_config_args`) and the run flags."""
    name = {"jax": "JAX", "tf": "TensorFlow"}[framework]
    parser = argparse.ArgumentParser(
        prog=f"python -m {framework}_impl.train", description=f"Train the cosmology U-Net with {name}."
    )
    config_mod.add_config_args(parser)
    add_run_args(parser, framework)
    return parser


def benchy(framework: str, args: argparse.Namespace) -> int:
    """``--enable_benchy``: the tutorial's benchy modes are the benchmark command here; run it."""
    from compare import benchmark

    argv = ["--framework", framework, "--mode", "io", "synthetic", "full", "--config", args.config]
    argv += ["--yaml_config", args.yaml_config] + [a for s in args.set for a in ("--set", s)]
    for key in config_mod.FLAG_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            argv += [f"--{key}"] if value is True else ([] if value is False else [f"--{key}", str(value)])
    log.info("--enable_benchy: python -m compare.benchmark %s", " ".join(shlex.quote(a) for a in argv))
    return benchmark.main(argv)


def main(
    framework: str,
    train_and_evaluate: Callable[..., dict],
    argv: Sequence[str] | None = None,
    *,
    initialize: Callable[[], None],
    process_index: Callable[[], int],
) -> int:
    """The trainers' command line: parse, join a multi-process run (``initialize``), set up logging for
    this rank, train in the run folder, write ``--save_weights`` (main process)."""
    args = build_parser(framework).parse_args(argv)
    setup_logging()
    if args.enable_apex:
        log.info("--enable_apex: Adam already runs fused inside the compiled step; nothing to enable")
    cfg = config_mod.config_from_args(args)
    if args.enable_benchy:
        return benchy(framework, args)
    workdir = workdir_for(cfg, framework, args.workdir, args.run_num)
    check_run_args(args, workdir, framework)
    initialize()
    setup_logging(process_index())
    try:
        train_and_evaluate(
            cfg,
            workdir,
            resume=args.resume,
            overwrite=args.overwrite,
            num_devices=args.num_devices,
            init_weights=args.init_weights,
            stop_after_epoch=args.stop_after_epoch,
            save_weights=args.save_weights,
        )
    except UserError as err:
        log_to_file_only(logging.ERROR, f"error: {err}")  # run_cli prints the one line on stderr
        raise
    finally:
        close_log_file()
    return 0


def remove_partial_saves(directory: Path, patterns: Sequence[str]) -> None:
    """Delete what a killed checkpoint save left in ``directory`` (files or folders matching ``patterns``)."""
    if not directory.is_dir():
        return
    for pattern in patterns:
        for path in directory.glob(pattern):
            log.info("removing %s, left by an unfinished checkpoint save", path)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def save_final_weights(path: str | None, weights: Callable[[], dict], main_process: bool) -> None:
    """Write ``weights()`` (canonical arrays) to ``path`` (atomic) on the main process, if a path is given."""
    if path and main_process:
        unet_spec.save_weights(path, weights())
        log.info("wrote %s", path)
