"""The trainers' signal handling (:mod:`shared_data.runtime.signals`) with real signals sent to this
process: a C handler that replaced Python's is replaced back, and a SIGTERM held between epochs is a
stop request once the steps begin."""

from __future__ import annotations

import ctypes
import os
import signal

import pytest

from shared_data.runtime import signals

SIG_IGN = ctypes.c_void_p(1)  # <signal.h>: what a library's own handler does to Python's, for the test


def _c_signal(signum: int, handler: ctypes.c_void_p) -> int:
    libc = ctypes.CDLL(None)
    libc.signal.restype, libc.signal.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p]
    return libc.signal(signum, handler)


def test_reinstall_takes_sigterm_back_from_a_c_handler():
    """A library that sets its own C handler for SIGTERM (TensorFlow's coordination service does)
    leaves Python's in ``signal.getsignal`` but never runs it; after :func:`signals.reinstall` a
    SIGTERM during the steps is a stop request again."""
    with signals.handled(), signals.stoppable():
        _c_signal(signal.SIGTERM, SIG_IGN)
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.stop_requested() is None and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
        signals.reinstall()
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.stop_requested() == signal.SIGTERM


def test_a_sigterm_held_before_the_steps_asks_for_a_stop():
    """SIGTERM inside :func:`signals.deferred` (between epochs) is held; when the steps begin it is a
    stop at the first step boundary, not an :class:`signals.Interrupted` there."""
    with signals.handled(), signals.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.stop_requested() is None
        with signals.stoppable():
            try:  # what the loop does at each step boundary: nothing is held now
                signals.raise_pending()
            except signals.Interrupted as err:  # a KeyboardInterrupt: it would end the test session
                pytest.fail(f"raised {err}")
            assert signals.stop_requested() == signal.SIGTERM
