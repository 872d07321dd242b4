"""Checkpoint saves as the run sees them, identical for TF and JAX: a save is complete or absent, a
SIGTERM or Ctrl-C during it waits until it is written, memory too short for it is one line naming the
checkpoint kept, and a save that fails says which checkpoint ``--resume`` continues from.

An epoch's save is asynchronous: only the copy of the state to the host is on the training path; the
write, its checksums and the removal of old checkpoints run on a background thread while the next epoch
trains (:class:`InFlight`, at most one save in flight). The trainer wraps each epoch's save in
:func:`saving`, which first waits for the previous save (:func:`written`), and waits for the last one
before the run ends; a stop's mid-epoch save waits for its write at once. Both frameworks'
``checkpoints`` modules word their errors with :func:`checkpoint_write_error` and
:func:`checkpoint_restore_memory_error` and clear what a killed save left with
:func:`remove_partial_saves`.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from shared_data.core.errors import UserError, address_space_limit, cap_malloc_arenas, out_of_memory, out_of_memory_in
from shared_data.core.files import writing
from shared_data.model import unet_spec
from shared_data.runtime import memory, signals
from shared_data.runtime.checks import save_memory_needed
from shared_data.runtime.logs import checkpoint_line
from shared_data.runtime.memory import format_bytes
from shared_data.runtime.position import Position
from shared_data.runtime.run_folder import ARENAS_CAPPED, RunFolder

log = logging.getLogger("dlas")


@contextlib.contextmanager
def saving(folder: RunFolder, epoch: int, ckpt):
    """Around the start of the checkpoint save of ``epoch`` (epochs done) in ``ckpt`` (a framework's
    ``Checkpoints``): the previous epoch's save is waited for first (:func:`written`, which raises
    its failure), a SIGTERM or Ctrl-C waits until the state is copied to the host and the write has
    started, then stops (the run's exit waits for the write); memory that is short for it is one line
    (:func:`save_memory`). The seconds on the training path (the copy to the host) are logged after
    the epoch's lines; the write goes on in the background."""
    with signals.deferred(), save_memory(folder, f"the checkpoint of epoch {epoch}"):
        written(folder, ckpt)
        t0 = time.perf_counter()
        yield
        folder.position.saved(epoch)
        if folder.main:
            log.info(checkpoint_line(time.perf_counter() - t0))
    signals.raise_pending()


def written(folder: RunFolder, ckpt) -> None:
    """Wait for the save in flight of ``ckpt`` (a framework's ``Checkpoints``), if any; once it is
    complete, log the seconds its write took in the background, and remove a stop's mid-epoch save,
    which an epoch checkpoint supersedes. The trainer calls it before the run ends; :func:`saving`
    before each save.

    Raises:
        UserError: the save failed (:func:`checkpoint_write_error`: the checkpoint kept)."""
    done = ckpt.wait()
    if done is None or not folder.main:
        return
    epoch, seconds = done
    log.info("checkpoint of epoch %d written in the background in %.2f s", epoch, seconds)
    if folder.mid_epoch_dir.exists():
        shutil.rmtree(folder.mid_epoch_dir, ignore_errors=True)


def wait_at_close(ckpt) -> None:
    """At the close of ``ckpt`` (a framework's ``Checkpoints``): wait for its save in flight. A failed
    save is raised where the run ends normally, and in place of a user error that stops the run while
    the save is in flight (a full disk fails the background write first, then the records written
    after it: the save is the cause; that error's line is logged). Where another exception is
    propagating (a stop signal, a bug) the failure's line is logged and that exception goes on.

    Raises:
        UserError: the save failed and nothing, or only a user error, is propagating."""
    propagating = sys.exc_info()[1]
    try:
        ckpt.wait()
    except UserError as err:
        if propagating is None:
            raise
        if isinstance(propagating, UserError):
            log.error("%s", propagating)
            raise err from None
        log.error("%s", err)


#: Seconds the save in flight is given to finish once another process of the run is lost
#: (:func:`leave_after_loss`).
LOSS_WAIT_S = 2.0


def leave_after_loss(in_flight: InFlight, epochs: Callable[[], list[int]], position: Position | None) -> None:
    """At the exit of a framework's ``Checkpoints`` after another process of the run was lost: give its
    save in flight (``in_flight``) :data:`LOSS_WAIT_S` to finish, then leave it. A save finishes only
    where the lost process passed the writers' last barrier; one that does not is left an unfinished
    temporary folder, which no resume lists and the next run's start removes, and ``position`` (the
    run's) then names the newest finished checkpoint (of ``epochs()``, the checkpoints' own list), which
    ``--resume`` continues from."""
    epoch = in_flight.unfinished(LOSS_WAIT_S)
    if epoch is not None and position is not None:
        finished = [e for e in epochs() if e < epoch]
        position.save_abandoned(max(finished, default=0))


class InFlight:
    """The one checkpoint save in flight of a ``Checkpoints``: :meth:`start` runs what completes it (the
    framework's wait for its writer, the checksums, the removal of old checkpoints) on a background
    thread; :meth:`wait` joins it. A save is started only after the previous one is joined, so at
    most one is written at a time.

    Args:
        name: the thread's name prefix (the checkpoint folder's kind, for a traceback or a profile).
    """

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._future: Future | None = None
        self._epoch = 0

    def start(self, epoch: int, complete: Callable[[], None]) -> None:
        """Run ``complete`` (which raises the save's failure) in the background for the save of
        ``epoch``; the previous save must be joined (:meth:`wait`) first.

        Raises:
            RuntimeError: a save is still in flight (a programming error)."""
        if self._future is not None:
            raise RuntimeError(f"the checkpoint of epoch {self._epoch} is still in flight")
        t0 = time.perf_counter()

        def timed() -> float:
            complete()
            return time.perf_counter() - t0

        self._epoch, self._future = epoch, self._pool.submit(timed)

    def wait(self) -> tuple[int, float] | None:
        """Block until the save in flight is complete; its epoch and its seconds from start to complete,
        or None where none was started since the last wait. Raises what ``complete`` raised."""
        if self._future is None:
            return None
        future = self._future
        try:
            seconds = future.result()
        finally:
            if future.done():  # a wait cut short (a lost process: jax_impl.cluster) leaves it in flight
                self._future = None
        return self._epoch, seconds

    def unfinished(self, timeout: float) -> int | None:
        """The epoch of the save in flight if it is not complete within ``timeout`` seconds (it is then
        left running), else None (none in flight, or it ended: a failure is not raised)."""
        if self._future is None:
            return None
        try:
            self._future.result(timeout)
        except TimeoutError:
            return self._epoch
        except Exception:  # its failure is not this exit's cause
            pass
        self._future = None
        return None

    def close(self) -> None:
        """Stop the background thread (after :meth:`wait`)."""
        self._pool.shutdown(wait=True)


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
