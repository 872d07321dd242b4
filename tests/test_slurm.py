"""The launch scripts under a real SLURM (the session's one-node cluster, ``scripts/slurm_local.sh``) and on
one host: ``sbatch scripts/launch/submit_slurm.sh`` and ``NPROC=N scripts/launch/single_host.sh`` train
the same experiment in JAX and TensorFlow with 2 and 4 processes (2 epochs of ``cpu_tiny``), and a
2-task job requeued inside an epoch resumes from that step as the same experiment.

The two launches of one world size run the same processes on the same shards, so their epoch losses agree
to float32 reduction order; the tolerance, rtol 1e-5, is a few float32 roundings of a loss near 0.02 summed
over 4 replicas. JAX with 2 CPU devices in one process is the same experiment as 2 processes. (Across
world sizes, ``experiments/scaling_cpu`` gives the table.)"""

from __future__ import annotations

import importlib
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
from conftest import run_in_process
from processes import cpu_xla_flags, interpreter

from shared_data.core.config import REPO_ROOT
from shared_data.runtime.records import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
RTOL = 1e-5
STEPS = 4  # an epoch of the 2-task runs; the requeued job's tasks wait for SLURM's SIGTERM in step 2 of epoch 2
TWO_TASKS = ["--set", "num_epochs=2", "--set", f"Nsamples={4 * STEPS}"]  # cpu_tiny: global batch 4
FOUR_TASKS = ["--set", "num_epochs=2", "--set", "Nsamples=8", "--set", "unet_widths=[4, 8]"]  # 2 steps an epoch


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
        XLA_FLAGS=cpu_xla_flags(1),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def sbatch(slurm_env: dict, framework: str, tasks: int, argv: list[str], out) -> tuple[str, str]:
    """``sbatch`` of the kit's submit script with ``tasks`` tasks on the one node and the wait until the
    job has ended; returns the job id and the job's output (asserting it ended with 0). The wait asks
    ``scontrol`` every 0.2 s (``sbatch --wait`` asks every 2 s)."""
    log = out.with_suffix(".out")
    cmd = ["sbatch", "--parsable", "-N", "1", f"--ntasks-per-node={tasks}", "--cpus-per-task=1", f"--output={log}"]
    cmd += ["scripts/launch/submit_slurm.sh", framework, *argv]
    env = _env(slurm_env)
    res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.strip().split(";")[0]
    assert job.isdigit(), res.stdout
    deadline = time.monotonic() + 900
    output = lambda: log.read_text()[-4000:] if log.exists() else ""
    while (end := _job_end(job, env)) is None:
        assert time.monotonic() < deadline, output()
        time.sleep(0.2)
    assert end == ("COMPLETED", "0:0"), f"job {job}: {end}\n{output()}"
    text = log.read_text() if log.exists() else ""
    return job, text


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


def _job_gone(job: str, env: dict) -> bool:
    """The job has left the queue: squeue lists it no more, or no longer knows its id. Another failure
    of squeue (a controller too busy to answer) is no answer, so the job is not taken as gone."""
    res = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        return "Invalid job id" in res.stderr
    return not res.stdout.strip()


def _job_state(job: str, env: dict) -> str:
    res = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, env=env)
    return res.stdout.strip()


def _job_record(job: str, env: dict) -> subprocess.CompletedProcess:
    """``scontrol show job -o`` of ``job``: its record on one line (stdout), or why not (stderr)."""
    return subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env)


def _restarts(job: str, env: dict) -> int:
    """How many times SLURM has requeued ``job`` (``Restarts`` of its record; 0 where it does not answer)."""
    count = re.search(r"\bRestarts=(\d+)", _job_record(job, env).stdout)
    return int(count[1]) if count else 0


def _job_end(job: str, env: dict, restarts: int = 0) -> tuple[str, str] | None:
    """``(JobState, ExitCode)`` of a job that has ended after at least ``restarts`` requeues, None while
    it is pending, running or completing, has been requeued fewer times (or scontrol does not answer);
    ``("GONE", "")`` once SLURM no longer knows the job (``scontrol show job`` keeps an ended job's
    record for MinJobAge = 4 s)."""
    res = _job_record(job, env)
    if res.returncode != 0:
        return ("GONE", "") if "Invalid job id" in res.stderr else None
    state, code = re.search(r"\bJobState=(\S+)", res.stdout), re.search(r"\bExitCode=(\S+)", res.stdout)
    count = re.search(r"\bRestarts=(\d+)", res.stdout)
    if not (state and code and count) or state[1] in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED"):
        return None
    return (state[1], code[1]) if int(count[1]) >= restarts else None


