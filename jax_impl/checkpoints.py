"""Checkpoints of the train state, one per epoch: the counterpart of :mod:`tf_impl.checkpoints`.

The run's resume rule (:func:`shared_data.runtime.resume.resume`) calls :meth:`Checkpoints.epochs`
and :meth:`Checkpoints.restore`; the trainer calls :meth:`Checkpoints.save` after each epoch, inside
:func:`shared_data.runtime.saves.saving`, which joins the previous save (:meth:`Checkpoints.wait`);
inference calls :meth:`Checkpoints.restore_params`.

JAX: orbax's asynchronous ``CheckpointManager`` (its save returns once the arrays are on the host),
and the reports orbax and TensorStore make of a failed write (a full disk), kept to the run's one
line.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import jax

from shared_data.core.errors import EXIT_AFTER_ATEXIT, UserError
from shared_data.core.files import write_failure
from shared_data.runtime import checksums, saves

from jax_impl import checkpoint_quirks as quirks
from jax_impl import distribute


class Checkpoints:
    """Checkpoints of the train state, one per epoch (numbered by the epochs done), written atomically: a
    save cut by a crash is never listed, and what a killed save left is removed at start. ``state`` is a
    train state of this config, the template a checkpoint restores into; without it only
    :meth:`restore_params` restores. ``read_only`` (inference) creates and removes nothing, so a run that
    is saving meanwhile is left alone. ``position`` (the run's :class:`~shared_data.runtime.position.Position`)
    is told the newest finished checkpoint where the loss of another process of the run leaves the save in
    flight unfinished (:func:`shared_data.runtime.saves.leave_after_loss`).

    JAX: orbax's ``CheckpointManager``, which renames a finished temporary folder after a barrier of all
    processes (a lost process holds it until JAX's heartbeat time-out aborts the others); the state's
    arrays' shapes, dtypes and shardings are the restore template."""

    def __init__(self, directory: Path, keep: int, state=None, read_only: bool = False, position=None):
        import orbax.checkpoint as ocp

        self._ocp, self.directory, self._position = ocp, directory, position
        self._like = None if state is None else distribute.abstract(state)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=not read_only, cleanup_tmp_directories=not read_only, read_only=read_only
        )
        self._quiet, self._failed, self._hooks = quirks.OrbaxWriteFailures(), False, None
        self._in_flight = saves.InFlight(f"save-{directory.name}")
        for name in quirks.OrbaxWriteFailures.LOGGERS:
            logging.getLogger(name).addFilter(self._quiet)
        self.manager = ocp.CheckpointManager(
            directory.absolute(), item_handlers=ocp.StandardCheckpointHandler(), options=options
        )

    def close(self) -> None:
        """Wait for the save in flight and the checkpointer's background work, and stop them; a run that
        ends early (an error, a signal) does this before the interpreter shuts down, so no exit skips
        the wait. A failed save is raised here unless another exception is propagating, which the
        failure's line is then logged beside.

        JAX: orbax's thread otherwise prints "cannot schedule new futures after interpreter shutdown". After a
        failed save, what its writes left is removed once they have stopped."""
        try:
            saves.wait_at_close(self)  # raises a failed save's line, which the manager's close must not hide
        finally:
            self._stop()

    def _stop(self) -> None:
        try:
            self.manager.close()
        except Exception as err:  # a save that failed (a full disk) is reported already
            if write_failure(err) is None:
                raise
        finally:
            self._in_flight.close()
            if self._failed:  # TensorStore's writes still under way at the save's removal may have left a folder
                quirks.remove_late_partial_saves(self.directory)
            else:  # after a failed save, asyncio reports orbax's unread futures until they are freed
                for name in quirks.OrbaxWriteFailures.LOGGERS:
                    logging.getLogger(name).removeFilter(self._quiet)

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and distribute.lost_peer(exc) is not None:
            saves.leave_after_loss(self._in_flight, self.epochs, self._position)
            return
        self.close()

    def epochs(self) -> list[int]:
        """The epochs with a finished checkpoint, oldest first."""
        return sorted(self.manager.all_steps())

    def save(self, epoch: int, state) -> None:
        """Start writing the train state as the checkpoint of ``epoch``; return once it is copied to the
        host, the write, its checksums (:mod:`shared_data.runtime.checksums`) and the removal of old
        checkpoints going on in the background until :meth:`wait`. A save that fails (a full disk)
        leaves no partial file and raises, here or at :meth:`wait`, the line of
        :func:`shared_data.runtime.saves.checkpoint_write_error`. The previous save is joined first.

        JAX: ``state`` is copied to the host before this returns, so the step may donate its buffers."""
        self.wait()
        self._hooks = quirks.ClosedLoopQuiet().__enter__()  # from the start: see there
        try:
            self.manager.save(epoch, args=self._ocp.args.StandardSave(state))
        except Exception as err:  # orbax wraps the OSError of a full disk, or tensorstore's error
            self._write_failed(epoch, err)
        self._in_flight.start(epoch, functools.partial(self._complete, epoch))

    def wait(self) -> tuple[int, float] | None:
        """Block until the save in flight is complete: its epoch and the seconds from its start, or None
        where none is in flight.

        Raises:
            UserError: the save failed (:func:`shared_data.runtime.saves.checkpoint_write_error`)."""
        done = self._in_flight.wait()
        if done is not None and not self._failed:
            self._hooks.__exit__(None, None, None)
        return done

    def _complete(self, epoch: int) -> None:
        """The background half of :meth:`save`: orbax's write finished, then the checksums."""
        try:
            self.manager.wait_until_finished()
        except Exception as err:
            self._write_failed(epoch, err)
        if distribute.is_main_process():
            checksums.record(self.directory, epoch, self._files(epoch), self.epochs())

    def _write_failed(self, epoch: int, err: Exception):
        reason = write_failure(err)
        if reason is None:
            raise err
        self._failed, self._hooks.keep = True, True
        EXIT_AFTER_ATEXIT.append(str(self.directory))  # TensorStore's late callbacks: see there
        saves.remove_partial_saves(self.directory, (f"{epoch}.orbax-checkpoint-tmp*",), say=False)
        raise saves.checkpoint_write_error(self.directory, epoch, reason, self.epochs()) from None

    def _files(self, epoch: int) -> list[Path]:
        return [p for p in (self.directory / str(epoch)).rglob("*") if p.is_file()]

    def restore(self, epoch: int):
        """The train state saved after ``epoch``. A save in flight is waited for first; the files'
        checksums are compared with those recorded at the save, so a damaged checkpoint is refused
        before the framework reads it.

        JAX: a new state; the stored arrays' shapes and dtypes are checked against this config's first.

        Raises:
            UserError: the checkpoint is damaged or holds another config's state, or the save in flight
                failed (:func:`shared_data.runtime.saves.checkpoint_write_error`)."""
        self._check(epoch)
        self._check_arrays(epoch, self._like, params_only=False)
        return self._restore(epoch, self._ocp.args.StandardRestore(self._like))

    def restore_params(self, epoch: int, like_params) -> dict:
        """Only the model's parameters saved after ``epoch`` (inference needs no optimizer), checked against
        ``like_params``, this config's.

        JAX: ``like_params`` arrays or ``jax.ShapeDtypeStruct``s; the parameters are returned.

        Raises:
            UserError: the checkpoint is damaged or holds another config's parameters."""
        self._check(epoch)
        self._check_arrays(epoch, like_params, params_only=True)
        return self._restore(epoch, self._ocp.args.StandardRestore())["params"]

    def _check(self, epoch: int) -> None:
        self.wait()  # a save in flight is complete first
        where = f"checkpoint {self.directory}/{epoch}"
        checksums.verify(self.directory, epoch, self._files(epoch), where)

    def _check_arrays(self, epoch: int, like, params_only: bool) -> None:
        """The stored arrays' shapes and dtypes (the parameters' alone with ``params_only``) against
        ``like``'s, before orbax reads them: a checkpoint of another config is named as such."""
        where = f"checkpoint {self.directory}/{epoch}"
        try:
            stored = self.manager.item_metadata(epoch)
            stored = stored["params"] if params_only else stored
            have = sorted((tuple(m.shape), str(m.dtype)) for m in jax.tree.leaves(stored) if hasattr(m, "shape"))
        except Exception as err:  # orbax raises many kinds for damaged files
            raise _restore_error(where, err) from None
        want = sorted((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(like))
        if have != want:
            diff = next(((w, h) for w, h in zip(want, have) if w != h), (len(want), len(have)))
            raise UserError(
                f"{where} does not match this config (arrays {diff[1]} stored where this config has "
                f"{diff[0]}); use another --workdir or --overwrite"
            )

    def _restore(self, epoch: int, args):
        try:
            return self.manager.restore(epoch, args=args)
        except Exception as err:  # orbax raises many kinds for damaged files
            raise _restore_error(f"checkpoint {self.directory}/{epoch}", err) from None


def _restore_error(where: str, err: BaseException) -> UserError:
    """The line for a checkpoint that did not restore: memory that ran out while orbax read it
    (:func:`shared_data.runtime.saves.checkpoint_restore_memory_error`), else the checkpoint named as
    damaged (a checkpoint of another config is refused before, by its arrays' shapes and dtypes)."""
    return saves.checkpoint_restore_memory_error(where, err) or UserError(
        f"{where} is damaged ({_first_line(err)}); use another --workdir or --overwrite"
    )


def _first_line(err: BaseException) -> str:
    return " ".join(str(err).split(". ")[0].split())[:200]
