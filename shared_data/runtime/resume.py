"""The resume rule, identical for TF and JAX: where a run starts, from which checkpoint, and the data
cursor of a stop at a step boundary.

:func:`resume` applies the rule to the run's epoch checkpoints and, when a stop's mid-epoch save
(``mid_epoch/``: its checkpoint and ``cursor.json``, :mod:`shared_data.runtime.preemption`) is newer
than all of them, to that save; it returns a :class:`Start`: the epoch and step the run continues
from, the training losses of that epoch's steps before the cursor, and the restored state. A cursor
that does not parse or contradicts its checkpoint (:func:`cursor_problem`) is one warning, and its
folder is kept aside as ``mid_epoch.damaged``: the run resumes from the epoch checkpoints, now and
at every later resume.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from shared_data.core.errors import UserError, quoted
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
    epoch, restored = restore_newest(epochs, checkpoints.restore)
    log.info("resumed from %s at epoch %d", checkpoints.directory, epoch)
    folder.position.saved(epoch)
    return Start(epoch=epoch, restored=restored)


def restore_newest(epochs: Sequence[int], restore: Callable[[int], Any]) -> tuple[int, Any]:
    """The newest of ``epochs`` (a checkpoints folder's, oldest first) whose ``restore(epoch)`` returns:
    ``(epoch, what it returned)``. A checkpoint that raises :class:`UserError` (a damaged file or
    checksum record, :mod:`shared_data.runtime.checksums`) is skipped with a warning naming its error,
    and an older one used says so; the trainer's resume, predict and export alike.

    Raises:
        UserError: none restores (the newest one's error, e.g. a checkpoint of another config).
        ValueError: ``epochs`` is empty.
    """
    if not epochs:
        raise ValueError("restore_newest needs at least one checkpoint")
    first_error = None
    for epoch in reversed(epochs):
        try:
            restored = restore(epoch)
        except UserError as err:
            first_error = first_error or err
            log.warning("checkpoint of epoch %d does not restore (%s); trying an older one", epoch, err)
            continue
        if epoch != epochs[-1]:
            log.warning("using the checkpoint of epoch %d, the newest one that restores", epoch)
        return epoch, restored
    raise first_error


def _mid_epoch_start(folder: RunFolder, newest_epoch: int, mid_epoch: Callable[[], Any]) -> Start | None:
    """The :class:`Start` of the mid-epoch save, if its cursor is newer than the epoch checkpoint
    ``newest_epoch`` and its checkpoint restores; else None (with a warning where it does not). A
    cursor whose global step is not the number of the save's checkpoint contradicts it: the folder
    is kept aside as a damaged cursor is (:func:`_set_aside_damaged_mid_epoch`)."""
    cursor = mid_epoch_cursor(folder, newest_epoch)
    if cursor is None:
        return None
    try:
        with mid_epoch() as mid:
            saved = list(mid.epochs())
            if cursor["global_step"] in saved:
                restored = mid.restore(cursor["global_step"])  # TF restores in place: None
    except UserError as err:
        log.warning("the mid-epoch checkpoint does not restore (%s); trying the epoch checkpoints", err)
        return None
    if cursor["global_step"] not in saved:  # the checkpoint's manager is closed: the folder can move
        holds = f"the checkpoint of global step {saved[-1]}" if saved else "no checkpoint"
        problem = f"has global_step {cursor['global_step']}, but {folder.mid_epoch_dir / 'checkpoints'} holds {holds}"
        _set_aside_damaged_mid_epoch(folder, folder.mid_epoch_dir / "cursor.json", problem)
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
    if it is newer than the epoch checkpoint ``newest_epoch`` and fits this run's epoch length. A
    cursor that does not parse or contradicts itself or the run's checkpoints (:func:`cursor_problem`)
    is one warning naming the file and what is wrong; the main process keeps the folder aside as
    ``mid_epoch.damaged`` (:func:`_set_aside_damaged_mid_epoch`), so the run resumes from the epoch
    checkpoints now and later."""
    path = folder.mid_epoch_dir / "cursor.json"
    if not path.is_file():
        return None
    try:
        cursor = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # ValueError: not JSON, or not UTF-8 text
        problem = f"does not parse ({_first_line(err)})"
    else:
        problem = cursor_problem(cursor, folder.steps_per_epoch, newest_epoch)
    if problem == "steps_per_epoch":
        log.warning(
            "%s was saved with %d steps per epoch, this run has %d (another global batch): resuming "
            "from the epoch checkpoints",
            path,
            cursor["steps_per_epoch"],
            folder.steps_per_epoch,
        )
        return None
    if problem:
        _set_aside_damaged_mid_epoch(folder, path, problem)
        return None
    return cursor if cursor["global_step"] > newest_epoch * folder.steps_per_epoch else None


#: The fields of a data cursor that are counts (:func:`shared_data.runtime.preemption.stopping`).
_CURSOR_COUNTS = ("epoch", "step", "global_step", "steps_per_epoch")


def cursor_problem(cursor, steps_per_epoch: int, newest_epoch: int) -> str | None:
    """What is wrong with ``cursor`` (a parsed ``cursor.json``) for a run of ``steps_per_epoch`` steps
    an epoch whose newest epoch checkpoint is of ``newest_epoch`` (0: none): a phrase for a warning,
    ``"steps_per_epoch"`` for a cursor of another global batch (not damage), or None when it is sound.
    Sound: a JSON object whose counts are non-negative integers, ``step`` inside the epoch,
    ``global_step = epoch x steps_per_epoch + step``, ``losses`` one number per step before the
    cursor, and an epoch that follows the newest epoch checkpoint (the epoch a stop interrupts) or the
    one after it (the checkpoint whose save the stop or a full disk failed)."""
    if not isinstance(cursor, dict):
        return f"is a JSON {type(cursor).__name__}, expected an object"
    for key in (*_CURSOR_COUNTS, "losses"):
        if key not in cursor:
            return f"has no {key!r}"
    for key in _CURSOR_COUNTS:
        value = cursor[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"has {key} = {quoted(value, 60)}, expected a count (an integer >= 0)"
    losses = cursor["losses"]
    if not isinstance(losses, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses):
        return f"has losses = {quoted(losses, 60)}, expected a list of numbers"
    epoch, step, n = cursor["epoch"], cursor["step"], cursor["steps_per_epoch"]
    if n != steps_per_epoch:
        return "steps_per_epoch"
    if step >= n:
        return f"has step {step}, beyond an epoch of {n} steps"
    if cursor["global_step"] != epoch * n + step:
        return f"has global_step {cursor['global_step']}, expected epoch x steps_per_epoch + step = {epoch * n + step}"
    if len(losses) != step:
        return f"has {len(losses)} losses for its {step} steps of the epoch"
    if epoch > newest_epoch + 1:  # one more: the epoch whose checkpoint's background save failed
        return f"is in epoch {epoch + 1}, beyond the run's checkpoints (the newest is of epoch {newest_epoch})"
    return None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def _set_aside_damaged_mid_epoch(folder: RunFolder, path, problem: str) -> None:
    """Warn that the cursor ``path`` ``problem`` and, in the main process, keep its folder as
    ``mid_epoch.damaged`` (``mid_epoch.damaged.2``, ... where that exists), as a ``run.json`` that
    cannot be used is kept: the run resumes from the epoch checkpoints, and no later resume meets the
    cursor again."""
    lost = "the steps of the stopped epoch are trained again from the newest epoch checkpoint"
    if not folder.main:
        log.warning("%s %s: %s", path, problem, lost)
        return
    kept = folder.mid_epoch_dir.with_name("mid_epoch.damaged")
    n = 1
    while kept.exists():
        n += 1
        kept = folder.mid_epoch_dir.with_name(f"mid_epoch.damaged.{n}")
    try:
        os.replace(folder.mid_epoch_dir, kept)
    except OSError as err:
        log.warning("%s %s (and it cannot be kept aside: %s): %s", path, problem, err.strerror, lost)
        return
    log.warning("%s %s: kept as %s; %s", path, problem, kept, lost)
