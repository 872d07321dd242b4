"""The run folder of a training run, identical for TF and JAX: made and locked, ``out.log`` opened, the
set-up log lines written, ``--overwrite`` applied, and the numbers every part of the run shares (batch
sizes, steps per epoch, the LR table).

:class:`RunFolder` is the first thing a trainer opens (after its framework's XLA settings and devices)
and the last it closes. The guards it runs before touching the folder are
:mod:`shared_data.runtime.checks`; where the run stands is :mod:`shared_data.runtime.position`.
Only the main process (process 0) locks the folder and writes files; the others log warnings and
errors with a rank tag.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from shared_data.core import config as config_mod
from shared_data.core import loader_kinds
from shared_data.core.config import Config, batch_sizes
from shared_data.core.errors import UserError, cap_malloc_arenas
from shared_data.model import schedule
from shared_data.runtime import checks, sizing
from shared_data.runtime import lock as run_lock
from shared_data.runtime.logs import close_log_file, log_to_file
from shared_data.runtime.memory import format_bytes
from shared_data.runtime.position import Position

log = logging.getLogger("dlas")

ARENAS_CAPPED = "ulimit -v: glibc malloc arenas capped at 2 (M_ARENA_MAX)"


def workdir_for(cfg: Config, framework: str, workdir: str | None = None, run_num: str | None = None) -> Path:
    """The run folder: ``workdir`` if given, else ``<exp_dir>/<config>[/<run_num>]/<framework>``
    (``exp_dir`` relative to the current folder, as every relative run path)."""
    if workdir:
        return Path(workdir)
    root = cfg.resolve_path(cfg.exp_dir) / cfg.name
    return (root / run_num if run_num else root) / framework


class RunFolder:
    """One training run's folder, opened: the guards passed, the folder made and locked, ``out.log``
    receiving every log line, the set-up lines logged, ``--overwrite``'s deletions done.

    Args:
        cfg: the frozen config.
        workdir: the run folder (created).
        framework: ``"tf"`` or ``"jax"``.
        banner: the framework, its version and backend (the first log line).
        settings: what the framework's ``configure_xla`` set (logged).
        replicas: data-parallel replicas.
        process_index: this process's rank; process 0 alone locks the folder and writes files.
        overwrite: the ``--overwrite`` flag: the checkpoints (and a stop's mid-epoch save) are deleted.

    Attributes: ``cfg``, ``workdir``, ``framework``, ``main`` (process 0), ``started`` (the run's
    clock, ``time.perf_counter()``: time to quality counts from here), ``global_batch``,
    ``local_batch``, ``steps_per_epoch``, ``lr_table``, ``mid_epoch_dir`` (a stop's save),
    ``position`` (:class:`~shared_data.runtime.position.Position`).

    Raises:
        UserError: another trainer holds the folder (:mod:`shared_data.runtime.lock`), bad data or too
            little memory (before ``--overwrite`` deletes anything: :mod:`shared_data.runtime.checks`),
            a batch that does not divide over the replicas, an ``out.log`` that cannot be written.
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
        overwrite: bool = False,
    ):
        self.started = time.perf_counter()
        self.cfg, self.workdir, self.framework = cfg, Path(workdir), framework
        self.main = process_index == 0
        checks.check_data_files(cfg)  # a missing file stops the run before its folder exists
        checks.check_train_memory(cfg, framework)  # before compiling: a framework may abort natively there
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._lock = run_lock.acquire(self.workdir) if self.main else None  # before anything is written
        try:
            log_to_file(self.workdir / "out.log", process_index)
        except OSError as err:  # a read-only out.log (or folder) of an earlier run
            raise UserError(f"cannot write {self.workdir / 'out.log'} ({err.strerror}): nothing is trained") from None
        if self.main and cfg.tensorboard:
            checks.check_tensorboard_folder(self.workdir / "tb")
        log.info("%s; config %r from %s", banner, cfg.name, cfg.source)
        log.info("run folder: %s", self.workdir.absolute())
        self.arenas_capped = cap_malloc_arenas()  # by the framework's import, under a ulimit -v
        if self.arenas_capped:
            log.info("%s, so threads reserve no address space unused", ARENAS_CAPPED)
        self.global_batch, self.local_batch = log_setup(cfg, settings, replicas)
        self.steps_per_epoch = config_mod.steps_per_epoch(cfg, replicas)
        sizing.validation_steps(cfg, replicas)  # said before the crops are planned and the steps compiled
        self.lr_table = schedule.lr_table(cfg, self.global_batch, self.steps_per_epoch * cfg.num_epochs)
        checks.check_data(cfg)  # bad data must fail before --overwrite clears anything
        self.mid_epoch_dir = self.workdir / "mid_epoch"  # the checkpoint of a stop at a step boundary
        if overwrite:
            self._overwrite()
        self.position = Position(self.steps_per_epoch)

    def _overwrite(self) -> None:
        """``--overwrite``: delete the checkpoints (said with their size) and a stop's mid-epoch save."""
        checkpoints = self.workdir / "checkpoints"
        if checkpoints.exists():
            sizes = [f.stat().st_size for f in checkpoints.rglob("*") if f.is_file()]
            shutil.rmtree(checkpoints, ignore_errors=not self.main)
            if self.main:
                log.info(
                    "--overwrite: deleted %s (%d files, %s); metrics.jsonl restarts from epoch 0",
                    checkpoints,
                    len(sizes),
                    format_bytes(sum(sizes)),
                )
        if self.mid_epoch_dir.exists():
            shutil.rmtree(self.mid_epoch_dir, ignore_errors=not self.main)

    def trains(self, start_epoch: int, stop_after_epoch: int | None = None) -> bool:
        """Whether this invocation trains an epoch (a finished run resumed does not: its trainer
        compiles nothing)."""
        return self._end(stop_after_epoch) > start_epoch

    def _end(self, stop_after_epoch: int | None) -> int:
        n = self.cfg.num_epochs
        return n if stop_after_epoch is None else min(stop_after_epoch, n)

    def epochs(self, start_epoch: int, stop_after_epoch: int | None = None) -> range:
        """The epochs this invocation trains (``stop_after_epoch`` ends it early, as a job's time limit);
        a resumed run that has trained all ``num_epochs``, or is past them, says so and where it is."""
        n = self.cfg.num_epochs
        if start_epoch > n:
            log.info(
                "this run is at epoch %d, past num_epochs = %d: nothing to train (--set num_epochs=N, N > %d, "
                "continues it)",
                start_epoch,
                n,
                start_epoch,
            )
        elif start_epoch == n:
            log.info("all %d epochs of this run are trained: nothing to do (--set num_epochs=N to continue it)", n)
        return range(start_epoch, self._end(stop_after_epoch))

    def close(self) -> None:
        """Close ``out.log`` and release the folder's lock (the end of a run that finished)."""
        close_log_file()
        if self._lock is not None:
            run_lock.release(self._lock)
            self._lock = None


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
