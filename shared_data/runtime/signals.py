"""The signals a batch system sends: SIGUSR1 (SLURM's warning, ``#SBATCH --signal=USR1@120``), SIGTERM
(a job's time limit, ``scancel``, preemption) and SIGINT (Ctrl-C).

While training steps run (inside :func:`stoppable`), SIGUSR1 and SIGTERM ask for a *stop at the
next step boundary* (:func:`stop_requested`): the trainer agrees on it with every rank, saves a
mid-epoch checkpoint with the data cursor and then stops (:func:`shared_data.runtime.preemption.stopping`).
Elsewhere SIGTERM and SIGINT raise :class:`Interrupted` in the main thread, whose message says
where the run stood (:func:`set_describe`: the run's own sentence, e.g. which epoch is abandoned
and which checkpoint is kept); SIGUSR1 outside the steps is kept for the next step boundary.
:func:`shared_data.core.errors.run_cli` prints the message as one line and exits with 128 + the
signal number (143, 130, 138). Inside :func:`deferred` (a checkpoint being written) a raising
signal waits until the block ends or until :func:`raise_pending` is called at a safe point: the
training loop checks between steps, so a save is never cut in half and no step stops with part of
its collectives launched (a JAX step interrupted there leaves its all-reduce waiting forever, and
XLA aborts the process).

A trainer run as a command is covered from its first import to its exit (:func:`guard_command`,
called by ``jax_impl`` and ``tf_impl`` before the framework imports): until :func:`handled` installs
the handlers above, SIGTERM and SIGINT end the process at once with one sentence (nothing has
started), instead of a traceback from inside ``import tensorflow`` or a silent death by SIGTERM; after
it, while the process exits (everything is written), the first one lets the exit finish, closing the
loader's workers, for up to :data:`EXIT_GRACE_S`, and is not lost in the interpreter's exit. The same
holds once a stop's save is written (:func:`exiting`): the scheduler's SIGTERM that the stop brings
about (SLURM's, once process 0 requeues the job) leaves the stop's line and exit code in place. A raised
:class:`Interrupted` can still be lost: Python runs signal handlers wherever the main thread is,
finalisers and library callbacks included, and an exception raised there is printed and dropped
("Exception ignored in ..."). So the signal stays recorded, :func:`raise_pending` raises it again at
the next safe point (between steps, after the framework's start-up: :func:`reclaim`), and the
unraisable hook drops the lost copy's traceback. :func:`reclaim` also installs the handlers again, in
case a native library replaced them while it started (a handler installed with ``sigaction`` is
invisible to Python).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
#: Signals that ask a running training loop to save at the next step boundary and stop.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
#: Seconds a command that is exiting gets to finish its exit after a SIGTERM or SIGINT (within SLURM's
#: default KillWait of 30 s); a second signal ends it at once.
EXIT_GRACE_S = 10.0


class Interrupted(KeyboardInterrupt):
    """A run stopped by ``signum``; a ``KeyboardInterrupt`` so no ``except Exception`` swallows it."""

    def __init__(self, signum: int, where: str):
        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} {where}".strip())


def _before_training() -> str:
    return "before training started: nothing is lost"


_state: dict = {
    "depth": 0,
    "pending": None,
    "describe": _before_training,
    "stop": None,
    "stoppable": 0,
    "raised": None,  # the signal of the Interrupted last raised by the handler (raised again if it was lost)
    "held": None,  # a SIGUSR1 that arrived before handled() (guard_command)
    "ended": False,  # handled() has ended: a signal now comes as the command exits (guard_command)
    "stderr": 2,  # where guard_command's sentence goes
    "installed": False,  # handled() installed the handlers (in the main thread)
    "exit_grace": None,  # a signal came as the command exited: "running", then "over" (_grace_started)
    "held_sigterm": False,  # SIGTERM blocked in the main thread until a TF worker has joined (hold_sigterm)
    "exiting": None,  # where a stopped run stands once its stop's save is written (exiting)
}
_FRESH = dict(pending=None, describe=_before_training, stop=None, stoppable=0, raised=None, exiting=None)


def set_describe(describe: Callable[[], str]) -> None:
    """Where the work stands, for the message of a signal: ``describe()`` is called when one arrives."""
    _state["describe"] = describe


def where() -> str:
    """Where the work stands now, in the words of a signal's line (:func:`set_describe`)."""
    return _state["describe"]()


