"""The launch scripts under a real SLURM (the session's one-node cluster, ``scripts/slurm_local.sh``) and on
one host: ``sbatch --wait scripts/launch/submit_slurm.sh`` and ``NPROC=N scripts/launch/single_host.sh``
train the same experiment in JAX and TensorFlow with 2 and 4 processes (2 epochs of ``cpu_tiny``).

The two launches of one world size run the same processes on the same shards, so their epoch losses agree
to float32 reduction order; the tolerance, rtol 1e-5, is a few float32 roundings of a loss near 0.02 summed
over 4 replicas. JAX with 2 CPU devices in one process is the same experiment as 2 processes."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from shared_data.core.config import REPO_ROOT
from shared_data.runtime.records import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
RTOL = 1e-5
EPOCHS = ["--set", "num_epochs=2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(base: dict) -> dict:
    """CPU processes of one device each, running this checkout with this interpreter."""
    env = {k: v for k, v in base.items() if not k.startswith(("SLURM_JOB", "SLURM_STEP", "JAX_", "OMPI_", "TF_CONFIG"))}
    env.update(
        PY=sys.executable,
        PYTHONPATH=str(REPO_ROOT),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def sbatch(slurm_env: dict, framework: str, tasks: int, argv: list[str], out) -> tuple[str, str]:
    """``sbatch --wait`` of the kit's submit script with ``tasks`` tasks on the one node; returns the
    job id and the job's output (asserting it ended with 0)."""
    log = out.with_suffix(".out")
    cmd = ["sbatch", "--wait", "-N", "1", f"--ntasks-per-node={tasks}", "--cpus-per-task=1", f"--output={log}"]
    cmd += ["scripts/launch/submit_slurm.sh", framework, *argv]
    res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env=_env(slurm_env))
    text = log.read_text() if log.exists() else ""
    assert res.returncode == 0, res.stdout + res.stderr + text[-4000:]
    job = re.search(r"Submitted batch job (\d+)", res.stdout)
    assert job, res.stdout
    return job[1], text


