"""Launching several processes: the GPUs each SLURM task drives under the bindings SLURM offers, JAX
processes under a simulated SLURM step, N processes on one host through scripts/launch/single_host.sh
(the rank tags, the dated lines), TensorFlow's SLURM resolver and its quiet start-up."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest
from processes import cpu_xla_flags, process_env

from shared_data.core.config import REPO_ROOT
from shared_data.core.errors import UserError
from shared_data.runtime import launch
from shared_data.runtime.logs import native_line_shown


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_env(procid: int, ntasks: int = 2, nodes: int = 1, **extra: str) -> dict[str, str]:
    """The variables ``srun -n NTASKS`` sets for task ``procid`` of a step on ``nodes`` nodes (localhost)."""
    per_node = ntasks // nodes
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % per_node),
        "SLURM_NODEID": str(procid // per_node),
    }
    return {**env, **extra}


@pytest.mark.parametrize(
    "extra, ntasks, procid, expected",
    [
        ({}, 4, 2, None),  # CUDA_VISIBLE_DEVICES unset: every GPU of the node, JAX picks [SLURM_LOCALID]
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4, 2, [2]),  # --gpus-per-node=4: task 2 drives GPU 2
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 4, 3, [6, 7]),  # two GPUs per task
        ({"CUDA_VISIBLE_DEVICES": "2", "SLURM_GPUS_PER_TASK": "1"}, 4, 2, [0]),  # --gpus-per-task=1, no cgroup
        ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_PER_TASK": "1"}, 4, 2, [0]),  # --gpus-per-task=1, cgroup
        ({"CUDA_VISIBLE_DEVICES": "1"}, 4, 1, [0]),  # --gpu-bind=single:1
        ({"CUDA_VISIBLE_DEVICES": "4,5", "SLURM_GPUS_PER_TASK": "2"}, 2, 1, [0, 1]),  # 2 GPUs bound per task
    ],
)
def test_each_slurm_task_drives_the_gpus_slurm_gives_it(extra, ntasks, procid, expected):
    assert launch.task_gpus(slurm_env(procid, ntasks, **extra)) == expected


def test_gpus_seen_by_the_framework_when_slurm_names_none():
    assert launch.task_gpus(slurm_env(1, 2), seen=4) == [2, 3]
    assert launch.task_gpus(slurm_env(1, 2), seen=0) == []  # a CPU node


def test_no_slurm_step_means_no_binding():
    env = slurm_env(0, 2, CUDA_VISIBLE_DEVICES="0,1")
    assert launch.task_gpus({**env, "SLURM_STEP_NUM_TASKS": "1"}) is None  # one task
    salloc = {k: v for k, v in env.items() if not k.startswith("SLURM_STEP")}  # a shell in an allocation
    assert not launch.slurm_step(salloc) and launch.task_gpus(salloc) is None


def test_a_tf_process_joins_workers_under_tf_config_or_a_slurm_step_of_several_tasks():
    """The processes that hold SIGTERM for the start's watchdog until they have joined (tf_impl)."""
    assert launch.joins_workers({"TF_CONFIG": '{"cluster": {}}'}) and launch.joins_workers(slurm_env(1, 2))
    assert not launch.joins_workers({}) and not launch.joins_workers({"TF_CONFIG": ""})
    assert not launch.joins_workers({**slurm_env(0, 2), "SLURM_STEP_NUM_TASKS": "1"})  # one task
    assert not launch.joins_workers({**slurm_env(0, 2), "SLURM_STEP_NUM_TASKS": "two"})  # the join names it


def test_uneven_gpus_over_tasks_is_one_error():
    with pytest.raises(UserError, match=r"3 GPUs visible to 2 tasks on this node"):
        launch.task_gpus(slurm_env(0, 2, CUDA_VISIBLE_DEVICES="0,1,2"))


@pytest.mark.parametrize("spec, node, tasks", [("4(x2)", 1, 4), ("4,3", 1, 3), ("2(x2),1", 2, 1), ("8", 0, 8)])
def test_tasks_per_node_in_slurms_notation(spec, node, tasks):
    env = {"SLURM_STEP_TASKS_PER_NODE": spec, "SLURM_NODEID": str(node)}
    assert launch.slurm_tasks_on_node(env) == tasks


