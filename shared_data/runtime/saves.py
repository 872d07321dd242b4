"""Checkpoint saves as the run sees them, identical for TF and JAX: a save is complete or absent, a
SIGTERM or Ctrl-C during it waits until it is written, memory too short for it is one line naming the
checkpoint kept, and a save that fails says which checkpoint ``--resume`` continues from.

The trainer wraps each epoch's save in :func:`saving` and a stop's mid-epoch save in
:func:`save_memory`; both frameworks' ``checkpoints`` modules word their errors with
:func:`checkpoint_write_error` and :func:`checkpoint_restore_memory_error` and clear what a killed
save left with :func:`remove_partial_saves`.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from shared_data.core.errors import UserError, address_space_limit, cap_malloc_arenas, out_of_memory, out_of_memory_in
from shared_data.core.files import writing
from shared_data.model import unet_spec
from shared_data.runtime import memory, signals
from shared_data.runtime.checks import save_memory_needed
from shared_data.runtime.logs import checkpoint_line
from shared_data.runtime.memory import format_bytes
from shared_data.runtime.run_folder import ARENAS_CAPPED, RunFolder

log = logging.getLogger("dlas")


@contextlib.contextmanager
def saving(folder: RunFolder, epoch: int):
    """Around the checkpoint save of ``epoch`` (epochs done): a SIGTERM or Ctrl-C waits until it is
    written, then stops; memory that is short for it is one line (:func:`save_memory`). The save's
    seconds (its write and checksums) are logged after the epoch's lines; the run's position then
    holds the new checkpoint, and a stop's mid-epoch save, which it supersedes, is removed."""
    t0 = time.perf_counter()
    with signals.deferred(), save_memory(folder, f"the checkpoint of epoch {epoch}"):
        yield
        folder.position.saved(epoch)
        if folder.main:
            log.info(checkpoint_line(time.perf_counter() - t0))
            if folder.mid_epoch_dir.exists():  # an epoch checkpoint supersedes a mid-epoch one
                shutil.rmtree(folder.mid_epoch_dir, ignore_errors=True)
    signals.raise_pending()


@contextlib.contextmanager
def save_memory(folder: RunFolder, what: str):
    """Around the save of ``what`` (a checkpoint): refuse it before it starts where the process's
    ``ulimit -v`` leaves less address space than it needs
    (:func:`shared_data.runtime.checks.save_memory_needed`; orbax's threads would hang or TensorFlow
    abort), and turn memory that runs out inside it (:func:`shared_data.core.errors.out_of_memory`)
    into one line with the checkpoint kept.

    Raises:
        UserError: what could not be allocated, the limit, and the checkpoint kept.
    """
    kept = folder.position.kept()
    if not folder.arenas_capped and cap_malloc_arenas():  # a limit set while the run went on (prlimit)
        folder.arenas_capped = True
        log.info("%s from this save on", ARENAS_CAPPED)
    left, need = memory.address_space_left(), save_memory_needed(folder.cfg)
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


def save_final_weights(path: str | Path, weights: dict, main_process: bool) -> None:
    """Write ``weights`` (canonical arrays, ``--save_weights``) to ``path`` (atomic) on the main process."""
    if main_process:
        with writing(path):
            unet_spec.save_weights(path, weights)
        log.info("wrote %s", path)
