"""Signals at the edges of a run: SIGTERM and Ctrl-C (SIGINT) while the framework imports, while the
process exits, inside a finaliser that drops the exception, after a library replaced the handlers, and
while a loader's workers start (a group signal reaches them too). Each ends in one sentence and exit
code 128 + the signal; none is lost."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shared_data.core.config import REPO_ROOT
from shared_data.runtime import signals, steps
from shared_data.runtime.epoch_report import EpochReport
from shared_data.runtime.run_folder import RunFolder

#: A shared library that each framework loads early in its import.
FRAMEWORK_LIBRARY = {"jax": "jaxlib/", "tf": "libtensorflow_framework"}


def _wait_for_library(pid: int, library: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                if library in fh.read():
                    return
        except FileNotFoundError:
            pytest.fail(f"the trainer ended before it loaded {library}")
        time.sleep(0.02)
    pytest.fail(f"the trainer did not load {library} in {timeout} s")


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/<pid>/maps to see the import")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_signal_while_the_framework_imports_is_one_sentence(tiny_argv, tmp_path, framework, signum):
    """Ctrl-C or SIGTERM to the process group while ``import jax`` / ``import tensorflow`` runs: one
    sentence, exit 130 / 143, no run folder (was: a KeyboardInterrupt traceback from inside the
    import, or a silent death by SIGTERM)."""
    cmd = [sys.executable, "-m", f"{framework}_impl.train", *tiny_argv, "--workdir", str(tmp_path / "w")]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for_library(proc.pid, FRAMEWORK_LIBRARY[framework])
        os.killpg(proc.pid, signum)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    name = signal.Signals(signum).name
    assert (proc.returncode, err.decode()) == (
        128 + signum,
        f"stopped by {name} before training started: nothing is lost\n",
    ), out.decode()[-2000:]
    assert not (tmp_path / "w").exists()


def _command(body: str) -> subprocess.CompletedProcess:
    """``body`` run by a fresh interpreter that guards its signals as a trainer command does."""
    script = "import os, signal, time\nfrom shared_data.runtime import signals\nsignals.guard_command()\n"
    return subprocess.run(
        [sys.executable, "-c", script + textwrap.dedent(body)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


@pytest.mark.parametrize("case", ["exit hangs", "exit ends", "second signal"])
def test_a_signal_while_the_command_exits_lets_the_exit_finish_for_a_grace(case):
    """After the trainer's handlers are gone (the run is written, the interpreter exits), a SIGTERM
    (a scheduler's to every process of the job as the run exits) lets the exit finish: an exit that
    ends within the grace (1 s here) ends with its own code and nothing more; one that hangs ends when
    the grace is over, with the signal's sentence and 143, not silently and not ignored; a second
    signal ends it at once."""
    start = time.monotonic()
    res = _command(
        f"""
        signals.EXIT_GRACE_S = 1.0
        with signals.handled():
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        if {case!r} == "second signal":
            os.kill(os.getpid(), signal.SIGINT)
        if {case!r} != "exit ends":
            time.sleep(30)
        print("closed")
        raise SystemExit(138)
        """
    )
    seconds = time.monotonic() - start
    if case == "exit ends":
        assert (res.returncode, res.stdout, res.stderr) == (138, "closed\n", "")
        return
    signal_name = "SIGTERM" if case == "exit hangs" else "SIGINT"
    assert (res.returncode, res.stdout, res.stderr) == (
        128 + signal.Signals[signal_name],
        "",
        f"stopped by {signal_name} as the command exited: what it reported stands\n",
    )
    assert (seconds > 1.0) == (case == "exit hangs") and seconds < 20, seconds


@pytest.mark.parametrize("case", ["exit ends", "exit hangs"])
def test_the_schedulers_sigterm_after_a_stops_save_leaves_the_stops_line(case):
    """Once a stop's save is written (:func:`signals.exiting`), SLURM's SIGTERM to every task (process
    0 requeued the job) and another SIGUSR1 do not replace the stop's line and exit code: an exit that
    ends within the grace (1 s here) ends with the stop's own line and 138; one that hangs ends when
    the grace is over, with a line that says the save stands, and 143."""
    start = time.monotonic()
    res = _command(
        f"""
        from shared_data.core.errors import run_cli
        signals.EXIT_GRACE_S = 1.0

        def main(argv):
            with signals.handled():
                signals.exiting("after its save at epoch 2, step 3, which stands")
                os.kill(os.getpid(), signal.SIGUSR1)
                os.kill(os.getpid(), signal.SIGTERM)
                try:
                    raise signals.Interrupted(signal.SIGUSR1, "at epoch 2, step 3 of 4: saved")
                finally:
                    if {case!r} == "exit hangs":
                        time.sleep(30)

        raise SystemExit(run_cli(main, []))
        """
    )
    seconds = time.monotonic() - start
    if case == "exit ends":
        assert (res.returncode, res.stderr) == (138, "stopped by SIGUSR1 at epoch 2, step 3 of 4: saved\n")
        return
    assert (res.returncode, res.stderr) == (
        143,
        "stopped by SIGTERM as it exited after its save at epoch 2, step 3, which stands\n",
    )
    assert 1.0 < seconds < 20, seconds


def test_a_stop_request_while_the_command_starts_stops_at_the_first_step():
    """SIGUSR1 (SLURM's warning) during the start is kept: the first step boundary honours it."""
    res = _command(
        """
        os.kill(os.getpid(), signal.SIGUSR1)
        with signals.handled():
            print(signals.stop_requested() == signal.SIGUSR1)
        """
    )
    assert (res.returncode, res.stdout.strip(), res.stderr) == (0, "True", "")


class _SignalInFinaliser:
    """A finaliser during which a signal arrives: Python runs the handler there, and the exception it
    raises is printed ("Exception ignored in ...") and dropped."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs between these bytecodes, inside the finaliser
            pass


def test_a_signal_lost_in_a_finaliser_is_raised_at_the_next_safe_point(capsys):
    with signals.handled():
        _SignalInFinaliser()  # finalised at once: the Interrupted raised inside it is lost
        gc.collect()
        with pytest.raises(signals.Interrupted, match=r"^stopped by SIGINT before training started"):
            signals.raise_pending()  # a step boundary
    assert "Exception ignored" not in capsys.readouterr().err


def test_handlers_a_library_replaced_are_installed_again():
    """A native library that installs its own SIGTERM handler while it starts (``sigaction``, which
    Python does not see) would take the signal from the run; after the start :func:`signals.reclaim`
    installs the run's handlers again."""
    with signals.handled():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what such a library does
        signals.reclaim()
        with pytest.raises(signals.Interrupted, match=r"^stopped by SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_loader_broken_by_a_group_signal_reports_the_signal(tiny_cfg, tmp_path, signum):
    """A signal to the process group reaches the loader's workers as well; one that dies while it
    starts fails the batch ("a lowmem worker ... ended unexpectedly"): the run ends in the signal's
    sentence, not the loader's traceback."""

    def broken_by_the_signal():
        os.kill(os.getpid(), signum)
        raise RuntimeError("a lowmem worker reading train_32.h5 ended unexpectedly")
        yield

    folder, batches = RunFolder(tiny_cfg, tmp_path, "jax", "test", {}, 1), broken_by_the_signal()
    with signals.handled(), pytest.raises(signals.Interrupted) as stopped:
        signals.set_describe(folder.position.where)
        EpochReport(folder, 0.0).begin(0, {})
        with signals.deferred(), signals.stoppable():  # as the trainers' epoch loop and steps
            for _ in steps.epoch_steps(folder, 0):
                with signals.signal_first():  # as the trainers' wait for a batch
                    next(batches)
    folder.close()
    assert stopped.value.exit_code == 128 + signum
    assert str(stopped.value).startswith(f"stopped by {signal.Signals(signum).name} during epoch 1 (step 1 of ")
