"""The signals a batch system sends: SIGUSR1 (SLURM's warning, ``#SBATCH --signal=USR1@120``), SIGTERM
(a job's time limit, ``scancel``, preemption) and SIGINT (Ctrl-C).

While training steps run (inside :func:`stoppable`), SIGUSR1 and SIGTERM ask for a *stop at the
next step boundary* (:func:`stop_requested`): the trainer agrees on it with every rank, saves a
mid-epoch checkpoint with the data cursor and then stops (:meth:`shared_data.runtime.run.Run.preempt`).
Elsewhere SIGTERM and SIGINT raise :class:`Interrupted` in the main thread, whose message says
where the run stood (:func:`set_describe`: the run's own sentence, e.g. which epoch is abandoned
and which checkpoint is kept); SIGUSR1 outside the steps is kept for the next step boundary.
:func:`shared_data.core.errors.run_cli` prints the message as one line and exits with 128 + the
signal number (143, 130, 138). Inside :func:`deferred` (a checkpoint being written) a raising
signal waits until the block ends or until :func:`raise_pending` is called at a safe point: the
training loop checks between steps, so a save is never cut in half and no step stops with part of
its collectives launched (a JAX step interrupted there leaves its all-reduce waiting forever, and
XLA aborts the process).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
#: Signals that ask a running training loop to save at the next step boundary and stop.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A run stopped by ``signum``; a ``KeyboardInterrupt`` so no ``except Exception`` swallows it."""

    def __init__(self, signum: int, where: str):
        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} {where}".strip())


def _before_training() -> str:
    return "before training started: nothing is lost"


_state: dict = {"depth": 0, "pending": None, "describe": _before_training, "stop": None, "stoppable": 0}


def set_describe(describe: Callable[[], str]) -> None:
    """Where the work stands, for the message of a signal: ``describe()`` is called when one arrives."""
    _state["describe"] = describe


def _raise(signum: int, frame=None) -> None:
    if signum == signal.SIGUSR1 or (signum in STOP_SIGNALS and _state["stoppable"]):
        _state["stop"] = signum
        return
    if _state["depth"]:
        _state["pending"] = signum
        return
    raise Interrupted(signum, _state["describe"]())


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGUSR1 are handled as the module says inside the block (the previous
    handlers return after it); outside the main thread, where Python cannot set handlers, the block
    runs unchanged."""
    _state.update(pending=None, describe=_before_training, stop=None, stoppable=0)
    try:
        previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.update(pending=None, describe=_before_training, stop=None, stoppable=0)


def reinstall() -> None:
    """Install the Python handlers of :data:`SIGNALS` again in the C runtime, where a library replaced
    them there behind Python's back (``signal.getsignal`` still names Python's). TensorFlow's
    coordination service does so for SIGTERM when ``MultiWorkerMirroredStrategy`` starts (a
    preemption notifier that only records the signal): without this, SLURM's SIGTERM never reaches
    the run and the steps go on until SIGKILL. Outside the main thread nothing changes."""
    try:
        for s in SIGNALS:
            handler = signal.getsignal(s)
            if handler is not None:  # None: a handler set outside Python, which Python cannot set again
                signal.signal(s, handler)
    except ValueError:  # not the main thread
        pass


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal that arrives inside the block is raised when the block ends (after its work is done)."""
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
    if not _state["depth"]:
        raise_pending()


def raise_pending() -> None:
    """Raise :class:`Interrupted` for a signal that arrived inside :func:`deferred`: a point where
    stopping is safe (between steps, after a checkpoint is written)."""
    if _state["pending"] is not None:
        signum, _state["pending"] = _state["pending"], None
        raise Interrupted(signum, _state["describe"]())


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """Around training steps: SIGTERM asks for a stop at the next step boundary instead of raising.
    A SIGTERM held by :func:`deferred` since before the block (it arrived between epochs, after the
    checkpoint's write: the time-to-quality evaluation, the next epoch's start) asks the same, so it
    too ends in a step-boundary save and the job's requeue."""
    if _state["pending"] in STOP_SIGNALS:
        _state["stop"], _state["pending"] = _state["stop"] or _state["pending"], None
    _state["stoppable"] += 1
    try:
        yield
    finally:
        _state["stoppable"] -= 1


def stop_requested() -> int | None:
    """The signal that asked for a stop at the next step boundary (SIGUSR1, or SIGTERM during the
    steps), or None."""
    return _state["stop"]


def request_stop(signum: int) -> None:
    """Ask for a stop at the next step boundary as ``signum`` would (a rank that learns of another
    rank's signal through the agreement)."""
    _state["stop"] = _state["stop"] or signum