#: What TF's persistent XLA cache logs as errors on a hit (the AOT line with the feature named).
CACHE_ENTRY = "Error parsing text-format tensorflow.XlaSerializedCacheEntry: 2:1: Expected identifier, got: 5"
AOT = "Loading XLA:CPU AOT result. Target machine feature +%s is not  supported on the host machine."
#: What grappler logs when its remapper pass cannot fuse in TF's step without XLA (the pass is skipped).
REMAPPER = (
    "remapper failed: INVALID_ARGUMENT: Mutation::Apply error: fanout 'StatefulPartitionedCall/gradient_tape/"
    "unet_1/last_1/ShapeN' exist for missing node 'StatefulPartitionedCall/unet_1/last_1/Pad'."
)


@pytest.mark.parametrize(
    "line, level, shown",
    [
        ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n", 2, False),
        ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n", 0, True),
        ("I0000 00:00:1796137816.120445    3126 port.cc:153] oneDNN custom operations are on.\n", 2, False),
        ("I0000 00:00:1796137816.120445    3126 port.cc:153] oneDNN custom operations are on.\n", 0, True),
        ("W0000 00:00:1796137816.120445    3126 gpu_device.cc:2] Cannot dlopen some GPU libraries.\n", 2, False),
        ("W0000 00:00:1796137816.120445    3126 gpu_device.cc:2] Cannot dlopen some GPU libraries.\n", 1, True),
        ("E0000 00:00:1796137816.120445    3126 cuda_dnn.cc:8] Unable to register cuDNN factory\n", 2, True),
        (f"E0000 00:00:1796285138.838106   11132 text_format.cc:378] {CACHE_ENTRY}\n", 1, False),
        (f"E0000 00:00:1796285138.838106   11132 text_format.cc:378] {CACHE_ENTRY}\n", 0, True),
        (f"E0000 00:00:1796285138.877718   11132 cpu_aot_loader.cc:220] {AOT % 'prefer-no-gather'}\n", 2, False),
        (f"E0000 00:00:1796285138.877718   11132 cpu_aot_loader.cc:220] {AOT % 'avx512f'}\n", 2, True),
        (f"E0000 00:00:1796295879.608620   10070 meta_optimizer.cc:967] {REMAPPER}\n", 2, False),
        (f"E0000 00:00:1796295879.608620   10070 meta_optimizer.cc:967] {REMAPPER}\n", 0, True),
        ("E0000 00:00:1796295879.608620   10070 meta_optimizer.cc:967] layout failed: INVALID_ARGUMENT: x\n", 2, True),
        ("Traceback (most recent call last):\n", 3, True),
    ],
)
def test_native_lines_follow_tf_cpp_min_log_level(line, level, shown):
    assert native_line_shown(line, level) is shown


