"""Fault injection: what a hostile user or a failing machine does to a run, and the one line (or the
safe fallback) each gets. Processes are killed or signalled at chosen points, two trainers share a
folder, writes fail; every test runs on 2 CPU cores."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, assert_one_error_line

from shared_data.core.errors import UserError
from shared_data.runtime import lock as run_lock
from shared_data.runtime import run

HOLD_LOCK = (
    "import sys, time; from pathlib import Path; from shared_data.runtime import lock; "
    "lock.acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
)


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 120) -> None:
    """Read ``proc``'s stdout until a line holds ``text``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"process ended ({proc.returncode}) before printing {text!r}")
    raise AssertionError(f"no {text!r} within {timeout} s")


def test_second_trainer_refuses_a_held_run_folder_and_takes_over_a_stale_lock(tiny_cfg, tmp_path, caplog):
    """Class 1: a folder locked by a live process is refused at once, naming host, pid and since when,
    before anything is written there; once that process is killed (-9, no clean-up) the lock is stale
    and the next run takes it over with a warning naming the dead holder."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(workdir)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    try:
        _wait_for_line(holder, "held")
        t0 = time.monotonic()
        with pytest.raises(UserError) as err:
            run.Run(tiny_cfg, workdir, "jax", "test", {}, 1)
        assert time.monotonic() - t0 < 5
        message = str(err.value)
        assert f"run folder {workdir} is in use by another trainer" in message
        assert f"host {platform.node()}, pid {holder.pid}, since 20" in message
        assert not (workdir / "out.log").exists()
    finally:
        holder.kill()
        holder.wait()
    with caplog.at_level(logging.WARNING, logger="dlas"):
        r = run.Run(tiny_cfg, workdir, "jax", "test", {}, 1)
    assert f"from a trainer that is gone (host {platform.node()}, pid {holder.pid}" in caplog.text
    assert json.loads((workdir / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    r.finish(None)
    assert (workdir / run_lock.LOCK_NAME).read_text() == ""  # released: the next run takes it silently


@pytest.mark.slow
def test_two_trainers_started_together_one_refuses(tmp_path, tiny_argv):
    """Class 1 end to end: two JAX trainers started at the same moment on one folder; one trains all
    epochs, the other ends in one error line naming the first, and metrics.jsonl holds one run."""
    argv = [*tiny_argv, "--set", "num_epochs=3", "--workdir", str(tmp_path / "w")]
    cmd = [sys.executable, "-m", "jax_impl.train", *argv]
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    winner = next(p for p in procs if p.returncode == 0)
    err = next(text for code, text in results if code == 2)
    refused = subprocess.CompletedProcess(cmd, 2, "", err)
    assert_one_error_line(refused, "is in use by another trainer", f"pid {winner.pid}")
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]