def single_host(framework: str, nproc: int, argv: list[str]) -> str:
    """``NPROC=nproc bash scripts/launch/single_host.sh``; returns its output (asserting it ended with 0)."""
    env = _env(os.environ) | {"NPROC": str(nproc), "PORT": str(_free_port())}
    res = subprocess.run(
        ["bash", "scripts/launch/single_host.sh", framework, *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return res.stdout + res.stderr


def losses(workdir) -> np.ndarray:
    hist = read_metrics(workdir)
    assert [r["epoch"] for r in hist] == [1, 2]
    values = np.array([r["train_loss"] for r in hist] + [r["val_loss"] for r in hist])
    assert all(math.isfinite(v) for v in values)
    return values


def launch(workdir) -> dict:
    return json.loads((workdir / "run.json").read_text())["invocations"][-1]["launch"]


@pytest.mark.parametrize("tasks", [2, 4])
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_slurm_and_single_host_train_one_experiment(slurm, framework, tasks, tiny_argv, tmp_path):
    """The same run through sbatch and through single_host.sh: both finish, their run.json says how they
    were launched, their losses agree. With 2 processes both write --save_weights (equal weights); in TF
    the single-host run is also split by --stop_after_epoch and --resume (checkpoints of several workers)
    and the SLURM run evaluates time to quality every epoch."""
    argv = [*tiny_argv[1:], *EPOCHS]
    extra = tasks == 2
    quality = ["--save_weights", str(tmp_path / "slurm.npz")] if extra else []
    if extra and framework == "tf":  # the multi-worker path these features were fixed for
        quality += ["--set", "quality_every_epochs=1"]
    slurm_argv = [*argv, *quality, "--workdir", str(tmp_path / "slurm")]
    job, out = sbatch(slurm, framework, tasks, slurm_argv, tmp_path / "job")
    assert out.count("Time taken for epoch 2 is") == 1, out[-3000:]
    local = [*argv, "--workdir", str(tmp_path / "local")]
    if extra and framework == "tf":
        single_host(framework, tasks, [*local, "--stop_after_epoch", "1"])
        single_host(framework, tasks, [*local, "--resume", "--save_weights", str(tmp_path / "local.npz")])
    else:
        single_host(framework, tasks, [*local, "--save_weights", str(tmp_path / "local.npz")] if extra else local)

    np.testing.assert_allclose(losses(tmp_path / "local"), losses(tmp_path / "slurm"), rtol=RTOL)
    host = socket.gethostname().split(".")[0]
    assert launch(tmp_path / "slurm") == {"scheduler": "slurm", "job_id": job, "tasks": tasks, "hosts": [host]}
    assert launch(tmp_path / "local")["scheduler"] == "none" and launch(tmp_path / "local")["tasks"] == tasks
    if extra and framework == "tf":
        records = [json.loads(line) for line in (tmp_path / "slurm" / "quality.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in records] == [1, 2]
    if extra:
        a, b = np.load(tmp_path / "slurm.npz"), np.load(tmp_path / "local.npz")
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=1e-7, err_msg=k)
        if framework == "jax":  # 2 devices of one process: the same experiment as 2 processes
            env = _env(os.environ) | {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
            cmd = [sys.executable, "-m", "jax_impl.train", *tiny_argv, *EPOCHS, "--workdir", str(tmp_path / "devices")]
            res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
            assert res.returncode == 0, res.stderr[-3000:]
            np.testing.assert_allclose(losses(tmp_path / "devices"), losses(tmp_path / "slurm"), rtol=RTOL)


def _job_gone(job: str, env: dict) -> bool:
    res = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, env=env)
    return res.returncode != 0 or not res.stdout.strip()


def _job_state(job: str, env: dict) -> str:
    res = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, env=env)
    return res.stdout.strip()


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_scontrol_requeue_mid_epoch_resumes_the_same_experiment(slurm, framework, tiny_argv, tmp_path):
    """``scontrol requeue`` of a 2-task job inside its second epoch: SLURM's SIGTERM stops both tasks at
    one step boundary with a mid-epoch checkpoint, the requeued job (SLURM_RESTART_COUNT=1, no --resume)
    continues from that step, and the run ends with the losses and weights of the same run launched
    without interruption (``single_host.sh``, 2 processes). (Over 200 steps, float32 reduction order
    alone moves Adam's losses by ~1e-3 between world sizes: the world-size tests use a few steps.)"""
    steps = 100  # epoch 2 lasts seconds, so the requeue lands inside it
    # inmem: TF's lowmem worker processes do not yet outlive SLURM's SIGTERM to the whole step (issue 41)
    argv = [*tiny_argv[1:], "--set", "num_epochs=2", "--set", f"Nsamples={4 * steps}", "--data_loader_config", "inmem"]
    env = _env(slurm)
    single_host(framework, 2, [*argv, "--workdir", str(tmp_path / "one"), "--save_weights", str(tmp_path / "one.npz")])

    log = tmp_path / "job.out"
    run_argv = [*argv, "--workdir", str(tmp_path / "slurm"), "--save_weights", str(tmp_path / "slurm.npz")]
    submit = ["sbatch", "--parsable", "-N", "1", "--ntasks-per-node=2", "--cpus-per-task=1", "--requeue"]
    submit += ["--open-mode=append", f"--output={log}", "scripts/launch/submit_slurm.sh", framework, *run_argv]
    res = subprocess.run(submit, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 600
    while not (log.exists() and "Input wait" in log.read_text()):  # the last line of epoch 1
        assert time.monotonic() < deadline and not _job_gone(job, env), log.read_text()[-3000:] if log.exists() else ""
        time.sleep(0.1)
    time.sleep(1.0)
    requeue = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, env=env)
    assert requeue.returncode == 0, requeue.stderr
    # SLURM holds a requeued job back (begin time = requeue + the credential lifetime, 121 s) once its
    # tasks have ended (COMPLETING -> PENDING); an earlier begin time set before that is overwritten
    while _job_state(job, env) != "PENDING":
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    update = ["scontrol", "update", f"JobId={job}", "StartTime=now"]
    update = subprocess.run(update, capture_output=True, text=True, env=env)
    assert update.returncode == 0, update.stderr
    while not _job_gone(job, env):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    text = log.read_text()
    stop = re.search(r"stopped by SIGTERM at epoch 2, step (\d+) of 100: saved in", text)
    assert stop, text[-4000:]
    assert f"at epoch 2, step {stop[1]} of 100" in text[stop.end() :], text[-4000:]  # the requeued job's resume
    assert text.count("Time taken for epoch 2 is") == 1, text[-4000:]
    info = json.loads((tmp_path / "slurm" / "run.json").read_text())
    assert [i["launch"]["job_id"] for i in info["invocations"]] == [job, job]
    np.testing.assert_allclose(losses(tmp_path / "slurm"), losses(tmp_path / "one"), rtol=RTOL)
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "slurm.npz")
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
