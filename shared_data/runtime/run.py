"""The run around a training loop, identical for TF and JAX: everything in ``train.py`` that is not
framework code.

A :class:`Run` owns the run folder (its lock, :mod:`shared_data.runtime.lock`) and what a run prints
and records:

* the set-up log lines (framework settings, precision, data-parallel layout, input), the data check
  (before anything in the run folder is touched), the resume rule and the checkpoint fallback;
* the tutorial's per-epoch log lines (:mod:`shared_data.runtime.logs`) and, once per run, a sentence
  when the run is input-bound;
* ``metrics.jsonl``, ``run.json``, ``out.log`` and TensorBoard scalars
  (:mod:`shared_data.runtime.records`), the divergence check and the peak memory line.

Only the main process (process 0) prints epoch lines and writes files; the others log warnings and
errors with a rank tag. The command line of both trainers is :mod:`shared_data.runtime.cli`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from shared_data.core import config as config_mod
from shared_data.core import loader_kinds
from shared_data.core.commands import command_name
from shared_data.core.config import Config, batch_sizes, config_dict
from shared_data.core.errors import (
    DatasetError,
    UserError,
    address_space_limit,
    cap_malloc_arenas,
    out_of_memory,
    out_of_memory_in,
)
from shared_data.core.files import check_writable, write_atomic, writing
from shared_data.data.cosmology import GAS_MODELS
from shared_data.model import schedule, unet_spec
from shared_data.runtime import launch, memory, signals
from shared_data.runtime import lock as run_lock
from shared_data.runtime.logs import (
    INPUT_BOUND_SHARE,
    checkpoint_line,
    close_log_file,
    epoch_lines,
    input_bound_advice,
    log_file_error,
    log_to_file,
    progress,
    share_line,
)
from shared_data.runtime.memory import format_bytes
from shared_data.runtime.nvtx import CaptureWindow, mirrored_in, nvtx_range
from shared_data.runtime.records import TENSORBOARD_TAGS, MetricsLog, ScalarWriter, code_version, run_info_and_problem

log = logging.getLogger("dlas")

#: Seconds without a log line after which :meth:`Run.steps` says which step of the epoch it is at.
PROGRESS_SEC = 30.0
#: Steps of an epoch whose input wait :meth:`Run.steps` measures when given a ``sync`` (at most this many,
#: evenly spaced): each one drains the device first, so few keep the step's overlap with its input.
WAIT_SAMPLES = 32


def workdir_for(cfg: Config, framework: str, workdir: str | None = None, run_num: str | None = None) -> Path:
    """The run folder: ``workdir`` if given, else ``<exp_dir>/<config>[/<run_num>]/<framework>``
    (``exp_dir`` relative to the current folder, as every relative run path)."""
    if workdir:
        return Path(workdir)
    root = cfg.resolve_path(cfg.exp_dir) / cfg.name
    return (root / run_num if run_num else root) / framework


def generate_command(cfg: Config, split: str) -> str:
    """The command that makes the missing data file of ``split`` for ``cfg``: the generator with the
    file's own path, the side and gas its name carries (``train_128.h5`` -> 128;
    ``val_128_filtered.h5`` -> 128 and ``--gas filtered``, as the GPU recipes name the linear gas's
    files; else 4 crops for train, 2 for val, and the generator's default gas), the kit's seeds (1
    train, 2 val) and ``--npy`` for DALI's numpy reader. A path outside the current folder whose
    folder does not exist (the tutorial's ``/data/...``) is replaced by ``data/<its name>`` and the
    ``--set <split>_path=`` that points the config at it."""
    path = cfg.data_file(split)
    named = re.search(rf"_(\d+)(?:_({'|'.join(GAS_MODELS)}))?\.h5$", path.name)
    side = int(named.group(1)) if named else cfg.crop_size * (4 if split == "train" else 2)
    gas = f" --gas {named.group(2)}" if named and named.group(2) else ""
    npy = " --npy" if loader_kinds.loader_kind(cfg).reads_npy else ""
    generate = command_name("shared_data.data.generate")
    try:
        out, point = path.relative_to(Path.cwd()), ""
    except ValueError:  # outside the current folder: its own path if its folder exists, else data/<name>
        out, point = path, ""
        if not path.parent.is_dir():
            out = Path("data") / path.name
            point = f", then pass --set {split}_path={out}"
    seed = 1 if split == "train" else 2
    return f"{generate} --out {out} --size {max(side, cfg.crop_size)} --seed {seed}{gas}{npy}{point}"


def check_data_files(cfg: Config, splits: tuple[str, ...] = ("train", "val")) -> None:
    """Check that the data files of ``cfg``'s ``splits`` exist, before the run folder is made (or a
    benchmark compiles its step).

    Raises:
        DatasetError: a split's HDF5 file is missing; the message gives the command that makes it
            (:func:`generate_command`).
    """
    if not loader_kinds.loader_kind(cfg).uses_files:
        return
    missing = [split for split in splits if not cfg.data_file(split).exists()]
    if missing:
        files = " and ".join(str(cfg.data_file(split)) for split in missing)
        commands = "; ".join(generate_command(cfg, split) for split in missing)
        raise DatasetError(
            f"dataset file{'' if len(missing) == 1 else 's'} {files} not found; "
            f"make {'it' if len(missing) == 1 else 'them'} with: {commands}"
        )


def check_data(cfg: Config) -> None:
    """Check, before anything in a run folder is touched, that the data of ``cfg`` exist and follow the
    contract: both split files (unless ``synthetic``) and, for the DALI numpy reader, their ``.npy``
    twins. The values every loader reads (the HDF5 files, or the twins) are scanned for NaN, inf and
    values beyond :data:`shared_data.data.dataset.MAX_ABS_VALUE` (one read of each file: 0.23 s for a
    256^3 volume), so a bad value is named with its file and voxel before the first step, not
    reported as a diverged loss. Raises the :class:`shared_data.core.errors.DatasetError` naming
    the file and the fix."""
    from shared_data.data import dataset

    kind = loader_kinds.loader_kind(cfg)
    if not kind.uses_files:
        return
    infos = [
        dataset.validate(cfg.data_file(split), cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
        for split in ("train", "val")
    ]
    if kind.host_reader == "inmem":
        check_host_memory(cfg, sum(i.size**3 * (i.n_in + i.n_out) * 4 for i in infos))
    t0 = time.perf_counter()
    for split, info in zip(("train", "val"), infos):
        if kind.reads_npy:
            dataset.check_npy_twins(info, cfg.npy_files(split))
            for npy in cfg.npy_files(split):
                dataset.check_finite_npy(npy)
        else:
            dataset.scan_values(info.path)
    log.info(
        "data values: finite and within +-%g in both files (checked in %.1f s)",
        dataset.MAX_ABS_VALUE,
        time.perf_counter() - t0,
    )


def check_tensorboard_folder(folder: Path) -> None:
    """Check, before the steps are compiled, that the run's TensorBoard folder can be written (a file
    or a dangling link in its place, a read-only folder: :func:`shared_data.core.files.check_writable`).

    Raises:
        UserError: one line naming the folder, what is in the way and how to run without it.
    """
    try:
        check_writable(folder, "the run's TensorBoard folder", folder=True)
    except UserError as err:
        raise UserError(f"{err}; --set tensorboard=false runs without TensorBoard records") from None


def available_memory_bytes() -> int | None:
    """The host memory this process may still take: the least of the kernel's ``MemAvailable``, the
    cgroup's limit minus its usage (a batch job's allocation) and ``RLIMIT_AS``; None if none is known."""
    import resource

    limits = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        limits.append(int(next(line for line in meminfo if line.startswith("MemAvailable")).split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            limits.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(soft)
    return min(limits) if limits else None


def check_host_memory(cfg: Config, needed: int) -> None:
    """Refuse, before reading anything, an ``inmem`` run whose volumes (``needed`` bytes) exceed the
    memory this process may take (:func:`available_memory_bytes`).

    Raises:
        UserError: the bytes needed and available, and the loaders that read crops from the files.
    """
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise UserError(
            f"data_loader_config {cfg.data_loader_config!r} holds both volumes in host memory: "
            f"{format_bytes(needed)} needed, {format_bytes(available)} available to this process; "
            f"use --data_loader_config lowmem (each crop read from the file) or dali-npy"
        )


#: Address space a checkpoint save takes besides two copies of the train state: the threads orbax,
#: TensorStore and TensorFlow start for it (their stacks count under ``ulimit -v``; TensorStore's pool
#: grows with the cores: :data:`SAVE_RESERVE_PER_CORE`) and their buffers, with the malloc arenas
#: capped (:func:`cap_malloc_arenas`); about twice what a first save of ``cpu_tiny`` took on 2 cores.
SAVE_RESERVE_BYTES = 256 * 2**20
SAVE_RESERVE_PER_CORE = 16 * 2**20
_ARENAS_CAPPED = "ulimit -v: glibc malloc arenas capped at 2 (M_ARENA_MAX)"


def check_train_memory(cfg: Config, framework: str) -> None:
    """Refuse to start a run whose ``ulimit -v`` leaves less address space, after its framework has
    loaded, than compiling, training and its first checkpoint save take
    (:data:`~shared_data.runtime.memory.TRAIN_RESERVE_BYTES` plus :func:`save_memory_needed`):
    TensorFlow aborts natively when it runs out there (:mod:`shared_data.runtime.memory`).

    Raises:
        UserError: the limit, the address space left and needed, and by how much to raise the limit.
    """
    memory.check_address_space(
        framework,
        "train",
        "compiling, training and the first checkpoint save",
        memory.TRAIN_RESERVE_BYTES + save_memory_needed(cfg),
        "nothing is trained",
    )


def save_memory_needed(cfg: Config) -> int:
    """Address space a checkpoint save of ``cfg``'s train state needs at the least: two copies of the
    float32 parameters, Adam's two moments and the weight average (``ema_decay``), and
    :data:`SAVE_RESERVE_BYTES` plus :data:`SAVE_RESERVE_PER_CORE` per core."""
    copies = 3 + (1 if cfg.ema_decay else 0)
    reserve = SAVE_RESERVE_BYTES + SAVE_RESERVE_PER_CORE * (os.cpu_count() or 1)
    return reserve + 2 * 4 * copies * unet_spec.num_params(cfg)


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
        UserError: another trainer holds the run folder (:mod:`shared_data.runtime.lock`), bad data
            (before ``--overwrite`` deletes anything), a batch that does not divide
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
        self.started = time.perf_counter()  # the start of the run (time to quality counts from here)
        self.cfg, self.workdir, self.framework = cfg, Path(workdir), framework
        self.main = process_index == 0
        self.resume_requested, self.overwrite = resume, overwrite
        check_data_files(cfg)  # a missing file stops the run before its folder exists
        check_train_memory(cfg, framework)  # before compiling: a framework may abort natively there
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._lock = run_lock.acquire(self.workdir) if self.main else None  # before anything is written
        try:
            log_to_file(self.workdir / "out.log", process_index)
        except OSError as err:  # a read-only out.log (or folder) of an earlier run
            raise UserError(f"cannot write {self.workdir / 'out.log'} ({err.strerror}): nothing is trained") from None
        if self.main and cfg.tensorboard:
            check_tensorboard_folder(self.workdir / "tb")
        log.info("%s; config %r from %s", banner, cfg.name, cfg.source)
        log.info("run folder: %s", self.workdir.absolute())
        self._arenas_capped = cap_malloc_arenas()  # by the framework's import, under a ulimit -v
        if self._arenas_capped:
            log.info("%s, so threads reserve no address space unused", _ARENAS_CAPPED)
        self.global_batch, self.local_batch = log_setup(cfg, settings, replicas)
        self.steps_per_epoch = config_mod.steps_per_epoch(cfg, replicas)
        self.lr_table = schedule.lr_table(cfg, self.global_batch, self.steps_per_epoch * cfg.num_epochs)
        check_data(cfg)  # bad data must fail before --overwrite clears anything
        self.mid_epoch_dir = self.workdir / "mid_epoch"  # the checkpoint of a stop at a step boundary
        if overwrite and (self.workdir / "checkpoints").exists():
            sizes = [f.stat().st_size for f in (self.workdir / "checkpoints").rglob("*") if f.is_file()]
            shutil.rmtree(self.workdir / "checkpoints", ignore_errors=not self.main)
            if self.main:
                log.info(
                    "--overwrite: deleted %s (%d files, %s); metrics.jsonl restarts from epoch 0",
                    self.workdir / "checkpoints",
                    len(sizes),
                    format_bytes(sum(sizes)),
                )
        if overwrite and self.mid_epoch_dir.exists():
            shutil.rmtree(self.mid_epoch_dir, ignore_errors=not self.main)
        self.metrics = MetricsLog(self.workdir, enabled=self.main)
        self.writer: ScalarWriter | None = None
        self.compile_sec = 0.0
        self.last: dict = {}
        self._said_input_bound = False
        self._epoch_start = 0.0
        self._input_wait = 0.0
        self._window: CaptureWindow | None = None
        self._running: int | None = None  # the epoch being trained, until its checkpoint is written
        self._step_in_epoch = self._trained_steps = 0
        self._saved = 0  # the newest checkpoint's epoch
        self._cursor_epoch, self.first_step, self._losses_before = None, 0, []  # a mid-epoch resume's data cursor
        self.stopped_at: tuple[int, int] | None = None  # (epoch, step) where a stop signal ended the steps
        signals.set_describe(self.where)

    def initial_weights(self, init_weights: str | None) -> dict[str, np.ndarray]:
        """Canonical weights to start from: the file ``init_weights`` or the contract's init from ``seed``."""
        cfg = self.cfg
        return unet_spec.load_weights(init_weights, cfg) if init_weights else unet_spec.init_weights(cfg, cfg.seed)

    def resume(self, checkpoints, mid_epoch: Callable[[], object] | None = None) -> tuple[int, object]:
        """Apply the resume rule to ``checkpoints`` (``epochs()`` newest last; ``restore(epoch)``) and
        return ``(start_epoch, restored)``: ``(0, None)`` for a fresh run, else the newest checkpoint
        that restores. A checkpoint that fails to restore (a damaged file) is skipped with a warning.
        A mid-epoch checkpoint (``mid_epoch()`` opens the checkpoints of :attr:`mid_epoch_dir`,
        numbered by global step) newer than every epoch checkpoint wins: the run resumes at its data
        cursor, :attr:`first_step` of the returned epoch.

        Raises:
            UserError: the folder holds checkpoints and neither ``--resume`` nor ``--overwrite`` was
                given; no checkpoint restores (the newest one's error, e.g. a config mismatch).
        """
        epochs = list(checkpoints.epochs())
        if self.resume_requested and mid_epoch is not None:
            cursor = self._mid_epoch_cursor(epochs[-1] if epochs else 0)
            if cursor is not None:
                try:
                    with mid_epoch() as mid:
                        restored = mid.restore(cursor["global_step"])  # TF restores in place: None
                except UserError as err:
                    log.warning("the mid-epoch checkpoint does not restore (%s); trying the epoch checkpoints", err)
                    cursor = None
            if cursor is not None:
                self._saved = cursor["epoch"]
                self._cursor_epoch, self.first_step = cursor["epoch"], cursor["step"]
                self._losses_before = list(cursor["losses"])
                log.info(
                    "resumed from %s at epoch %d, step %d of %d (a stop at a step boundary)",
                    self.mid_epoch_dir,
                    cursor["epoch"] + 1,
                    cursor["step"] + 1,
                    self.steps_per_epoch,
                )
                return cursor["epoch"], restored
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
            self._saved = epoch
            return epoch, restored
        raise first_error

    def _mid_epoch_cursor(self, newest_epoch: int) -> dict | None:
        """The data cursor of :attr:`mid_epoch_dir` (``epoch``, ``step``, ``global_step``, ``losses``)
        if it is newer than the epoch checkpoint ``newest_epoch`` and fits this run's epoch length."""
        path = self.mid_epoch_dir / "cursor.json"
        if not path.is_file():
            return None
        try:
            cursor = json.loads(path.read_text())
            epoch, step, n = int(cursor["epoch"]), int(cursor["step"]), int(cursor["steps_per_epoch"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("%s is unreadable (%s): resuming from the epoch checkpoints", path, err)
            return None
        if n != self.steps_per_epoch:
            log.warning(
                "%s was saved with %d steps per epoch, this run has %d (another global batch): resuming "
                "from the epoch checkpoints",
                path,
                n,
                self.steps_per_epoch,
            )
            return None
        return cursor if epoch * n + step > newest_epoch * n else None

    def losses_before(self, epoch: int) -> list:
        """The training losses of ``epoch``'s steps before the data cursor (a run resumed mid-epoch),
        else an empty list: the epoch's train loss is then the mean over all its steps."""
        return list(self._losses_before) if epoch == self._cursor_epoch else []

    def begin(self, start_epoch: int, compile_sec: float, versions: dict, val_loss: Callable[[], float]) -> None:
        """Record the invocation in ``run.json``, drop metrics after ``start_epoch`` and open TensorBoard;
        a fresh run writes its step-0 validation loss (``val_loss()``, one pass) there."""
        signals.reclaim()  # the steps are compiled and the input pipelines started (DALI's included)
        self.compile_sec = compile_sec
        self.last = {"epoch": start_epoch, "compile_sec": compile_sec}
        if not self.main:
            return
        with self.writing(self.metrics.path):
            self.metrics.truncate_after(start_epoch)
        with self.writing(self.workdir / "run.json"):
            self._record_invocation(start_epoch, versions)
        failed = log_file_error()
        if failed:  # out.log cannot be written: stop before the first step
            raise self.write_error(*failed)
        with self.writing(self.workdir / "tb"):
            self.writer = ScalarWriter(self.workdir / "tb", self.cfg.tensorboard)
        if start_epoch == 0 and self.writer._writer is not None:
            hparams = {"framework": self.framework, **config_dict(self.cfg), "global_batch": self.global_batch}
            self.writer.hparams(hparams, TENSORBOARD_TAGS)
            self.writer.scalars(0, {"Loss/valid": val_loss(), "Learning Rate": float(self.lr_table[0])})

    def _record_invocation(self, start_epoch: int, versions: dict) -> None:
        """Append this invocation, with its full config, to ``run.json``; a resume whose config differs
        from the last invocation's says what changed. A ``run.json`` that cannot be used (not JSON, not
        text, unreadable) is kept as ``run.json.damaged`` with a warning that says what is lost, and a
        new one starts from this invocation."""
        info, problem = run_info_and_problem(self.workdir)
        if problem:
            self._set_aside_damaged_run_info(problem, start_epoch)
        invocations = info.get("invocations", [])
        values = json.loads(json.dumps(config_dict(self.cfg)))  # as run.json holds them (lists, not tuples)
        if start_epoch and isinstance(info.get("config_values"), dict):
            base = json.loads(json.dumps(config_dict(config_mod.load_config("base"))))
            changes = recipe_changes(info.get("config"), info["config_values"], self.cfg.name, values, base)
            if changes:
                log.warning("this resume changes the run's recipe from epoch %d: %s", start_epoch, "; ".join(changes))
        invocations.append(
            {
                "command": " ".join(shlex.quote(a) for a in sys.argv),
                "cwd": os.getcwd(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "start_epoch": start_epoch,
                "host": platform.node(),
                "launch": launch.launch_info(os.environ),
                "python": platform.python_version(),
                "code": code_version(),
                "versions": versions,
                "config": self.cfg.name,
                "config_values": values,
            }
        )
        info.update(
            framework=self.framework,
            config=self.cfg.name,
            config_source=self.cfg.source,
            config_values=values,
            invocations=invocations,
        )
        write_atomic(self.workdir / "run.json", json.dumps(info, indent=1))

    def _set_aside_damaged_run_info(self, problem: str, start_epoch: int) -> None:
        """Keep a ``run.json`` that cannot be used as ``run.json.damaged`` (a file; anything else stays,
        and writing the new record then fails with its one line) and say what this run loses."""
        path = self.workdir / "run.json"
        kept = path.with_name("run.json.damaged")
        lost = "the record of the earlier invocations (commands, configs, versions) is not carried over"
        if start_epoch:
            lost += ", and this resume's config cannot be compared with the run's (no recipe-change check)"
        if path.is_file():
            os.replace(path, kept)
            log.warning("%s %s: kept as %s; a new run.json starts with this invocation: %s", path, problem, kept, lost)
        else:
            log.warning("%s %s: %s", path, problem, lost)

    @contextlib.contextmanager
    def profile(
        self,
        start_trace: Callable[[], object],
        stop_trace: Callable[[], object],
        use_cuda: bool,
        annotate: Callable[[str], contextlib.AbstractContextManager] | None = None,
    ):
        """The capture window of ``profile_steps`` (or of ``enable_manual_profiling``: the tutorial's
        first 60 steps of epoch 2) around the body: the framework's trace and the CUDA profiler API.
        Every NVTX range of the body also opens ``annotate(name)`` (the framework's trace annotation).
        Inside it a SIGTERM or Ctrl-C stops the run at the next step (or after the checkpoint being written)."""
        steps = self.cfg.profile_steps
        if steps is None and self.cfg.enable_manual_profiling:
            steps = (self.steps_per_epoch, self.steps_per_epoch + 60)
        self._window = CaptureWindow(steps, on_start=[start_trace], on_stop=[stop_trace], use_cuda=use_cuda)
        try:
            with mirrored_in(annotate), signals.deferred():  # SIGTERM and Ctrl-C stop the loop between steps
                yield
        finally:
            self._window.close()

    def trains(self, start_epoch: int, stop_after_epoch: int | None = None) -> bool:
        """Whether this invocation trains an epoch (a finished run resumed does not: its trainer
        compiles nothing)."""
        end = self.cfg.num_epochs if stop_after_epoch is None else min(stop_after_epoch, self.cfg.num_epochs)
        return end > start_epoch

    def epochs(self, start_epoch: int, stop_after_epoch: int | None = None) -> range:
        """The epochs this invocation trains (``stop_after_epoch`` ends it early, as a job's time limit);
        a resumed run that has trained all ``num_epochs``, or is past them, says so and where it is."""
        end = self.cfg.num_epochs if stop_after_epoch is None else min(stop_after_epoch, self.cfg.num_epochs)
        if start_epoch > self.cfg.num_epochs:
            log.info(
                "this run is at epoch %d, past num_epochs = %d: nothing to train (--set num_epochs=N, N > %d, "
                "continues it)",
                start_epoch,
                self.cfg.num_epochs,
                start_epoch,
            )
        elif start_epoch == self.cfg.num_epochs:
            log.info(
                "all %d epochs of this run are trained: nothing to do (--set num_epochs=N to continue it)",
                self.cfg.num_epochs,
            )
        return range(start_epoch, end)

    def steps(
        self,
        batches: Iterator,
        epoch: int,
        sync: Callable[[object], None] | None = None,
        agree: Callable[[bool], bool] | None = None,
    ) -> Iterator:
        """The training batches of ``epoch`` (from the data cursor in a run resumed mid-epoch), timed
        for the input wait; the progress bar and the capture window advance with them.

        Before each step every rank calls ``agree(stop)`` (True where any process's ``stop`` is True:
        a one-integer collective across processes, the flag itself in one process) with whether a stop signal arrived
        (:func:`shared_data.runtime.signals.stop_requested`), so all ranks end the epoch's steps at
        the same boundary; :attr:`stopped_at` then holds ``(epoch, step)`` and the trainer calls
        :meth:`preempt`.

        Without ``sync`` the host's wait for each batch (``data wait``) is the input time: right where
        every step runs to its end before the next starts (the CPU). With ``sync`` (a callable that
        returns once the given batch and all work dispatched before it are computed), the wait is
        measured on :data:`WAIT_SAMPLES` evenly spaced steps an epoch: the device is drained first,
        then the wait lasts until the batch is computed; the epoch's input time is their mean times
        the epoch's steps. Under asynchronous dispatch (a GPU) the host's plain wait in ``next`` also
        holds the time it is blocked behind queued steps, which is not input time.
        """
        self._epoch_start, self._input_wait = time.perf_counter(), 0.0
        self._running = epoch
        n = self.steps_per_epoch
        first = self.first_step if epoch == self._cursor_epoch else 0
        self._trained_steps = n - first  # this invocation's steps of the epoch (samples/s)
        stride = max(1, -(-n // WAIT_SAMPLES))  # ceil: at most WAIT_SAMPLES sampled steps
        sampled = range(stride // 2, n, stride) if sync is not None else range(n)
        with signals.stoppable():
            yield from self._steps(batches, epoch, first, sync, agree, sampled)

    def _steps(self, batches, epoch, first, sync, agree, sampled) -> Iterator:
        manual, n = self.cfg.enable_manual_profiling, self.steps_per_epoch
        waited, timed_steps = 0.0, 0
        said = time.perf_counter()
        for i in progress(range(first, n), n - first, f"epoch {epoch + 1}", self.cfg.progress_bar):
            if (
                i > first and time.perf_counter() - said >= PROGRESS_SEC and self.main
            ):  # slow steps: not minutes of silence
                log.info(
                    "epoch %d: step %d/%d, %.1f s per step",
                    epoch + 1,
                    i,
                    n,
                    (time.perf_counter() - self._epoch_start) / (i - first),
                )
                said = time.perf_counter()
            step = epoch * n + i
            self._step_in_epoch = i
            signals.raise_pending()
            stop = signals.stop_requested() is not None
            if agree is not None and agree(stop) and not stop:
                signals.request_stop(signals.signal.SIGUSR1)  # another rank's signal
                stop = True
            if stop:
                self.stopped_at = (epoch, i)
                return
            if self._window is not None:
                self._window.before_step(step)
            timed = i in sampled
            with nvtx_range(f"step {step}", "purple") if manual else contextlib.nullcontext():
                if timed and sync is not None:
                    sync(None)
                t0 = time.perf_counter()
                with nvtx_range("data wait", "yellow"), signals.signal_first():
                    batch = next(batches)
                    if timed and sync is not None:
                        sync(batch)
                if timed:
                    waited, timed_steps = waited + time.perf_counter() - t0, timed_steps + 1
                    self._input_wait = waited * (n - first) / timed_steps  # every step timed without sync: = waited
                yield batch

    def preempt(self, save: Callable[[int], None], losses: Callable[[], Sequence[float]]) -> None:
        """Save at :attr:`stopped_at` and stop: ``save(global_step)`` writes the state as the
        checkpoint of that global step in :attr:`mid_epoch_dir` (every rank calls it), then the main
        process writes the data cursor (``cursor.json``: epoch, step, global step, steps per epoch,
        the epoch's ``losses()`` so far) and asks SLURM to requeue the job (:func:`requeue_job`).

        Raises:
            Interrupted: always, after the save, naming the step and the signal (exit 128 + signal).
        """
        epoch, step = self.stopped_at
        signum = signals.stop_requested() or signals.signal.SIGUSR1
        global_step = epoch * self.steps_per_epoch + step
        with signals.deferred():
            with self.save_memory(f"the state at epoch {epoch + 1}, step {step + 1}"):
                save(global_step)
            if self.main:
                cursor = dict(
                    epoch=epoch,
                    step=step,
                    global_step=global_step,
                    steps_per_epoch=self.steps_per_epoch,
                    losses=[float(x) for x in losses()],
                )
                with self.writing(self.mid_epoch_dir / "cursor.json"):
                    write_atomic(self.mid_epoch_dir / "cursor.json", json.dumps(cursor) + "\n")
        then = what_resumes(self.main, requeue_job() if self.main else False)
        raise signals.Interrupted(
            signum,
            f"at epoch {epoch + 1}, step {step + 1} of {self.steps_per_epoch}: saved in {self.mid_epoch_dir}; {then}",
        )

    @contextlib.contextmanager
    def saving(self, epoch: int):
        """Around the checkpoint save of ``epoch``: a SIGTERM or Ctrl-C waits until it is written, then
        stops; memory that is short for it is one line (:meth:`save_memory`). The save's seconds (its
        write and checksums) are logged after the epoch's lines."""
        t0 = time.perf_counter()
        with signals.deferred(), self.save_memory(f"the checkpoint of epoch {epoch}"):
            yield
            self._saved, self._running = epoch, None
            if self.main:
                log.info(checkpoint_line(time.perf_counter() - t0))
                if self.mid_epoch_dir.exists():  # an epoch checkpoint supersedes a mid-epoch one
                    shutil.rmtree(self.mid_epoch_dir, ignore_errors=True)
        signals.raise_pending()

    @contextlib.contextmanager
    def save_memory(self, what: str):
        """Around the save of ``what`` (a checkpoint): refuse it before it starts where the process's
        ``ulimit -v`` leaves less address space than it needs (:func:`save_memory_needed`; orbax's
        threads would hang or TensorFlow abort), and turn memory that runs out inside it
        (:func:`shared_data.core.errors.out_of_memory`) into one line with the checkpoint kept.

        Raises:
            UserError: what could not be allocated, the limit, and the checkpoint kept.
        """
        kept = self._kept()
        if not self._arenas_capped and cap_malloc_arenas():  # a limit set while the run went on (prlimit)
            self._arenas_capped = True
            log.info("%s from this save on", _ARENAS_CAPPED)
        left, need = memory.address_space_left(), save_memory_needed(self.cfg)
        if left is not None and left < need:
            raise UserError(
                f"cannot save {what}: it needs about {format_bytes(need)} more memory and this process may map "
                f"{format_bytes(max(left, 0))} more (ulimit -v {format_bytes(address_space_limit())}); {kept}"
            )
        try:
            yield
        except Exception as err:
            message = out_of_memory(err)
            if message is None:
                raise
            raise UserError(f"cannot save {what}, {message}; {kept}") from None

    def _kept(self) -> str:
        """Which checkpoint ``--resume`` continues from, for the line of a failed save or write."""
        if self._saved:
            return f"the checkpoint of epoch {self._saved} is kept and --resume continues from it"
        return "no epoch is checkpointed, so the run starts again from scratch"

    @contextlib.contextmanager
    def writing(self, path: Path):
        """Turn an ``OSError`` of a record's write (a full disk) into :meth:`write_error`."""
        try:
            yield
        except OSError as err:
            raise self.write_error(path, err) from None

    def write_error(self, path: Path, err: OSError) -> UserError:
        """The one line for a run record (``out.log``, ``metrics.jsonl``, ``run.json``) that cannot be
        written: the file, the reason, the epoch not checkpointed and the checkpoint kept."""
        reason = err.strerror or " ".join(str(err).split())[:200]
        lost = f": epoch {self._running + 1} is not checkpointed" if self._running is not None else ""
        return UserError(f"cannot write {path} ({reason}){lost}; {self._kept()}")

    def where(self) -> str:
        """Where a stopped run stands, for the line of a signal (:mod:`shared_data.runtime.signals`):
        which epoch is abandoned and which checkpoint ``--resume`` continues from."""
        kept = (
            f"the checkpoint of epoch {self._saved} is kept and --resume continues from it"
            if self._saved
            else "no epoch is checkpointed yet, so the run starts again from scratch"
        )
        if self._running is None:
            return f"between epochs: nothing is lost; {kept}"
        return (
            f"during epoch {self._running + 1} (step {self._step_in_epoch + 1} of {self.steps_per_epoch}): "
            f"that epoch is abandoned; {kept}"
        )

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
            UserError: ``metrics.jsonl`` or ``out.log`` cannot be written (a full disk:
                :meth:`write_error`); a non-finite training loss (without fp16 loss scaling, which skips such steps);
                the message names the file and crop when the step's batch is the cause
                (:func:`batch_problem`).
        """
        seconds = time.perf_counter() - self._epoch_start
        losses = np.asarray(train_losses, np.float64)
        cfg, steps = self.cfg, self.steps_per_epoch
        if not np.isfinite(losses).all() and cfg.precision != "float16":
            bad = int(np.argmax(~np.isfinite(losses)))
            where = f"training diverged: loss is {losses[bad]} at step {epoch * steps + bad} of config {cfg.name!r}"
            cause = batch_problem(cfg, epoch, bad, self.global_batch // self.local_batch)
            if cause:
                raise UserError(f"{where} because of its data: {cause}")
            checked = "; its crops are finite and within range, so" if cause is not None else ";"
            raise UserError(f"{where}{checked} lower start_lr or enable loss scaling")
        t0 = time.perf_counter()
        with signals.signal_first():
            val_loss = float(evaluate())
        val_seconds = time.perf_counter() - t0
        train_loss = float(np.mean(losses[np.isfinite(losses)])) if np.isfinite(losses).any() else float("nan")
        input_share = min(self._input_wait / seconds, 1.0)
        samples = (self._trained_steps or steps) * self.global_batch
        for line in epoch_lines(epoch + 1, seconds, samples, train_loss, val_loss, val_seconds):
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
            samples_per_sec=samples / seconds,
            epoch_sec=seconds,
            val_sec=val_seconds,
            compile_sec=self.compile_sec,
            input_wait_share=input_share,
        )
        if loss_scale is not None:
            self.last["loss_scale"] = float(loss_scale)
        failed = log_file_error()
        if failed:
            raise self.write_error(*failed)
        with self.writing(self.metrics.path):
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
        if self.writer is not None:
            self.writer.close()
        close_log_file()
        if self._lock is not None:
            run_lock.release(self._lock)
        return dict(self.last)


#: The largest density value x whose exp(density_scale x) (the ``lambda_rho`` loss term) float32
#: holds, times density_scale: ln(3.4028235e38).
LOG_FLOAT32_MAX = float(np.log(np.finfo(np.float32).max))


def batch_problem(cfg: Config, epoch: int, step: int, replicas: int) -> str | None:
    """Why the training batch of ``step`` (0-based, in ``epoch``; every replica's crops) makes the
    loss non-finite, if its data does: each crop is read again from the training file (the crops
    every loader reads, :func:`shared_data.data.host_batches.make_plan`) and checked for NaN, inf and
    values beyond :data:`shared_data.data.dataset.MAX_ABS_VALUE`, and, with ``lambda_rho``, for a
    target density whose exp(``density_scale`` x) overflows float32.

    Returns:
        the file, crop and value at fault; ``""`` when the crops are fine; None when the loader
        reads no file (``synthetic``).
    """
    if not loader_kinds.loader_kind(cfg).uses_files:
        return None
    from shared_data.core.errors import DatasetError
    from shared_data.data import crop_readers, host_batches

    s = cfg.crop_size
    reader = crop_readers.H5LowMemReader(cfg.data_file("train"), cfg.N_in_channels, cfg.N_out_channels, s)
    plan = host_batches.make_plan(cfg, host_batches.TRAIN, epoch, range(replicas), replicas, reader.size)
    buf_in = np.empty((cfg.N_in_channels, s, s, s), np.float32)
    buf_tar = np.empty((cfg.N_out_channels, s, s, s), np.float32)
    limit = LOG_FLOAT32_MAX / cfg.density_scale
    for start in plan.draws[step].starts:
        try:
            reader.read(start, buf_in, buf_tar)
        except DatasetError as err:
            return str(err)
        density = buf_tar[cfg.density_channel]
        if cfg.lambda_rho and density.max() > limit:
            i = tuple(np.argwhere(density > limit)[0])
            x, y, z = (int(a) + int(b) for a, b in zip(i, start))
            return (
                f"{reader.path}: Hydro channel {cfg.density_channel} (density) holds {density[i]:.6g} at voxel "
                f"({x}, {y}, {z}), beyond {limit:.4g}, where exp({cfg.density_scale:g} x) of the lambda_rho "
                "loss term overflows float32"
            )
    return ""


def recipe_changes(old_name, old: dict, new_name: str, new: dict, kit_base: dict | None = None) -> list[str]:
    """``key: old -> new`` for each config value (and the config name) that differs between two
    invocations of a run, in key order. A key the old values lack (one the kit added after that run
    was written) whose new value is its value in ``kit_base`` (the kit's ``base`` section, which keeps
    what the code did before the key existed) is no change."""
    changes = [f"config {old_name!r} -> {new_name!r}"] if old_name != new_name else []
    kit_base = kit_base or {}
    for key in sorted(set(old) | set(new)):
        if key not in old and key in kit_base and new.get(key) == kit_base[key]:
            continue
        if old.get(key) != new.get(key):
            changes.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return changes


def log_setup(cfg: Config, settings: dict, replicas: int) -> tuple[int, int]:
    """Log a run's framework settings (``configure_xla``'s), precision policy, data-parallel layout,
    input and paths, the same lines in TF and JAX; return ``(global, local)`` batch sizes (raises the
    :func:`shared_data.core.config.batch_sizes` error when the batch does not divide over ``replicas``)."""
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
    if loader_kinds.loader_kind(cfg).uses_files:
        log.info("data: %s, %s", cfg.data_file("train"), cfg.data_file("val"))
    return global_bs, local_bs


def remove_partial_saves(directory: Path, patterns: Sequence[str], say: bool = True) -> None:
    """Delete what a killed or failed checkpoint save left in ``directory`` (files or folders matching
    ``patterns``), each said in a line unless ``say`` is False (the save's own error says it)."""
    if not directory.is_dir():
        return
    for pattern in patterns:
        for path in directory.glob(pattern):
            if say:
                log.info("removing %s, left by an unfinished checkpoint save", path)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def checkpoint_restore_memory_error(where: str, err: BaseException) -> UserError | None:
    """The one-line error for a restore of the checkpoint ``where`` that ran out of memory (``err`` or
    an exception in its chain: :func:`shared_data.core.errors.out_of_memory_in`): its files matched
    their checksums, so it is not called damaged. None for other errors."""
    message = out_of_memory_in(err)
    if message is None:
        return None
    return UserError(f"cannot restore {where} (its files match their checksums), {message}")


def checkpoint_write_error(directory: Path, epoch: int, reason: str, kept: Sequence[int]) -> UserError:
    """The one-line error for a failed checkpoint save of ``epoch``, saying which checkpoint is kept."""
    older = [e for e in kept if e < epoch]
    then = f"the checkpoint of epoch {older[-1]} is kept and --resume continues from it" if older else "none is kept"
    return UserError(f"cannot write the checkpoint of epoch {epoch} in {directory} ({reason}); {then}")


def save_final_weights(path: str | None, weights: Callable[[], dict], main_process: bool) -> None:
    """Write ``weights()`` (canonical arrays) to ``path`` (atomic) on the main process, if a path is given."""
    if path and main_process:
        with writing(path):
            unet_spec.save_weights(path, weights())
        log.info("wrote %s", path)


def what_resumes(main: bool, requeued: bool, env=None) -> str:
    """The end of a process's stop line after a step-boundary save: what continues the run. Process 0
    knows whether it requeued the SLURM job (``requeued``, :func:`requeue_job`); another process of a
    SLURM job (``SLURM_JOB_ID`` in ``env``, default ``os.environ``) does not, and says who decides."""
    if requeued:
        return "the job is requeued and resumes there"
    if not main and (os.environ if env is None else env).get("SLURM_JOB_ID"):
        return "process 0 requeues the job where SLURM allows it (sbatch --requeue), else --resume continues from there"
    return "--resume continues from there"


def requeue_job(env=None) -> bool:
    """Requeue this SLURM job (``scontrol requeue $SLURM_JOB_ID``) where it runs under SLURM and allows
    it (``scontrol show job`` says ``Requeue=1``: ``sbatch --requeue`` or the cluster's default);
    the requeued job (``SLURM_RESTART_COUNT`` set) resumes by itself
    (:func:`shared_data.runtime.cli.resume_requested`). Returns whether the job was requeued; a
    refusal is logged, never raised (the checkpoint is written already)."""
    import subprocess

    job = (os.environ if env is None else env).get("SLURM_JOB_ID")
    if not job:
        return False
    try:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=60)
        if shown.returncode:
            log.warning("scontrol show job %s failed: %s: not requeued", job, shown.stderr.strip()[:200])
            return False
        if "Requeue=1" not in shown.stdout:
            log.info("SLURM job %s does not allow requeue (sbatch --requeue): not requeued", job)
            return False
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("scontrol requeue %s failed (%s): not requeued", job, err)
        return False
    if done.returncode and "pending execution" in done.stderr:  # requeued already (scontrol requeue from outside)
        log.info("SLURM job %s is requeued already: it resumes from this step", job)
        return True
    if done.returncode:
        log.warning("scontrol requeue %s failed: %s", job, (done.stderr or done.stdout).strip()[:200])
        return False
    log.info("SLURM job %s requeued: it resumes from this step", job)
    return True