def _raise(signum: int, frame=None) -> None:
    if _state["exiting"]:  # the stop is carried out: its line stands
        if signum != signal.SIGUSR1:
            _exit_at_once(signum)
        return
    if signum == signal.SIGUSR1 or (signum in STOP_SIGNALS and _state["stoppable"]):
        _state["stop"] = signum
        return
    if _state["depth"]:
        _state["pending"] = signum
        return
    _state["raised"] = signum
    raise Interrupted(signum, _state["describe"]())


def _exit_at_once(signum: int, frame=None) -> None:
    if signum == signal.SIGUSR1:  # a stop request: the first step boundary honours it
        _state["held"] = signum
        return
    if (_state["ended"] or _state["exiting"]) and _state["exit_grace"] is None and _grace_started(signum):
        return
    if _state["ended"]:
        when = "as the command exited: what it reported stands"
    elif _state["exiting"]:
        when = f"as it exited {_state['exiting']}"
    else:
        when = _before_training()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    line = f"stopped by {signal.Signals(signum).name} {when}\n"
    os.write(_state["stderr"], line.encode())
    os._exit(128 + signum)


def _grace_started(signum: int) -> bool:
    """For the first SIGTERM or SIGINT while the command exits: let the exit finish (it closes the
    loader's worker processes and their shared memory, and waits for the other processes of the run)
    and end the process with ``signum``'s line only where it has not ended after :data:`EXIT_GRACE_S`.
    A scheduler signals every process of a job as a stopped run exits (SLURM's requeue that the run
    asked for); ended at once, the workers' resource trackers report leaked semaphores and a JAX
    process's peers abort. Returns False where no thread can start (the interpreter is finalising):
    the process then ends at once."""
    import threading

    def end_after_grace() -> None:
        time.sleep(EXIT_GRACE_S)
        _state["exit_grace"] = "over"
        _exit_at_once(signum)

    try:
        threading.Thread(target=end_after_grace, name="exit-grace", daemon=True).start()
    except RuntimeError:
        return False
    _state["exit_grace"] = "running"
    return True


def exiting(where: str) -> None:
    """From here until :func:`handled` ends, the run carries out a stop whose save is written
    (``where`` says so, e.g. "after its save at epoch 2, step 3, which stands"): SIGTERM and SIGINT
    are handled as while the command exits (the first lets the exit finish for up to
    :data:`EXIT_GRACE_S`, then ends it with a line that ends in ``where``; a second ends it at once)
    and SIGUSR1 is ignored. The signals a stop brings about itself (SLURM's SIGTERM to every task once
    process 0 requeues the job) so leave the stop's own line and exit code in place."""
    _state["exiting"] = where


def hold_sigterm() -> None:
    """Block SIGTERM in the calling (main) thread, and so in every thread it starts from here on, until
    :func:`release_sigterm`: a SIGTERM to the process then waits, pending, where the process's
    watchdog sees it (``/proc/PID/status``, :func:`shared_data.runtime.launch.watch`). For a
    TensorFlow worker that joins a multi-worker run, from before TensorFlow imports: its coordination
    service installs its own C handler for SIGTERM during the start (its preemption notifier), which
    only records the signal while the start holds the interpreter, so a SIGTERM sent to the process
    alone (not its group) would go unseen until the start's time-out. Does nothing outside the main
    thread or where the system has no ``pthread_sigmask``."""
    import threading

    if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        _state["held_sigterm"] = True


def release_sigterm() -> None:
    """Unblock SIGTERM where :func:`hold_sigterm` blocked it (the worker has joined: the run's handler
    is in place again); one that waits meanwhile is taken now by that handler. Does nothing otherwise."""
    if _state.get("held_sigterm"):
        _state["held_sigterm"] = False
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def guard_command() -> None:
    """For a trainer run as a command, from before its framework imports: before :func:`handled`
    (while the framework imports and the arguments are read) SIGTERM and SIGINT end the process at
    once, with one sentence and exit code 128 + the signal; after it, while the process exits, the
    first of them does so only where the exit has not ended within :data:`EXIT_GRACE_S`
    (:func:`_grace_started`), a second at once; SIGUSR1 is kept for the first step boundary. Does
    nothing outside the main thread."""
    with contextlib.suppress(ValueError):  # not the main thread
        for s in SIGNALS:
            signal.signal(s, _exit_at_once)
        # the stderr of now: a framework's import may point file descriptor 2 elsewhere for a while
        # (shared_data.runtime.logs.quiet_import)
        _state["stderr"] = os.dup(2)


