"""The resume rule, identical for TF and JAX: where a run starts, from which checkpoint, and the data
cursor of a stop at a step boundary.

:func:`resume` applies the rule to the run's epoch checkpoints and, when a stop's mid-epoch save
(``mid_epoch/``: its checkpoint and ``cursor.json``, :mod:`shared_data.runtime.preemption`) is newer
than all of them, to that save; it returns a :class:`Start`: the epoch and step the run continues
from, the training losses of that epoch's steps before the cursor, and the restored state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

from shared_data.core.errors import UserError
from shared_data.runtime.run_folder import RunFolder

log = logging.getLogger("dlas")


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a run continues: ``epoch`` (0-based: the epochs done), ``step`` of that epoch (a mid-epoch
    resume's data cursor, else 0), ``losses`` of that epoch's steps before the cursor, and ``restored``,
    what the checkpoint's ``restore`` returned (JAX's state; TensorFlow restores in place: None)."""

    epoch: int = 0
    step: int = 0
    losses: tuple = ()
    restored: Any = None

    def first_step(self, epoch: int) -> int:
        """The first step of ``epoch`` this invocation trains (the cursor's in its epoch, else 0)."""
        return self.step if epoch == self.epoch else 0

    def losses_before(self, epoch: int) -> list:
        """The training losses of ``epoch``'s steps before the data cursor (a run resumed mid-epoch),
        else an empty list: the epoch's train loss is then the mean over all its steps."""
        return list(self.losses) if epoch == self.epoch else []


def resume(folder: RunFolder, checkpoints, mid_epoch: Callable[[], Any] | None, requested: bool) -> Start:
    """Apply the resume rule to ``checkpoints`` (``epochs()`` newest last; ``restore(epoch)``): a fresh
    run starts at :class:`Start` ``()``, a resumed one at the newest checkpoint that restores. A
    checkpoint that fails to restore (a damaged file) is skipped with a warning. A mid-epoch save
    (``mid_epoch()`` opens the checkpoints of ``folder.mid_epoch_dir``, numbered by global step) newer
    than every epoch checkpoint wins: the run resumes at its data cursor. ``requested``: ``--resume``.
    The folder's position learns the checkpoint kept.

    Raises:
        UserError: the folder holds checkpoints and neither ``--resume`` nor ``--overwrite`` was
            given; no checkpoint restores (the newest one's error, e.g. a config mismatch).
    """
    epochs = list(checkpoints.epochs())
    if requested and mid_epoch is not None:
        start = _mid_epoch_start(folder, epochs[-1] if epochs else 0, mid_epoch)
        if start is not None:
            folder.position.saved(start.epoch)
            return start
    if not epochs:
        if requested:
            log.info("no checkpoint in %s: starting from scratch", folder.workdir)
        return Start()
    if not requested:
        raise UserError(
            f"{folder.workdir} already holds checkpoints (epoch {epochs[-1]}); pass --resume to continue, "
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
        folder.position.saved(epoch)
        return Start(epoch=epoch, restored=restored)
    raise first_error


def _mid_epoch_start(folder: RunFolder, newest_epoch: int, mid_epoch: Callable[[], Any]) -> Start | None:
    """The :class:`Start` of the mid-epoch save, if its cursor is newer than the epoch checkpoint
    ``newest_epoch`` and its checkpoint restores; else None (with a warning where it does not)."""
    cursor = mid_epoch_cursor(folder, newest_epoch)
    if cursor is None:
        return None
    try:
        with mid_epoch() as mid:
            restored = mid.restore(cursor["global_step"])  # TF restores in place: None
    except UserError as err:
        log.warning("the mid-epoch checkpoint does not restore (%s); trying the epoch checkpoints", err)
        return None
    log.info(
        "resumed from %s at epoch %d, step %d of %d (a stop at a step boundary)",
        folder.mid_epoch_dir,
        cursor["epoch"] + 1,
        cursor["step"] + 1,
        folder.steps_per_epoch,
    )
    return Start(cursor["epoch"], cursor["step"], tuple(cursor["losses"]), restored)


def mid_epoch_cursor(folder: RunFolder, newest_epoch: int) -> dict | None:
    """The data cursor of ``folder.mid_epoch_dir`` (``epoch``, ``step``, ``global_step``, ``losses``)
    if it is newer than the epoch checkpoint ``newest_epoch`` and fits this run's epoch length."""
    path = folder.mid_epoch_dir / "cursor.json"
    if not path.is_file():
        return None
    try:
        cursor = json.loads(path.read_text())
        epoch, step, n = int(cursor["epoch"]), int(cursor["step"]), int(cursor["steps_per_epoch"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("%s is unreadable (%s): resuming from the epoch checkpoints", path, err)
        return None
    if n != folder.steps_per_epoch:
        log.warning(
            "%s was saved with %d steps per epoch, this run has %d (another global batch): resuming "
            "from the epoch checkpoints",
            path,
            n,
            folder.steps_per_epoch,
        )
        return None
    return cursor if epoch * n + step > newest_epoch * n else None