def test_native_lines_filtered_forwards_the_last_words_of_an_abort():
    """C++ lines written inside ``native_lines_filtered`` pass by the level, the cache's false errors
    are dropped, and a process that aborts in the block still shows what it wrote before."""
    code = f"""
import os
from shared_data.runtime.logs import native_lines_filtered
with native_lines_filtered():
    os.write(2, b"I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on\\n")
    os.write(2, b"E0000 00:00:1.0 1 text_format.cc:378] {CACHE_ENTRY}\\n")
    os.write(2, b"F0000 00:00:1.0 1 conv.cc:9] Check failed: the last words\\n")
    os.abort()
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -6  # SIGABRT
    assert proc.stderr == "F0000 00:00:1.0 1 conv.cc:9] Check failed: the last words\n"


def test_jax_explicit_variables_need_all_three(monkeypatch):
    from jax_impl import cluster

    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1")
    monkeypatch.delenv("JAX_NUM_PROCESSES", raising=False)
    monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
    with pytest.raises(UserError, match="JAX_COORDINATOR_ADDRESS is set: set JAX_NUM_PROCESSES and JAX_PROCESS_ID"):
        cluster.initialize()
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS")
    for key in [k for k in os.environ if k.startswith(("SLURM_", "OMPI_"))]:
        monkeypatch.delenv(key)
    assert cluster.initialize() is None  # nothing describes a cluster: one process


def test_tf_slurm_worker_rank_and_resolver(monkeypatch):
    from tf_impl import cluster

    for key, value in slurm_env(3, ntasks=4, nodes=2).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node[01-02]")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster.process_index() == 3 and cluster.process_count() == 4
    assert cluster.initialize() == "tf.distribute (SLURM): worker 3 of 4, GPUs none of CUDA_VISIBLE_DEVICES=(unset)"
    resolver = cluster.slurm_resolver()  # no nvidia-smi here: the GPU count comes from initialize
    port = 40000 + 8 * (4242 % 2048)  # ports from the job id, so two jobs on one node seldom collide
    workers = [f"node0{n}:{port + i}" for n in (1, 2) for i in (0, 1)]
    assert resolver.cluster_spec().as_dict() == {"worker": workers}
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert resolver.num_accelerators() == {"GPU": 0}
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert cluster.process_index() == 0 and cluster.process_count() == 1 and cluster.initialize() is None


PROBE = """
import jax
from jax_impl import cluster
print(cluster.initialize())
print("local devices of process", [d.process_index for d in jax.local_devices()], "global", jax.device_count())
"""


@pytest.mark.slow
def test_jax_processes_under_a_simulated_slurm_step():
    """Two tasks of ``srun -n 2 --gpus-per-task=1`` (SLURM exports CUDA_VISIBLE_DEVICES=i per task,
    no device cgroup): JAX's own choice, [SLURM_LOCALID], would make task 1 ask for a GPU it cannot
    see; each task drives GPU 0 of those it sees, and the two join one run of two devices."""
    port = str(_free_port())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "OMPI_"))}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROBE],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={
                **base,
                **slurm_env(i, CUDA_VISIBLE_DEVICES=str(i), SLURM_GPUS_PER_TASK="1"),
                "JAX_COORDINATOR_PORT": port,
                "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
            },
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for i, out in enumerate(outs):
        assert (
            f"jax.distributed (SLURM): process {i} of 2, 1 local / 2 global devices, "
            f"GPUs 0 of CUDA_VISIBLE_DEVICES={i}" in out
        ), out
        assert f"local devices of process [{i}] global 2" in out, out


@pytest.mark.slow
def test_n_processes_on_one_host_tag_their_lines(tmp_path, tiny_argv):
    """``NPROC=2 scripts/launch/single_host.sh jax``: two JAX processes train one run; process 0 logs,
    process 1's line carries its rank tag; every line has a date; the run folder is printed."""
    workdir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "OMPI_"))}
    scratch = tmp_path / "scratch" / "jax-cache"  # where a centre points the cache
    env.update(NPROC="2", PORT=str(_free_port()), PY=sys.executable, JAX_PLATFORMS="cpu")
    env["JAX_COMPILATION_CACHE_DIR"] = str(scratch)
    env["XLA_FLAGS"] = cpu_xla_flags(1)
    res = subprocess.run(
        ["bash", "scripts/launch/single_host.sh", "jax", *tiny_argv[1:], "--workdir", str(workdir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    date = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.search(
        rf"^{date} \[rank 1\] INFO jax.distributed \(JAX_COORDINATOR_ADDRESS\): process 1 of 2, "
        r"1 local / 2 global devices",
        res.stdout,
        re.M,
    ), res.stdout
    assert re.search(rf"^{date} jax.distributed \(JAX_COORDINATOR_ADDRESS\): process 0 of 2", res.stdout, re.M)
    assert res.stdout.count("Time taken for epoch 1 is") == 1
    assert f"run folder: {workdir}" in res.stdout
    launch = json.loads((workdir / "run.json").read_text())["invocations"][-1]["launch"]
    assert launch["scheduler"] == "none" and launch["tasks"] == 2, launch
    assert f"jax_compilation_cache_dir = {scratch} (JAX_COMPILATION_CACHE_DIR)" in res.stdout
    assert any(scratch.iterdir())  # the compiled steps went to the variable's folder
    log_lines = (workdir / "out.log").read_text().splitlines()
    assert log_lines and all(re.match(date, line) for line in log_lines), log_lines[:5]


@pytest.mark.slow
def test_tf_starts_without_absl_or_onednn_lines_at_level_2():
    """Importing the TF trainer loads TensorFlow (``--help`` answers before it does) without its C++
    start-up lines at ``TF_CPP_MIN_LOG_LEVEL=2``; at 0 they are there."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = [sys.executable, "-c", "import tf_impl.train, tensorflow; print(tensorflow.__version__)"]
    quiet = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert quiet.returncode == 0 and quiet.stdout.strip()
    assert quiet.stderr == ""
    loud = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert "absl::InitializeLog()" in loud.stderr  # the lines exist; level 2 hides them


def test_jax_compilation_cache_dir_wins_over_the_config(monkeypatch, tmp_path, tiny_cfg):
    import jax

    from jax_impl import distribute

    before = jax.config.jax_compilation_cache_dir
    try:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "scratch"))
        settings = distribute.configure_xla(tiny_cfg)
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "scratch")
        assert settings["jax_compilation_cache_dir"] == f"{tmp_path / 'scratch'} (JAX_COMPILATION_CACHE_DIR)"
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
        settings = distribute.configure_xla(tiny_cfg)
        assert jax.config.jax_compilation_cache_dir == tiny_cfg.xla_cache_dir
        assert settings["jax_compilation_cache_dir"] == tiny_cfg.xla_cache_dir
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_tf_xla_flags_cache_wins_over_the_config(monkeypatch, tmp_path, tiny_cfg):
    from tf_impl import distribute

    flag = f"--tf_xla_persistent_cache_directory={tmp_path / 'scratch'}"
    monkeypatch.setenv("TF_XLA_FLAGS", flag)
    assert distribute.configure_xla(tiny_cfg)["TF_XLA_FLAGS"] == flag
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    settings = distribute.configure_xla(tiny_cfg)
    assert settings["TF_XLA_FLAGS"] == f"--tf_xla_persistent_cache_directory={tiny_cfg.xla_cache_dir}/tf"


@pytest.mark.parametrize(
    "framework, names",
    [
        (
            "jax",
            [
                "JAX_COORDINATOR_ADDRESS",
                "JAX_NUM_PROCESSES",
                "JAX_PROCESS_ID",
                "JAX_LOCAL_DEVICE_IDS",
                "DLAS_JAX_CLUSTER",
                "JAX_COMPILATION_CACHE_DIR",
                "NPROC=2 bash scripts/launch/single_host.sh",
                "DLAS_START_TIMEOUT",
            ],
        ),
        ("tf", ["TF_CONFIG", "SLURM_*", "DLAS_TF_PORT", "DLAS_START_TIMEOUT", "TF_XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL"]),
    ],
)
def test_help_lists_the_environment_variables(framework, names):
    from shared_data.runtime import cli

    text = cli.build_parser(framework).format_help()
    for name in names:
        assert name in text, name


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_lone_process_says_whom_it_waits_for_and_names_the_missing_one(framework, tiny_argv, tmp_path):
    """One process of two started: it says whom it waits for, where and until when, and after
    DLAS_START_TIMEOUT seconds ends in one error line naming the missing process (its port is closed);
    no run folder is left; exit code 2. (TF's start of collective ops holds the interpreter: a watchdog
    process ends it.)"""
    ports = [_free_port(), _free_port()]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "OMPI_", "TF_CONFIG"))}
    env.update(DLAS_START_TIMEOUT="3", JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    if framework == "jax":  # process 1 without process 0, the coordinator
        where = f"127.0.0.1:{ports[0]}"
        env.update(JAX_COORDINATOR_ADDRESS=where, JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1")
        rank, missing = 1, f"process 0 ({where})"
    else:  # worker 0 without worker 1
        workers = [f"localhost:{p}" for p in ports]
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}})
        where, rank, missing = ", ".join(workers), 0, f"process 1 ({workers[1]})"
    cmd = [sys.executable, "-m", f"{framework}_impl.train", *tiny_argv, "--workdir", str(tmp_path / "run")]
    res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 2, res.stderr[-3000:]
    said = f"process {rank} of 2: waiting for process {1 - rank} at {where} until "
    assert said in res.stdout + res.stderr and "(DLAS_START_TIMEOUT=3 s)" in res.stdout + res.stderr
    if rank:  # a non-zero rank's line carries its tag
        assert f"[rank 1] INFO {said}" in res.stdout, res.stdout[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    line = f"error: process {rank} of 2 waited 3 s (DLAS_START_TIMEOUT) at {where}: {missing} is not listening"
    assert errors == [line], res.stderr[-3000:]
    assert "Traceback" not in res.stderr and not (tmp_path / "run").exists()


def test_start_timeout_refuses_values_no_wait_can_take():
    """``DLAS_START_TIMEOUT`` of inf, nan, 1e12 or below zero is one error naming the variable and the
    bound (a day); a day itself is taken."""
    for value in ("inf", "nan", "1e12", "86401", "0", "-3", "soon"):
        with pytest.raises(UserError, match=r"DLAS_START_TIMEOUT=.*above 0 and at most 86400"):
            launch.start_timeout({"DLAS_START_TIMEOUT": value})
    assert launch.start_timeout({"DLAS_START_TIMEOUT": "86400"}) == 86400.0
    assert launch.start_timeout({}) == launch.DEFAULT_START_TIMEOUT


def test_interruptible_returns_and_raises_what_the_join_does():
    assert launch.interruptible(lambda a, b: a + b, a=2, b=3) == 5
    with pytest.raises(ValueError, match="no environment"):
        launch.interruptible(lambda: (_ for _ in ()).throw(ValueError("no environment")))


@pytest.mark.slow
@pytest.mark.parametrize(
    "framework, signum, to, rank",
    [
        ("jax", "TERM", "group", 1),
        ("tf", "TERM", "group", 0),
        ("jax", "TERM", "process", 1),
        ("jax", "TERM", "process", 0),
        ("tf", "TERM", "process", 0),
        ("tf", "INT", "group", 0),
    ],
)
def test_a_lone_process_waiting_for_its_peer_stops_on_a_signal(framework, signum, to, rank, tiny_argv, tmp_path):
    """A process of two whose peer never comes, with a start time-out of 10 minutes: SIGTERM, or a
    Ctrl-C to the group (JAX's wait on a thread, TF's watchdog and C handler), while it waits ends it
    within 5 s (0.1-1.1 s here), not at the time-out, in one line naming the signal, without a
    traceback; no run folder is left. JAX's process 0 stops its coordination service's process too
    (jaxlib's shutdown of the service waits for the process that never joined: it is given 1 s). The
    signal goes to the process group, as SLURM and a terminal send it, or to the process alone, as
    ``kill PID`` does (TF's coordination service takes SIGTERM in the process and only records it: the
    worker holds SIGTERM blocked until it has joined, and the start's watchdog process, which sees it
    waiting there, ends the wait)."""
    import signal
    import time

    ports = [_free_port(), _free_port()]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "OMPI_", "TF_CONFIG"))}
    env.update(DLAS_START_TIMEOUT="600", JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    if framework == "jax":
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{ports[0]}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(rank))
    else:
        workers = [f"localhost:{p}" for p in ports]
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    cmd = [sys.executable, "-m", f"{framework}_impl.train", *tiny_argv, "--workdir", str(tmp_path / "run")]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "start_new_session": True}
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, **pipes)
    seen = ""
    for line in proc.stdout:  # the waiting line comes once the process waits
        seen += line
        if ": waiting for process" in line:
            break
    time.sleep(2)  # well inside the wait
    sent = time.monotonic()
    (os.killpg if to == "group" else os.kill)(proc.pid, getattr(signal, f"SIG{signum}"))
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed test leaves no process behind
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - sent
    assert ": waiting for process" in seen, seen + err[-2000:]
    number = getattr(signal, f"SIG{signum}")
    # TF's start holds the interpreter: SIGINT's C handler there is _exit, whose code is SIGINT's number
    # (the watchdog ends a SIGTERM'd wait with that SIGINT)
    codes = (2,) if framework == "tf" else (128 + number, -number)
    assert proc.returncode in codes, (proc.returncode, err[-2000:])
    assert took < 5, took
    assert "Traceback" not in err, err[-3000:]
    assert f"stopped by SIG{signum}" in err, err[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_tf_worker_whose_peer_has_no_port_number_is_one_line(tiny_argv, tmp_path):
    """TF_CONFIG naming worker 1 at port 65536 (no process can listen there): worker 0 ends at once in
    one error line naming worker 1's address, not after waiting for it until the start time-out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "OMPI_", "TF_CONFIG"))}
    env.update(
        DLAS_START_TIMEOUT="300",
        TF_CONFIG=json.dumps(
            {
                "cluster": {"worker": [f"localhost:{_free_port()}", "localhost:65536"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    cmd = [sys.executable, "-m", "tf_impl.train", *tiny_argv, "--workdir", str(tmp_path / "run")]
    res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: worker 1's address localhost:65536: expected a port number in 1-65535"], res.stderr[
        -3000:
    ]
    assert "Traceback" not in res.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_port_held_by_another_program_is_one_line(framework, tiny_argv, tmp_path):
    """Process 0's port already listened on by another program: one error line naming the address and
    the port, exit code 2, no segmentation fault or traceback, no run folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "OMPI_", "TF_CONFIG"))}
    env.update(DLAS_START_TIMEOUT="30", JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        if framework == "jax":
            env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="0")
        else:
            workers = [f"localhost:{port}", f"localhost:{_free_port()}"]
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}})
        cmd = [sys.executable, "-m", f"{framework}_impl.train", *tiny_argv, "--workdir", str(tmp_path / "run")]
        res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"port {port} is in use" in errors[0], res.stderr[-3000:]
    assert "Traceback" not in res.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_single_host_stops_the_worker_left_waiting_when_the_other_cannot_start(tiny_argv, tmp_path):
    """``NPROC=2 single_host.sh tf`` with worker 0's port held by another program: worker 0 ends in
    its one error line; worker 1, waiting for it inside TensorFlow's start (where TF's coordination
    service keeps a SIGTERM sent to the process alone), is stopped by the launcher through its
    watchdog after the 10-s grace, not at the 300-s start time-out; the launcher's exit code is 2."""
    import time

    with socket.socket() as held:
        held.bind(("localhost", 0))
        held.listen()
        port = held.getsockname()[1]
        env = dict(os.environ, NPROC="2", PORT=str(port), PY=sys.executable, DLAS_START_TIMEOUT="300")
        start = time.monotonic()
        res = subprocess.run(
            ["bash", "scripts/launch/single_host.sh", "tf", *tiny_argv[1:], "--workdir", str(tmp_path / "run")],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        took = time.monotonic() - start
    out = res.stdout + res.stderr
    assert res.returncode == 2 and took < 120, (res.returncode, took, out[-3000:])
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"port {port} is in use" in errors[0], out[-3000:]
    assert "stopped by SIGTERM while process 1 of 2 waited for the others" in out, out[-3000:]
    assert "Traceback" not in out


@pytest.mark.parametrize("port", ["65535", "80", "12a", "-1"])
def test_single_host_refuses_a_port_the_processes_cannot_take(port):
    """NPROC=2 uses PORT and PORT + 1: PORT 65535 (the second would be 65536), a privileged or
    malformed port end in one line before any process starts."""
    env = dict(os.environ, NPROC="2", PORT=port)
    res = subprocess.run(
        ["bash", "scripts/launch/single_host.sh", "jax", "cpu_tiny"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 2 and res.stderr.strip() == (
        f"error: PORT={port}: expected a port number in 1024-65534 (process i listens on PORT + i)"
    ), res.stderr


def _two_training_processes(framework: str, tiny_argv: list[str], workdir) -> list[subprocess.Popen]:
    """Processes 0 and 1 of a two-process ``cpu_tiny`` run of 2 epochs of 2048 crops, started without a
    launcher, stdout and stderr piped."""
    ports = [_free_port(), _free_port()]
    cmd = [sys.executable, "-m", f"{framework}_impl.train", *tiny_argv, "--Nsamples", "2048", "--num_epochs", "2"]
    cmd += ["--workdir", str(workdir)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return [subprocess.Popen(cmd, cwd=REPO_ROOT, env=process_env(framework, rank, ports), **pipes) for rank in (0, 1)]


def test_jax_coordination_service_outlives_process_0_while_a_process_is_connected():
    """The coordination service in its own process (what process 0 starts in place of jaxlib's in-process
    one) serves a client's key-value store, through the stop signals a scheduler sends every process of
    a step (the run's to handle); with process 0's pipe closed without its stop (process 0
    killed) it stays up while a client is connected and ends once that client is gone; a stop ends it
    at once; a port already taken is one error that names the address and the bind failure."""
    import gc
    import signal
    import socket
    import time

    from jax._src.lib import _jax

    from shared_data.core.errors import UserError

    from jax_impl import cluster

    port = _free_port()
    service = cluster.CoordinationService(f"[::]:{port}", 1, heartbeat_timeout=100)
    client = _jax.get_distributed_runtime_client(f"127.0.0.1:{port}", 0, init_timeout=30)
    client.connect()
    client.key_value_set("lesson", "profile first")
    assert client.blocking_key_value_get("lesson", 1000) == "profile first"
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):  # SLURM signals the whole step
        os.kill(service._proc.pid, signum)
    time.sleep(0.3)
    assert service._proc.poll() is None and client.blocking_key_value_get("lesson", 1000) == "profile first"
    service._proc.stdin.close()  # process 0's end without a word
    time.sleep(1.0)
    assert service._proc.poll() is None  # a process of the run still needs it
    del client  # that process ends: its connection closes
    gc.collect()
    assert service._proc.wait(timeout=10) == 0

    stopped = cluster.CoordinationService(f"[::]:{port}", 2, heartbeat_timeout=100)
    started = time.monotonic()
    stopped.shutdown()
    assert stopped._proc.returncode == 0 and time.monotonic() - started < 5

    with socket.socket() as taken:
        taken.bind(("", port))
        taken.listen()
        with pytest.raises(UserError) as err:
            cluster.CoordinationService(f"[::]:{port}", 2)
    assert re.fullmatch(
        rf"JAX's coordination service did not start on \[::\]:{port} \((killed by SIG\w+|exit code \d+)\): "
        rf".*Address already in use.*",
        str(err.value),
    ), err.value


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "lost"), [("jax", 1), ("tf", 1), ("jax", 0), ("tf", 0)])
def test_a_process_that_dies_ends_the_run_everywhere_in_one_line(framework, lost, tiny_argv, tmp_path):
    """kill -9 of one process while the two train: the other ends within 30 s (not at the distributed
    runtime's heartbeat time-out, then in a native abort) with one error line naming the lost process
    and what the run keeps, exit code 2, no traceback. JAX's coordination service runs in a child of
    process 0 (jax_impl.cluster.CoordinationService): kill -9 of process 0 leaves it up, so process 1's
    JAX client does not abort it ("Terminating process"), and the service's process ends once the
    survivor has."""
    import signal
    import time

    import psutil

    procs = _two_training_processes(framework, tiny_argv, tmp_path / "run")
    survivor = procs[1 - lost]
    try:
        for line in procs[0].stdout:  # training has started once the steps are compiled
            if "compile: train step" in line:
                break
        time.sleep(2)
        service = [c for c in psutil.Process(procs[0].pid).children() if "jax_impl.cluster" in c.cmdline()]
        assert len(service) == (framework == "jax"), service
        procs[lost].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        survivor.wait(timeout=120)  # reaped first: a process JAX aborted keeps its loader's workers, which
        took = time.monotonic() - killed  # hold its pipes, until it is reaped (they watch its pid)
        _, err = survivor.communicate(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert took < 30, took
    assert "Traceback" not in err, err[-3000:]
    assert survivor.returncode == 2, (survivor.returncode, err[-3000:])

    def running(proc: psutil.Process) -> bool:  # a zombie has ended (its parent killed, init reaps it)
        try:
            return proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 10  # it ends 3 s after no process of the run is connected to it
    while (alive := [proc for proc in service if running(proc)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, alive
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith(f"error: process {1 - lost} of this run lost process {lost} (of 2): "), errors
    assert "that epoch is abandoned" in errors[0] or "nothing is lost" in errors[0], errors
    assert "Traceback" not in err and "Check failure" not in err, err[-3000:]


@pytest.mark.slow
def test_single_host_names_the_process_killed_by_a_signal(tiny_argv, tmp_path):
    """``NPROC=2 single_host.sh jax``, kill -9 of process 0 while both train: the launcher names the
    killed process, its pid and signal in one error line (not bash's job notice), and its exit code is
    137; process 1 ends in the kit's line (its coordination service outlives process 0), not in JAX's
    fatal one."""
    import signal
    import time

    env = dict(os.environ, NPROC="2", PORT=str(_free_port()), PY=sys.executable, DLAS_START_TIMEOUT="120")
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=cpu_xla_flags(1))
    argv = [*tiny_argv[1:], "--set", "num_epochs=40", "--workdir", str(tmp_path / "run")]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "start_new_session": True}
    launcher = subprocess.Popen(
        ["bash", "scripts/launch/single_host.sh", "jax", *argv], cwd=REPO_ROOT, env=env, **pipes
    )
    try:
        for line in launcher.stdout:  # process 0 logs: training has started once the steps are compiled
            if "compile: train step" in line:
                break
        time.sleep(1)
        children = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
        first = None
        for pid in children:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if b"JAX_PROCESS_ID=0\0" in fh.read():
                    first = int(pid)
        assert first is not None, children
        os.kill(first, signal.SIGKILL)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 137, (launcher.returncode, err[-3000:])
    line = f"error: process 0 of 2 (pid {first}) was killed by SIGKILL (exit code 137); the others are stopped"
    assert line in err.splitlines(), err[-3000:]
    assert "Traceback" not in err and "Terminating process" not in err, err[-3000:]
    assert re.search(r"^error: process 1 of this run lost process 0 \(of 2\): ", err, re.M), err[-3000:]
    assert not re.search(r"line \d+: +\d+ (Killed|Aborted)", err), err[-3000:]  # bash's notice: the kit's line says it


@pytest.mark.slow
def test_a_jax_process_stopped_after_its_peer_died_unseen_ends_without_waiting_for_it(tiny_argv, tmp_path):
    """kill -9 of JAX process 1 right after both joined, then SIGTERM to process 0 before any
    collective showed it the loss: process 0 ends by the signal's line within the leave wait (10 s)
    plus its exit, not in JAX's distributed shutdown (which waits for the lost process until its
    heartbeat time-out, 100 s, then aborts the process with a native trace). Where process 1 died
    before its Gloo context was made, process 0's first collective waits in Gloo's rendezvous (30 s on
    CPU) before the signal or the loss can end it."""
    import signal
    import time

    from jax_impl.cluster import LEAVE_WAIT_S

    procs = _two_training_processes("jax", tiny_argv, tmp_path / "run")
    try:
        for line in procs[0].stdout:  # both processes have joined
            if "jax.distributed (JAX_COORDINATOR_ADDRESS): process 0 of 2" in line:
                break
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=30)
        procs[0].send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, err = procs[0].communicate(timeout=150)
        took = time.monotonic() - signalled
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert took < LEAVE_WAIT_S + 30 + 15, (took, err[-3000:])  # Gloo's rendezvous: see above
    assert procs[0].returncode in (143, 2), (procs[0].returncode, err[-3000:])  # the stop, or the loss seen first
    assert "Terminating process" not in err and "Check failure" not in err and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith(("stopped by SIGTERM", "error:"))]
    assert len(lines) == 1, err[-3000:]


def test_lost_process_names_the_other_process_and_the_line_that_says_what_failed():
    tf_text = (
        "Graph execution error:\n\nDetected at node CollectiveReduceV2 on /job:worker/replica:0/task:0/device:CPU:0\n"
        "Collective ops is aborted by: Error reported from /job:worker/task:2: The following tasks are unhealthy"
    )
    assert launch.lost_process(tf_text, rank=0, size=4) == (
        "process 2 (of 4): Collective ops is aborted by: Error reported from /job:worker/task:2: "
        "The following tasks are unhealthy"
    )
    gloo = "UNKNOWN: Gloo AllGather failed: [external/gloo/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:40674"
    assert launch.lost_process(gloo, rank=1, size=2) == (
        "process 0 (of 2): UNKNOWN: Gloo AllGather failed: Connection closed by peer [127.0.0.1]:40674"
    )
    assert launch.lost_process(gloo, rank=1, size=3).startswith("a process (of 3): UNKNOWN: Gloo")
    assert launch.lost_process("", rank=0, size=2) == "process 1 (of 2): no detail"
    wrapped = "{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/device:CPU:0}} "
    assert launch.lost_process(wrapped + tf_text.splitlines()[-1], rank=0, size=4) == (
        "process 2 (of 4): Collective ops is aborted by: Error reported from /job:worker/task:2: "
        "The following tasks are unhealthy"
    )
    # the line that ends in a colon is said with the list it introduces
    listed = tf_text + " (stopped sending heartbeats):\n/job:worker/replica:0/task:2\nThe tasks have crashed."
    assert launch.lost_process(listed, rank=0, size=4) == (
        "process 2 (of 4): Collective ops is aborted by: Error reported from /job:worker/task:2: "
        "The following tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:2"
    )
    long = "Collective ops is aborted by: " + " ".join(f"/job:worker/task:{n}" for n in range(3, 30))
    said = launch.lost_process(long, rank=0, size=30).removeprefix("process 3 (of 30): ")
    # 30 + 7 x 18 + 6 + 20 = 182 characters to task:10; task:11 would pass 200 - len(" ...")
    assert said.endswith("/job:worker/task:10 ...") and len(said) == 186, said
