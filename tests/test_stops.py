"""Stop signals that reach a run in its long phases outside the steps, and the whole process group
(SLURM's warning, a terminal's Ctrl-C): the run saves and stops within seconds with the kit's line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from shared_data.core.config import REPO_ROOT


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_sigterm_during_a_long_validation_pass_stops_within_seconds(tmp_path, tiny_argv, framework):
    """SIGTERM during a validation pass of many batches (here the fresh run's step-0 pass): the pass
    ends between batches with a line that says so, and the run saves at the next step boundary and
    stops within seconds (not after the whole pass), exit 143, no traceback."""
    workdir = tmp_path / "w"
    argv = [*tiny_argv, "--set", "Nsamples=16", "--set", "Nsamples_val=40000", "--num_devices", "1"]
    cmd = [sys.executable, "-m", f"{framework}_impl.train", *argv, "--workdir", str(workdir)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "start_new_session": True}
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, **pipes)
    try:
        seen = ""
        for line in proc.stdout:
            seen += line
            if "compile: train step" in line:
                break
        time.sleep(3)  # inside the pass of 10000 batches
        os.killpg(proc.pid, signal.SIGTERM)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = seen + out
    assert proc.returncode == 143, (proc.returncode, err[-3000:])
    assert took < 15, took
    assert "validation is cut short by SIGTERM" in log + err, (log + err)[-3000:]
    assert "stopped by SIGTERM" in err and "Traceback" not in err, err[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax"])  # the loader's processes are the same in both frameworks
def test_sigusr1_to_the_process_group_saves_with_the_kits_line_only(tmp_path, tiny_argv, framework):
    """SLURM's SIGUSR1 before the time limit reaches every process of the step, the lowmem loader's
    workers, its fork server and multiprocessing's resource tracker included: the run saves at the next
    step boundary and its stderr is the kit's one line (no worker lost, no tracker relaunched with a
    KeyError traceback per shared-memory segment)."""
    workdir = tmp_path / "w"
    argv = [*tiny_argv, "--set", "Nsamples=2048", "--set", "num_epochs=1", "--num_devices", "1"]
    cmd = [sys.executable, "-m", f"{framework}_impl.train", *argv, "--workdir", str(workdir)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "start_new_session": True}
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, **pipes)
    try:
        for line in proc.stdout:
            if "compile: train step" in line:
                break
        time.sleep(3)  # inside epoch 1's 512 steps
        os.killpg(proc.pid, signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 128 + signal.SIGUSR1, (proc.returncode, err[-3000:])
    assert len(lines) == 1 and lines[0].startswith("stopped by SIGUSR1 at epoch 1, step "), err[-3000:]
    assert "saved in" in lines[0] and (workdir / "mid_epoch").is_dir(), lines


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_validation_pass_cut_short_is_recorded_as_not_measured(tiny_cfg, tmp_path, framework, monkeypatch, caplog):
    """SIGTERM during epoch 1's validation pass (at its second batch of two): the pass ends there, and the
    epoch's line and record say its validation loss was not measured and which signal cut it short
    (``val_cut_short_by``, the loss NaN, not a measured divergence); the run stops once the epoch's
    checkpoint is written."""
    import importlib
    import json
    import logging
    import math

    from shared_data.core import config as config_mod
    from shared_data.runtime import signals

    train = importlib.import_module(f"{framework}_impl.train")
    make_input, passes = train.data_mod.make_input, [0]

    def signal_in_the_second_pass(cfg, split, *args):
        inp = make_input(cfg, split, *args)
        if split == "val":
            read = inp.epoch

            def epoch(e):
                passes[0] += 1  # epoch 1's validation (no TensorBoard: no step-0 pass)
                for i, batch in enumerate(read(e)):
                    if passes[0] == 1 and i == 1:
                        os.kill(os.getpid(), signal.SIGTERM)
                    yield batch

            inp.epoch = epoch
        return inp

    monkeypatch.setattr(train.data_mod, "make_input", signal_in_the_second_pass)
    cfg = config_mod.replace(tiny_cfg, num_epochs=2)
    workdir = tmp_path / "w"
    stopped = "stopped by SIGTERM between epochs: nothing is lost; the checkpoint of epoch 1 is kept"
    with caplog.at_level(logging.INFO, logger="dlas"), signals.handled(), pytest.raises(signals.Interrupted) as err:
        train.train_and_evaluate(cfg, workdir, num_devices=1)
    assert str(err.value).startswith(stopped), str(err.value)
    assert cfg.Nsamples_val // config_mod.batch_sizes(cfg)[0] == 2 and passes[0] == 1
    assert "validation is cut short by SIGTERM" in caplog.text
    assert "Avg val loss: not measured (the validation pass was cut short by SIGTERM)" in caplog.text
    (record,) = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert record["epoch"] == 1 and record["val_cut_short_by"] == "SIGTERM" and math.isnan(record["val_loss"])
    assert math.isfinite(record["train_loss"]) and (workdir / "checksums" / "1.json").is_file()
