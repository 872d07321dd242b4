"""Checkpoints of the train state, one per epoch: the counterpart of :mod:`jax_impl.checkpoints`.

The run's resume rule (:func:`shared_data.runtime.resume.resume`) calls :meth:`Checkpoints.epochs`
and :meth:`Checkpoints.restore`; the trainer calls :meth:`Checkpoints.save` after each epoch, inside
:func:`shared_data.runtime.saves.saving`, which joins the previous save (:meth:`Checkpoints.wait`);
inference calls :meth:`Checkpoints.restore_params`.

TensorFlow: ``tf.train.CheckpointManager`` with TensorFlow's asynchronous checkpoint option (its save
returns once the variables are copied to the host).
"""

from __future__ import annotations

import functools
import logging
import shutil
from pathlib import Path

import keras
import tensorflow as tf

from shared_data.core.errors import UserError
from shared_data.core.files import write_failure
from shared_data.runtime import checksums, saves

from tf_impl import checkpoint_quirks as quirks
from tf_impl import distribute

log = logging.getLogger("dlas.tf")


class Checkpoints:
    """Checkpoints of the train state, one per epoch (numbered by the epochs done), written atomically: a
    save cut by a crash is never listed, and what a killed save left is removed at start. ``state`` is a
    train state of this config, the template a checkpoint restores into; without it only
    :meth:`restore_params` restores. ``read_only`` (inference) creates and removes nothing, so a run that
    is saving meanwhile is left alone. ``position`` (the run's :class:`~shared_data.runtime.position.Position`)
    is told the newest finished checkpoint where the loss of another process of the run leaves the save in
    flight unfinished (:func:`shared_data.runtime.saves.leave_after_loss`).

    TensorFlow: ``tf.train.CheckpointManager`` of the model, the optimizer (with its loss scale and
    weight average) and the epoch; a checkpoint is listed once its index file is written, and a killed
    save leaves ``*_temp`` folders and ``checkpoint.tmp*``. The state's variables are what it writes and
    loads (in place)."""

    def __init__(self, directory: Path, keep: int, state=None, read_only: bool = False, position=None):
        self.directory, self.state, self.keep, self._position = directory, state, keep, position
        self._in_flight = saves.InFlight(f"save-{directory.name}")
        rank = distribute.process_index()
        # Every worker of a multi-worker strategy saves (TensorFlow's rule: a save may hold collectives),
        # the chief into the run's folder, each other worker into a folder of its own, removed after each
        # save (TensorFlow's multi-worker guide), so no two workers write one file.
        self.write_dir = directory if rank == 0 else directory / f"worker-{rank}.tmp"
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.ckpt = None if state is None else self._checkpoint(state.model, state.optimizer)
        if read_only:
            self.manager = None  # restore() needs only the ckpt-N files (epochs() lists them)
            return
        if distribute.is_main_process():
            saves.remove_partial_saves(directory, ("ckpt-*_temp*", "checkpoint.tmp*", "worker-*.tmp"))
        # The old checkpoints are removed once a new one is complete (:meth:`_complete`): the manager's
        # max_to_keep would remove them when the asynchronous write starts.
        try:
            self.manager = tf.train.CheckpointManager(self.ckpt, str(self.write_dir), max_to_keep=None)
        except Exception:
            log.warning("%s/checkpoint is damaged: the list of checkpoints is rebuilt from the ckpt-N files", directory)
            (directory / "checkpoint").unlink()
            self.manager = tf.train.CheckpointManager(self.ckpt, str(directory), max_to_keep=None)

    def _checkpoint(self, model, optimizer=None) -> tf.train.Checkpoint:
        parts = {"model": model, "epoch": self.epoch} | ({"optimizer": optimizer} if optimizer is not None else {})
        return tf.train.Checkpoint(**parts)

    def close(self) -> None:
        """Wait for the save in flight and the checkpointer's background work, and stop them; a run that
        ends early (an error, a signal) does this before the interpreter shuts down, so no exit skips
        the wait. A failed save is raised here unless another exception is propagating, which the
        failure's line is then logged beside.

        TensorFlow: the asynchronous writer's thread is TensorFlow's, joined at the interpreter's exit."""
        try:
            saves.wait_at_close(self)
        finally:
            self._in_flight.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and distribute.lost_peer(exc) is not None:
            saves.leave_after_loss(self._in_flight, self.epochs, self._position)
            return
        self.close()

    def epochs(self) -> list[int]:
        """The epochs with a finished checkpoint, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name[5:-6]) for p in self.directory.glob("ckpt-*.index") if p.name[5:-6].isdigit())

    def save(self, epoch: int) -> None:
        """Start writing the train state as the checkpoint of ``epoch``; return once it is copied to the
        host, the write, its checksums (:mod:`shared_data.runtime.checksums`) and the removal of old
        checkpoints going on in the background until :meth:`wait`. A save that fails (a full disk)
        leaves no partial file and raises, here or at :meth:`wait`, the line of
        :func:`shared_data.runtime.saves.checkpoint_write_error`. The previous save is joined first.

        TensorFlow: the constructor's state's variables are written; every worker of a multi-worker strategy
        saves (TensorFlow's rule: a save may hold collectives), the chief alone into the run's folder."""
        self.wait()
        self.epoch.assign(epoch)
        options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
        try:
            with quirks.keras_variables_copied_in_place():
                self.manager.save(checkpoint_number=epoch, options=options)
        except (OSError, tf.errors.OpError) as err:  # TF reports a full disk as an OpError
            self._write_failed(epoch, err)
        self._in_flight.start(epoch, functools.partial(self._complete, epoch))

    def wait(self) -> tuple[int, float] | None:
        """Block until the save in flight is complete: its epoch and the seconds from its start, or None
        where none is in flight.

        Raises:
            UserError: the save failed (:func:`shared_data.runtime.saves.checkpoint_write_error`)."""
        return self._in_flight.wait()

    def _complete(self, epoch: int) -> None:
        """The background half of :meth:`save`: TensorFlow's writer done (its error, which it would
        raise again at the next save and at exit, taken from it), the old checkpoints removed, then
        the checksums."""
        self.ckpt.sync()
        writer = self.ckpt._async_checkpointer_impl  # TensorFlow keeps the writer's error here alone
        err, writer._async_error = writer._async_error, None
        if err is not None or not (self.write_dir / f"ckpt-{epoch}.index").exists():
            self._write_failed(epoch, err or OSError(f"ckpt-{epoch}.index was not written"))
        if self.write_dir != self.directory:
            shutil.rmtree(self.write_dir, ignore_errors=True)
            return
        for old in self.epochs()[: -self.keep]:
            for path in self.directory.glob(f"ckpt-{old}.*"):
                path.unlink(missing_ok=True)
        checksums.record(self.directory, epoch, self._files(epoch), self.epochs())

    def _write_failed(self, epoch: int, err: Exception):
        reason = write_failure(err) or str(err).splitlines()[0][:200]
        saves.remove_partial_saves(self.write_dir, (f"ckpt-{epoch}_temp*", "checkpoint.tmp*"), say=False)
        raise saves.checkpoint_write_error(self.directory, epoch, reason, self.epochs()) from None

    def _files(self, epoch: int) -> list[Path]:
        return list(self.directory.glob(f"ckpt-{epoch}.*"))

    def restore(self, epoch: int):
        """The train state saved after ``epoch``. A save in flight is waited for first; the files'
        checksums are compared with those recorded at the save, so a damaged checkpoint is refused
        before the framework reads it.

        TensorFlow: the variables are loaded into the constructor's state (in place), which is returned.

        Raises:
            UserError: the checkpoint is damaged or holds another config's state, or the save in flight
                failed (:func:`shared_data.runtime.saves.checkpoint_write_error`)."""
        self._check(epoch)
        self._restore(epoch, self.ckpt, partial=False)
        return self.state

    def restore_params(self, epoch: int, like_params: keras.Model) -> keras.Model:
        """Only the model's parameters saved after ``epoch`` (inference needs no optimizer), checked against
        ``like_params``, this config's.

        TensorFlow: ``like_params`` a model of this config, loaded in place and returned.

        Raises:
            UserError: the checkpoint is damaged or holds another config's parameters."""
        self._check(epoch)
        self._restore(epoch, self._checkpoint(like_params), partial=True)
        return like_params

    def _check(self, epoch: int) -> None:
        self.wait()  # a save in flight is complete first
        where = f"checkpoint {self.directory}/ckpt-{epoch}"
        checksums.verify(self.directory, epoch, self._files(epoch), where)

    def _restore(self, epoch: int, ckpt: tf.train.Checkpoint, partial: bool) -> None:
        try:
            status = ckpt.restore(str(self.directory / f"ckpt-{epoch}")).assert_existing_objects_matched()
            if partial:
                status.expect_partial()  # the optimizer's slots stay in the file
        except Exception as err:  # TF raises many kinds for damaged or foreign files
            raise _restore_error(f"checkpoint {self.directory}/ckpt-{epoch}", err) from None


def _restore_error(where: str, err: BaseException) -> UserError:
    """The line for a checkpoint that did not restore: memory that ran out while TensorFlow read it
    (:func:`shared_data.runtime.saves.checkpoint_restore_memory_error`), else the checkpoint named as
    damaged or another config's (TensorFlow's matching of the stored objects fails alike for both)."""
    return saves.checkpoint_restore_memory_error(where, err) or UserError(
        f"{where} does not match this config or is damaged ({_first_line(err)}); use another --workdir or --overwrite"
    )


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0][:200] if str(err) else type(err).__name__
