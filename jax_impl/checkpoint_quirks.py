"""What orbax and TensorStore need around a save that their APIs do not give: a failed write (a full
disk) reported in the run's one line, not in their tracebacks, and the folders their late writes
leave removed. :class:`jax_impl.checkpoints.Checkpoints` uses them; the counterpart of
:mod:`tf_impl.checkpoint_quirks`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path

from shared_data.core.files import write_failure
from shared_data.runtime import saves


class OrbaxWriteFailures(logging.Filter):
    """Drops orbax's own reports of a write that failed (a full disk, a read-only or vanished folder:
    :func:`shared_data.core.files.write_failure`), each with a traceback, from every background thread
    of a save, and asyncio's "Future exception was never retrieved" for the writes orbax left unread:
    :meth:`jax_impl.checkpoints.Checkpoints.save` reports the failure in one line
    (:func:`shared_data.runtime.saves.checkpoint_write_error`). Other records pass."""

    #: orbax logs through absl's logger; its event loops' unread failures through asyncio's.
    LOGGERS = ("absl", "asyncio")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "asyncio" and "orbax" not in Path(record.pathname).parts:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        return write_failure(exc if exc is not None else RuntimeError(record.getMessage())) is None


def remove_late_partial_saves(directory: Path, settle_s: float = 0.5, limit_s: float = 3.0) -> None:
    """Remove the temporary folders of a failed save from ``directory`` until none has come back for
    ``settle_s`` seconds (at most ``limit_s``): TensorStore's writes that were under way when orbax
    gave the save up end on their own threads, after orbax's ``CheckpointManager.close``, and each
    creates its folder again (a run's folder held one after its exit on a loaded 2-core machine;
    orbax has no call that waits for those writes)."""
    pattern = "*.orbax-checkpoint-tmp*"
    start = time.monotonic()
    saves.remove_partial_saves(directory, (pattern,), say=False)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle_s and time.monotonic() - start < limit_s:
        time.sleep(0.05)
        if any(directory.glob(pattern)):
            saves.remove_partial_saves(directory, (pattern,), say=False)
            quiet_since = time.monotonic()


class ClosedLoopQuiet(contextlib.AbstractContextManager):
    """For one save: a ``sys.unraisablehook`` and a ``sys.excepthook`` that drop "Event loop is closed"
    and pass every other report on, the previous hooks back after the save. When a save fails (a full
    disk) tensorstore's remaining writes fail one by one and call back into orbax's event loop, which
    closed with the first failure; each would print a traceback around the run's one error line, as
    an unraisable exception or, from a native thread, through ``PyErr_Print`` (which calls
    ``sys.excepthook``). They start before orbax raises, so the hooks are in place from the save's
    start; after a failed save (``keep`` set) they stay, since those callbacks go on until the process,
    which stops on that failure, exits."""

    def __init__(self):
        self.keep = False

    def __enter__(self):
        self._hooks = sys.unraisablehook, sys.excepthook
        unraisable_hook, excepthook = self._hooks

        def on_unraisable(unraisable) -> None:
            if not closed_loop(unraisable.exc_value):
                unraisable_hook(unraisable)

        def on_exception(exc_type, exc, tb) -> None:
            if not closed_loop(exc):
                excepthook(exc_type, exc, tb)

        self._ours = on_unraisable, on_exception
        sys.unraisablehook, sys.excepthook = self._ours
        return self

    def __exit__(self, *exc) -> None:
        if not self.keep and (sys.unraisablehook, sys.excepthook) == self._ours:
            sys.unraisablehook, sys.excepthook = self._hooks


def closed_loop(exc: BaseException | None) -> bool:
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
