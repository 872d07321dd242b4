"""The signals a batch system sends: SIGTERM (a job's time limit, ``scancel``) and SIGINT (Ctrl-C).

Inside :func:`handled` either signal raises :class:`Interrupted` in the main thread, whose message
says where the run stood (:func:`set_describe`: the run's own sentence, e.g. which epoch is abandoned
and which checkpoint is kept); :func:`shared_data.core.errors.run_cli` prints it as one line and exits
with 128 + the signal number (143, 130). Inside :func:`deferred` (a checkpoint being written) the
signal waits until the block ends or until :func:`raise_pending` is called at a safe point: the
training loop checks between steps, so a save is never cut in half and no step stops with part of
its collectives launched (a JAX step interrupted there leaves its all-reduce waiting forever, and
XLA aborts the process).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """A run stopped by ``signum``; a ``KeyboardInterrupt`` so no ``except Exception`` swallows it."""

    def __init__(self, signum: int, where: str):
        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} {where}".strip())


def _before_training() -> str:
    return "before training started: nothing is lost"


_state: dict = {"depth": 0, "pending": None, "describe": _before_training}


def set_describe(describe: Callable[[], str]) -> None:
    """Where the work stands, for the message of a signal: ``describe()`` is called when one arrives."""
    _state["describe"] = describe


def _raise(signum: int, frame=None) -> None:
    if _state["depth"]:
        _state["pending"] = signum
        return
    raise Interrupted(signum, _state["describe"]())


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGTERM and SIGINT raise :class:`Interrupted` inside the block (the previous handlers return
    after it); outside the main thread, where Python cannot set handlers, the block runs unchanged."""
    _state.update(pending=None, describe=_before_training)
    try:
        previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.update(pending=None, describe=_before_training)


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
