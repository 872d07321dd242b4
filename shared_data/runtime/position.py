"""Where a training run stands: the epoch being trained and its step, and the newest epoch checkpoint.

A stop signal's line (:func:`shared_data.runtime.signals.set_describe`) and every failed save or
record write say it in words: which epoch is abandoned and which checkpoint ``--resume`` continues
from. The trainer moves it (:meth:`Position.start_epoch`, :meth:`Position.at_step`,
:meth:`Position.saved`), and a save left unfinished by a lost process
(:meth:`Position.save_abandoned`); nothing else does.
"""

from __future__ import annotations

from shared_data.runtime import signals


class Position:
    """The run's place for its messages; registers :meth:`where` as the signal handlers' sentence.

    Args:
        steps_per_epoch: steps of one epoch (for "step i of n").
    """

    def __init__(self, steps_per_epoch: int):
        self.steps_per_epoch = steps_per_epoch
        self.saved_epoch = 0  # the newest checkpoint's epoch (0: none)
        self.running: int | None = None  # the epoch being trained, until its checkpoint is written
        self.step = 0  # the step of :attr:`running` being taken (0-based)
        signals.set_describe(self.where)

    def start_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` (0-based) is being trained from here until its checkpoint is written."""
        self.running = epoch

    def at_step(self, step: int) -> None:
        """Step ``step`` (0-based) of the running epoch is being taken."""
        self.step = step

    def saved(self, epoch: int) -> None:
        """The checkpoint of ``epoch`` (epochs done) is written: nothing is being trained."""
        self.saved_epoch, self.running = epoch, None

    def save_abandoned(self, newest: int) -> None:
        """The save in flight will not finish (another process of the run is lost): ``newest`` (epochs
        done, 0 for none) is the newest finished checkpoint."""
        self.saved_epoch = newest

    def kept(self) -> str:
        """Which checkpoint ``--resume`` continues from, for the line of a failed save or write."""
        if self.saved_epoch:
            return f"the checkpoint of epoch {self.saved_epoch} is kept and --resume continues from it"
        return "no epoch is checkpointed, so the run starts again from scratch"

    def lost(self) -> str:
        """What a failed record write loses: ``": epoch N is not checkpointed"`` while one is trained."""
        return f": epoch {self.running + 1} is not checkpointed" if self.running is not None else ""

    def where(self) -> str:
        """Where a stopped run stands, for the line of a signal: which epoch is abandoned and which
        checkpoint ``--resume`` continues from."""
        if self.running is None:
            return f"between epochs: nothing is lost; {self.kept()}"
        return (
            f"during epoch {self.running + 1} (step {self.step + 1} of {self.steps_per_epoch}): "
            f"that epoch is abandoned; {self.kept()}"
        )
