"""The trainers' signal handling (:mod:`shared_data.runtime.signals`) with real signals sent to this
process: a C handler that replaced Python's is replaced back, a SIGTERM held between epochs is a
stop request once the steps begin, and Ctrl-C ends a command at once while a compiled step runs."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


#: A command (through ``run_cli``) that dispatches a JAX computation of minutes, says so and waits for it.
#: It takes Python's own SIGINT handler first, as a command started from a terminal has it: a process
#: started from a background job of a shell (``bash scripts/test.sh &``) inherits SIGINT ignored.
LONG_STEP = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import jax, jax.numpy as jnp
from shared_data.core.errors import run_cli

def main(argv):
    x = jnp.ones((256, 256)) / 256
    step = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda i, y: jnp.tanh(y @ x), x))
    step(x, 1).block_until_ready()
    y = step(x, 10**9)
    print("dispatched", flush=True)
    y.block_until_ready()

raise SystemExit(run_cli(main))
"""


def test_ctrl_c_ends_a_command_while_its_step_still_runs():
    """Ctrl-C while a compiled step runs (a step of a GPU-sized config on a CPU takes minutes) prints
    ``interrupted`` and ends the process at once with exit code 130, instead of the interpreter's exit
    waiting for the dispatched work to finish."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-c", LONG_STEP], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "dispatched\n", proc.stderr.read()
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        code = proc.wait(timeout=30)
        seconds = time.monotonic() - t0
    finally:
        proc.kill()
    assert code == 130 and proc.stderr.read().strip().splitlines()[-1] == "interrupted"
    assert seconds < 10


def test_the_unraisable_hook_of_the_block_is_undone_unless_another_was_installed_over_it():
    """:func:`signals.handled` puts back the unraisable hook it found; one installed inside the block
    (the JAX checkpoint's, whose failed save's callbacks still come after the command returns) stays,
    with the block's own dropping :class:`signals.Interrupted` still in its chain."""
    before = sys.unraisablehook
    seen = []

    def installed_inside(unraisable):
        seen.append(unraisable.exc_value)
        inner(unraisable)

    try:
        with signals.handled():
            inner = sys.unraisablehook
        assert sys.unraisablehook is before
        with signals.handled():
            inner = sys.unraisablehook
            sys.unraisablehook = installed_inside
        assert sys.unraisablehook is installed_inside
        interrupted = signals.Interrupted(signal.SIGTERM, "test")
        sys.unraisablehook(type("U", (), {"exc_value": interrupted})())  # dropped by the block's hook
        assert seen == [interrupted]
    finally:
        sys.unraisablehook = before