def sbatch_requeued_mid_epoch(
    slurm_env: dict, framework: str, argv: list[str], log, folder, by: str = "scontrol"
) -> str:
    """``sbatch --requeue`` of the submit script with 2 tasks whose trainers wait for a signal in step
    2 of epoch 2 (``PY`` is :func:`processes.interpreter`, its file in ``folder``), once they wait
    ``scontrol requeue`` of the job (``by="scontrol"``) or SLURM's warning SIGUSR1 to its tasks
    (``by="USR1"``: ``scancel --signal=USR1``; the trainer requeues the job), and the wait until the
    requeued job has ended; returns the job id. The job's output, both runs of it, is in ``log``.
    With ``by="USR1"`` the wait ends once SLURM has requeued the job (``Restarts=1``) and its first
    run's tasks have ended; the job is then cancelled (the requeued run is the scontrol case's)."""
    waiting = folder / "waiting"
    env = _env(slurm_env) | {"PY": str(interpreter(folder, STEPS + 1, f"wait:{waiting}"))}
    submit = ["sbatch", "--parsable", "-N", "1", "--ntasks-per-node=2", "--cpus-per-task=1", "--requeue"]
    submit += ["--open-mode=append", f"--output={log}", "scripts/launch/submit_slurm.sh", framework, *argv]
    res = subprocess.run(submit, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 600
    output = lambda: log.read_text()[-3000:] if log.exists() else ""
    while not waiting.exists():
        assert time.monotonic() < deadline and not _job_gone(job, env), output()
        time.sleep(0.1)
    cmd = ["scontrol", "requeue", job] if by == "scontrol" else ["scancel", "--signal=USR1", job]
    requeue = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert requeue.returncode == 0, requeue.stderr
    if by == "USR1":
        while not (re.search(r"tasks? .*Exited with exit code", output()) and _restarts(job, env) >= 1):
            assert time.monotonic() < deadline, output()
            time.sleep(0.2)
        subprocess.run(["scancel", job], capture_output=True, env=env)
        while not _job_gone(job, env):
            assert time.monotonic() < deadline, output()
            time.sleep(0.2)
        return job
    # SLURM holds a requeued job back (begin time = now + its credential lifetime, 121 s) once its
    # tasks have ended (COMPLETING -> PENDING); a begin time set before that is overwritten
    while _job_state(job, env) != "PENDING":
        assert time.monotonic() < deadline, output()
        time.sleep(0.2)
    update = ["scontrol", "update", f"JobId={job}", "StartTime=now"]
    update = subprocess.run(update, capture_output=True, text=True, env=env)
    assert update.returncode == 0, update.stderr
    # the requeued run's start, by its line in the log: between the first run's end and the requeued
    # job's PENDING state, scontrol may show the first run's end state with the restart count already 1
    while "SLURM_RESTART_COUNT=1" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and not _job_gone(job, env), output()
        time.sleep(0.2)
    # the end of the requeued run, by scontrol's state and restart count: an empty answer of squeue
    # does not say that the requeued run has ended and written its log
    while (end := _job_end(job, env, restarts=1)) is None:
        assert time.monotonic() < deadline, output()
        time.sleep(0.5)
    assert end == ("COMPLETED", "0:0"), f"job {job}: {end}\n{_job_record(job, env).stdout}\n{output()}"
    return job


def assert_same_weights(path_a, path_b, rtol: float = RTOL, atol: float = 1e-7) -> None:
    a, b = np.load(path_a), np.load(path_b)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_two_tasks_requeued_mid_epoch_train_the_experiment_of_two_processes(slurm, framework, tiny_argv, tmp_path):
    """A 2-task job of ``submit_slurm.sh`` requeued inside its second epoch (``scontrol requeue``
    while its tasks wait in step 2): SLURM's SIGTERM stops both tasks at one step boundary with a
    mid-epoch checkpoint, rank 0 sees the job requeued already, the requeued job
    (SLURM_RESTART_COUNT=1, no --resume) continues from that step, and the run ends with the epoch
    losses and the --save_weights of 2 processes of ``single_host.sh`` run without interruption;
    run.json records both runs of the job and the launch.
    The loader is ``lowmem``: its worker processes outlive SLURM's SIGTERM to every process of the step.
    TF: the job also evaluates time to quality every epoch, across the requeue. JAX: the uninterrupted
    run is 2 devices of one process (the 2 processes of ``single_host.sh``: tests/test_launch.py)."""

    def run(name: str) -> list[str]:
        folder = tmp_path / name
        return [*tiny_argv[1:], *TWO_TASKS, "--save_weights", f"{folder}.npz", "--workdir", str(folder)]

    quality = ["--set", "quality_every_epochs=1"] if framework == "tf" else []  # the multi-worker path it was fixed for
    records = tmp_path / "slurm" / "quality.jsonl"
    log = tmp_path / "job.out"
    job = sbatch_requeued_mid_epoch(slurm, framework, [*run("slurm"), *quality], log, tmp_path)
    if framework == "tf":
        single_host(framework, 2, run("local"))
        assert launch(tmp_path / "local")["scheduler"] == "none" and launch(tmp_path / "local")["tasks"] == 2
    else:  # 2 devices of one process (conftest's XLA_FLAGS): the experiment of 2 processes
        from jax_impl import train as jax_train

        res = run_in_process(jax_train.main, ["--config", *run("local")])  # run(): the config name first
        assert res.returncode == 0, res.stderr[-3000:]

    text = log.read_text()
    stop = re.search(rf"stopped by SIGTERM at epoch 2, step 3 of {STEPS}: saved in .*; the job is requeued", text)
    assert stop and "is requeued already" in text, text[-4000:]
    assert f"at epoch 2, step 3 of {STEPS} (a stop" in text[stop.end() :], text[-4000:]
    assert text.count("Time taken for epoch 2 is") == 1, text[-4000:]
    info = json.loads((tmp_path / "slurm" / "run.json").read_text())
    assert [i["launch"]["job_id"] for i in info["invocations"]] == [job, job]
    host = socket.gethostname().split(".")[0]
    assert launch(tmp_path / "slurm") == {"scheduler": "slurm", "job_id": job, "tasks": 2, "hosts": [host]}
    np.testing.assert_allclose(losses(tmp_path / "slurm"), losses(tmp_path / "local"), rtol=RTOL)
    assert_same_weights(tmp_path / "local.npz", tmp_path / "slurm.npz")
    if framework == "tf":
        assert [json.loads(line)["epoch"] for line in records.read_text().splitlines()] == [1, 2]


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_job_requeued_by_its_usr1_warning_prints_the_kits_lines_only(slurm, framework, tiny_argv, tmp_path):
    """SLURM's warning SIGUSR1 to both tasks of a ``--requeue`` job inside epoch 2: the trainers stop at
    one step boundary with a mid-epoch checkpoint, process 0 requeues the job (SLURM counts a restart),
    and SLURM then ends the step's processes (the ``lowmem`` loaders' workers and resource trackers
    among them) as they exit. The job's output holds the kit's lines and SLURM's only: no traceback
    and no resource tracker's warning of leaked semaphores or shared memory. (The requeued run's
    resume from the mid-epoch checkpoint: the scontrol requeue test above.)"""
    workdir = tmp_path / "slurm"
    argv = [*tiny_argv[1:], *TWO_TASKS, "--workdir", str(workdir)]
    log = tmp_path / "job.out"
    job = sbatch_requeued_mid_epoch(slurm, framework, argv, log, tmp_path, by="USR1")
    text = log.read_text()
    stop = rf"stopped by SIGUSR1 at epoch 2, step 3 of {STEPS}: saved in .*; the job is requeued"
    assert re.search(stop, text), text[-4000:]
    assert f"SLURM job {job} requeued: it resumes from this step" in text, text[-4000:]
    assert (workdir / "mid_epoch" / "cursor.json").is_file()
    foreign = [line for line in text.splitlines() if re.search(r"resource_tracker|leaked|Traceback|Error", line)]
    assert not foreign, "\n".join(foreign[:20])


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_four_tasks_and_one_process_train_one_experiment(slurm, framework, tiny_argv, tmp_path):
    """``sbatch --wait`` of a 4-task job (4 processes on 2 cores; a 2-level net, 2 steps an epoch) and
    one process in this interpreter: both finish, the job's run.json says how it was launched, and the
    epoch losses of world size 4 are those of world size 1 (one experiment on any world size; the
    launch record of ``single_host.sh`` is checked by the 2-task test and tests/test_launch.py)."""
    argv = [*tiny_argv[1:], *FOUR_TASKS]
    job, out = sbatch(slurm, framework, 4, [*argv, "--workdir", str(tmp_path / "slurm")], tmp_path / "job")
    assert out.count("Time taken for epoch 2 is") == 1, out[-3000:]
    trainer = importlib.import_module(f"{framework}_impl.train")
    res = run_in_process(trainer.main, [*tiny_argv, *FOUR_TASKS, "--workdir", str(tmp_path / "one")])
    assert res.returncode == 0, res.stderr[-3000:]
    np.testing.assert_allclose(losses(tmp_path / "one"), losses(tmp_path / "slurm"), rtol=RTOL)
    host = socket.gethostname().split(".")[0]
    assert launch(tmp_path / "slurm") == {"scheduler": "slurm", "job_id": job, "tasks": 4, "hosts": [host]}
    assert launch(tmp_path / "one")["scheduler"] == "none" and launch(tmp_path / "one")["tasks"] == 1
