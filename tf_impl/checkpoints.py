"""``tf.train.CheckpointManager`` checkpoints of model, optimizer and epoch: the counterpart of
:mod:`jax_impl.checkpoints`.

The run's resume rule (:func:`shared_data.runtime.resume.resume`) calls :meth:`Checkpoints.epochs`
and :meth:`Checkpoints.restore`; the trainer calls :meth:`Checkpoints.save` after each epoch.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import keras
import tensorflow as tf

from shared_data.core.errors import UserError
from shared_data.core.files import write_failure
from shared_data.runtime import checksums, saves
from tf_impl import distribute

log = logging.getLogger("dlas.tf")


class Checkpoints:
    """``tf.train.CheckpointManager`` checkpoints of the train state (model, optimizer with its loss
    scale and weight average) and the epoch, one per epoch, written atomically: a checkpoint becomes
    visible only once its index file is written, so a crash leaves the last complete one. What a
    killed save leaves behind (``*_temp`` folders, ``checkpoint.tmp*``) is removed at start.
    ``state`` is a :class:`tf_impl.step.TrainState` whose variables :meth:`save` writes and
    :meth:`restore` loads (in place); without it only :meth:`restore_params` restores. ``read_only``
    (inference) creates and removes nothing, so a run that is saving meanwhile is left alone."""

    def __init__(self, directory: Path, keep: int, state=None, read_only: bool = False):
        self.directory, self.state = directory, state
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
        try:
            self.manager = tf.train.CheckpointManager(self.ckpt, str(self.write_dir), max_to_keep=keep)
        except Exception:
            log.warning("%s/checkpoint is damaged: the list of checkpoints is rebuilt from the ckpt-N files", directory)
            (directory / "checkpoint").unlink()
            self.manager = tf.train.CheckpointManager(self.ckpt, str(directory), max_to_keep=keep)

    def _checkpoint(self, model, optimizer=None) -> tf.train.Checkpoint:
        parts = {"model": model, "epoch": self.epoch} | ({"optimizer": optimizer} if optimizer is not None else {})
        return tf.train.Checkpoint(**parts)

    def close(self) -> None:
        """Nothing to stop (``tf.train.CheckpointManager`` saves in the caller's thread); the same
        protocol as :meth:`jax_impl.checkpoints.Checkpoints.close`."""

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def epochs(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name[5:-6]) for p in self.directory.glob("ckpt-*.index") if p.name[5:-6].isdigit())

    def save(self, epoch: int) -> None:
        """Write the checkpoint of ``epoch`` and record its checksums (:mod:`shared_data.runtime.checksums`);
        a save that fails (a full disk) leaves no partial file."""
        self.epoch.assign(epoch)
        try:
            self.manager.save(checkpoint_number=epoch)
        except (OSError, tf.errors.OpError) as err:  # TF reports a full disk as an OpError
            reason = write_failure(err) or str(err).splitlines()[0][:200]
            saves.remove_partial_saves(self.write_dir, (f"ckpt-{epoch}_temp*", "checkpoint.tmp*"), say=False)
            raise saves.checkpoint_write_error(self.directory, epoch, reason, self.epochs()) from None
        if self.write_dir != self.directory:
            shutil.rmtree(self.write_dir, ignore_errors=True)
        else:
            checksums.record(self.directory, epoch, self._files(epoch), self.epochs())

    def _files(self, epoch: int) -> list[Path]:
        return list(self.directory.glob(f"ckpt-{epoch}.*"))

    def restore(self, epoch: int):
        """The train state saved after ``epoch``: its variables loaded into the constructor's ``state``
        (in place), which is returned.

        Raises:
            UserError: the checkpoint's files differ from the checksums recorded at its save, or it
                holds another config's variables.
        """
        self._restore(epoch, self.ckpt, partial=False)
        return self.state

    def restore_params(self, epoch: int, like_params: keras.Model) -> keras.Model:
        """Only the model's weights saved after ``epoch`` (inference needs no optimizer), loaded into the
        model ``like_params`` of this config, which is returned.

        Raises:
            UserError: the checkpoint is damaged or holds another config's weights.
        """
        self._restore(epoch, self._checkpoint(like_params), partial=True)
        return like_params

    def _restore(self, epoch: int, ckpt: tf.train.Checkpoint, partial: bool) -> None:
        where = f"checkpoint {self.directory}/ckpt-{epoch}"
        checksums.verify(self.directory, epoch, self._files(epoch), where)
        try:
            status = ckpt.restore(str(self.directory / f"ckpt-{epoch}")).assert_existing_objects_matched()
            if partial:
                status.expect_partial()  # the optimizer's slots stay in the file
        except Exception as err:  # TF raises many kinds for damaged or foreign files
            raise saves.checkpoint_restore_memory_error(where, err) or UserError(
                f"{where} does not match this config or is damaged "
                f"({str(err).splitlines()[0][:200]}); use another --workdir or --overwrite"
            ) from None