def _drop_lost_interrupts(previous: Callable) -> Callable:
    """An unraisable hook that drops an :class:`Interrupted` raised where Python cannot propagate it
    (a finaliser, a library callback): :func:`raise_pending` raises it again at the next safe point."""

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            previous(unraisable)

    return hook


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGUSR1 are handled as the module says inside the block (the previous
    handlers return after it, and the previous unraisable hook unless another was installed over
    this block's inside it); a SIGUSR1 that came while the command started (:func:`guard_command`)
    stops the run at the first step boundary. Outside the main thread, where Python cannot set
    handlers, the block runs unchanged."""
    _state.update(_FRESH, ended=False, exit_grace=None)
    try:
        previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    except ValueError:  # not the main thread
        previous = {}
    _state["installed"] = bool(previous)
    hook, sys.unraisablehook = sys.unraisablehook, _drop_lost_interrupts(sys.unraisablehook)
    ours = sys.unraisablehook
    _state["stop"], _state["held"] = _state["held"], None
    try:
        yield
    finally:
        if sys.unraisablehook is ours:  # a hook installed inside the block (over ours) stays: it may
            sys.unraisablehook = hook  # still have reports to take (a failed checkpoint save's callbacks)
        _state.update(_FRESH, installed=False, ended=True)
        for s, handler in previous.items():
            signal.signal(s, handler)


def reclaim() -> None:
    """At a safe point after the framework started (its distributed runtime joined, its input pipelines
    built): install the handlers again where :func:`handled` installed them (a native library may have
    replaced them) and raise a signal that arrived meanwhile (:func:`raise_pending`)."""
    if _state["installed"]:
        for s in SIGNALS:
            signal.signal(s, _raise)
    raise_pending()


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
    """Raise :class:`Interrupted` for a signal that arrived inside :func:`deferred`, or again for one
    whose :class:`Interrupted` was lost (raised in a finaliser or a library that dropped it): a point
    where stopping is safe (between steps, after a checkpoint is written)."""
    signum = _state["pending"] or _state["raised"]
    if signum is not None:
        _state["pending"] = None
        raise Interrupted(signum, _state["describe"]())


@contextlib.contextmanager
def signal_first() -> Iterator[None]:
    """Around work that a signal to the process group can break as well (the loader's worker
    processes get it too, and one that dies while it starts fails the batch): an exception from the
    block after a signal arrived (raised, deferred, or a stop request) is that signal's
    :class:`Interrupted`, not the loader's error."""
    try:
        yield
    except StopIteration:
        raise
    except Exception:
        signum = _state["pending"] or _state["raised"] or _state["stop"]
        if signum is None:
            raise
        _state["pending"] = None
        raise Interrupted(signum, _state["describe"]()) from None


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


def pending() -> int | None:
    """A signal that waits for the next step boundary (SIGTERM or Ctrl-C held by :func:`deferred`, or a
    stop request), or None: a long pass outside the steps (validation, the quality check) ends early on
    it, so the run reaches its save and stop within seconds."""
    return _state["pending"] or _state["stop"]


def cut_short(signum: int | None, what: str) -> bool:
    """Whether ``what`` (e.g. "the validation of epoch 3") ends here because ``signum`` waits (this
    process's :func:`pending` signal, or another process's, as the processes agreed: SIGUSR1 stands
    for it); logs the line that says so. False where ``signum`` is None."""
    if signum is None:
        return False
    import logging

    logging.getLogger("dlas").warning(
        "%s is cut short by %s: the run saves and stops at the next step boundary",
        what,
        signal.Signals(signum).name,
    )
    return True


def request_stop(signum: int) -> None:
    """Ask for a stop at the next step boundary as ``signum`` would (a rank that learns of another
    rank's signal through the agreement)."""
    _state["stop"] = _state["stop"] or signum
