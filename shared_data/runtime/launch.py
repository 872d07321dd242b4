"""Where a process stands in a multi-process run, read from its launcher's environment; framework-neutral.

A SLURM step (``srun``) describes several processes when ``SLURM_STEP_NUM_TASKS`` > 1; a shell inside
an allocation (``salloc``, the batch script itself) has ``SLURM_NTASKS`` but is one process, and
joining a run there would wait for tasks that never start. Open MPI describes several processes with
``OMPI_COMM_WORLD_SIZE`` > 1.

Which GPUs a SLURM task drives depends on how the job binds them:

- every task sees the node's GPUs (``--gpus-per-node`` without ``--gpus-per-task``, the kit's
  ``submit_slurm.sh``): ``CUDA_VISIBLE_DEVICES`` lists them all and task ``SLURM_LOCALID`` drives its
  share, ``[SLURM_LOCALID]`` with one GPU per task;
- SLURM binds GPUs to tasks (``--gpus-per-task``, ``--gpu-bind``): ``CUDA_VISIBLE_DEVICES`` lists the
  task's own GPUs (``"2"`` on local task 2 without device cgroups, ``"0"`` with them), and the task
  drives all of them, ``[0]`` with one GPU per task. JAX's own SLURM detection assumes the first case
  and picks ``[SLURM_LOCALID]``, a device that task 2 cannot see in the second.

:func:`task_gpus` returns those indices among the visible GPUs (what ``jax.distributed.initialize``
takes as ``local_device_ids``, what ``tf.config.set_visible_devices`` keeps in TensorFlow).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Mapping

from shared_data.core.errors import UserError, say
from shared_data.runtime import logs

log = logging.getLogger("dlas")

#: ``DLAS_START_TIMEOUT``: seconds a process of a multi-process run waits for the others to join.
START_TIMEOUT_VARIABLE = "DLAS_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 300.0
#: The longest ``DLAS_START_TIMEOUT`` taken, in seconds (a day).
MAX_START_TIMEOUT = 86400.0


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0, below: int | None = None) -> int:
    """The integer value of environment variable ``name`` (``default`` when unset or empty).

    Raises:
        UserError: ``NAME='abc': expected an integer >= minimum`` (and ``< below``, where given).
    """
    text = env.get(name, "")
    if not text.strip():
        return default
    expected = f"an integer >= {minimum}" + (f" and < {below}" if below is not None else "")
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"environment variable {name}={text!r}: expected {expected}") from None
    if value < minimum or (below is not None and value >= below):
        raise UserError(f"environment variable {name}={text!r}: expected {expected}")
    return value


def slurm_step(env: Mapping[str, str]) -> bool:
    """True in a SLURM step of several tasks (a process started by ``srun -n N``, N > 1).

    Raises:
        UserError: ``SLURM_STEP_NUM_TASKS`` is not a positive integer (:func:`env_int`).
    """
    return env_int(env, "SLURM_STEP_NUM_TASKS", 1, 1) > 1 and "SLURM_PROCID" in env


def joins_workers(env: Mapping[str, str] = os.environ) -> bool:
    """True where a TensorFlow process joins a multi-worker run (``TF_CONFIG``, or a SLURM step of
    several tasks: :func:`slurm_step`); a malformed task count counts as False here (the join's own
    check names it)."""
    try:
        return bool(env.get("TF_CONFIG")) or slurm_step(env)
    except UserError:
        return False


def ompi_job(env: Mapping[str, str]) -> bool:
    """True in an Open MPI job of several processes (``mpirun -n N``, N > 1)."""
    return env_int(env, "OMPI_COMM_WORLD_SIZE", 1, 1) > 1


def slurm_tasks_on_node(env: Mapping[str, str]) -> int:
    """Tasks of this SLURM step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` (``"4(x2)"``, ``"4,3"``)
    at index ``SLURM_NODEID``, else ``SLURM_NTASKS_PER_NODE``, else 1."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if spec:
        counts: list[int] = []
        for part in spec.split(","):
            m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
            if m is None:
                raise UserError(f"SLURM_STEP_TASKS_PER_NODE={spec!r}: expected a form like '4(x2)' or '4,3'")
            counts += [int(m[1])] * int(m[2] or 1)
        node = env_int(env, "SLURM_NODEID", 0)
        return counts[min(node, len(counts) - 1)]
    return env_int(env, "SLURM_NTASKS_PER_NODE", 1, 1)


def task_gpus(env: Mapping[str, str], seen: int | None = None) -> list[int] | None:
    """Indices, among the GPUs this SLURM task sees, of those it drives; None outside a multi-task SLURM
    step. The task sees the GPUs of ``CUDA_VISIBLE_DEVICES``, else ``seen`` of them (the count the
    framework finds); None when neither says (JAX then picks ``[SLURM_LOCALID]`` itself, right when
    the task sees every GPU of the node).

    Raises:
        UserError: the visible GPUs do not divide evenly over the node's tasks.
    """
    if not slurm_step(env):
        return None
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        count = len([d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()])
    elif seen is not None:
        count = seen
    else:
        return None
    tasks = slurm_tasks_on_node(env)
    if env.get("SLURM_GPUS_PER_TASK") or count < tasks:
        return list(range(count))  # SLURM bound this task's GPUs: all it sees are its own
    if count % tasks:
        raise UserError(
            f"{count} GPUs visible to {tasks} tasks on this node: give each task the same number "
            "(--ntasks-per-node dividing --gpus-per-node, or --gpus-per-task)"
        )
    share = count // tasks
    local = env_int(env, "SLURM_LOCALID", 0, 0, tasks)
    return list(range(local * share, (local + 1) * share))


def expand_hostlist(spec: str) -> list[str]:
    """SLURM's compressed host list as names: ``"node[01-03,07],gpu1"`` -> node01, node02, node03, node07,
    gpu1 (what ``scontrol show hostnames`` prints)."""
    hosts = []
    for prefix, ranges, suffix in re.findall(r"([^,\[\]]+)(?:\[([^\]]+)\])?([^,\[\]]*)", spec):
        if not ranges:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            hosts += [f"{prefix}{i:0{len(lo)}d}{suffix}" for i in range(int(lo), int(hi or lo) + 1)]
    return hosts


def launch_info(env: Mapping[str, str]) -> dict:
    """What ``run.json`` records about how the run was started: ``scheduler`` (``slurm`` or ``none``),
    ``job_id`` (SLURM's, else None), ``tasks`` (processes of the run) and ``hosts`` (SLURM's node list,
    the hosts of ``TF_CONFIG``, else this host).

    Raises:
        UserError: a task count (``SLURM_STEP_NUM_TASKS``, ``SLURM_NTASKS``, ``JAX_NUM_PROCESSES``) that
            is not a positive integer (:func:`env_int`).
    """
    if env.get("SLURM_JOB_ID"):
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or platform.node()
        name = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS", "").strip() else "SLURM_NTASKS"
        tasks = env_int(env, name, 1, 1)
        return {"scheduler": "slurm", "job_id": env["SLURM_JOB_ID"], "tasks": tasks, "hosts": expand_hostlist(nodes)}
    hosts, tasks = [platform.node()], 1
    workers = _tf_config_workers(env)
    if workers:
        hosts, tasks = list(dict.fromkeys(w.rpartition(":")[0] for w in workers)), len(workers)
    elif env.get("JAX_NUM_PROCESSES", "").strip():
        tasks = env_int(env, "JAX_NUM_PROCESSES", 1, 1)
    elif ompi_job(env):
        tasks = env_int(env, "OMPI_COMM_WORLD_SIZE", 1, 1)
    return {"scheduler": "none", "job_id": None, "tasks": tasks, "hosts": hosts}


def _tf_config_workers(env: Mapping[str, str]) -> list[str]:
    try:
        cluster = json.loads(env.get("TF_CONFIG") or "{}").get("cluster", {})
        return [w for v in cluster.values() for w in v]
    except (ValueError, AttributeError, TypeError):
        return []


def start_timeout(env: Mapping[str, str]) -> float:
    """Seconds to wait for the other processes: ``DLAS_START_TIMEOUT``, else 300.

    Raises:
        UserError: the variable is not a number of seconds above 0 and at most :data:`MAX_START_TIMEOUT`
            (a day: the frameworks take whole seconds in a C integer, and no start waits that long).
    """
    value = env.get(START_TIMEOUT_VARIABLE, "")
    if not value:
        return DEFAULT_START_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_START_TIMEOUT:  # also refuses nan and inf
        raise UserError(
            f"{START_TIMEOUT_VARIABLE}={value[:40]!r}: expected a number of seconds above 0 and at most "
            f"{MAX_START_TIMEOUT:g}"
        )
    return seconds


def interruptible(join: Callable[..., object], **kwargs) -> object:
    """``join(**kwargs)`` (a framework's blocking start of a multi-process run, e.g.
    ``jax.distributed.initialize``) on a thread of its own while the main thread waits for it, so a
    signal's Python handler runs during the wait: Python runs handlers only in the main thread, between
    bytecodes, and a C call that blocks there would hold SIGTERM and Ctrl-C until its own time-out.
    Returns what ``join`` returns and raises what it raises; a signal's exception
    (:class:`shared_data.runtime.signals.Interrupted`) propagates from the wait, with the join left
    running on its daemon thread (the command's exit ends it:
    :func:`shared_data.core.errors.run_cli`)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = join(**kwargs)
        except BaseException as err:  # handed to the main thread
            outcome["error"] = err

    thread = threading.Thread(target=run, name="join-run", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def port_of(address: str, role: str) -> int:
    """The port of ``address`` (``host:port``; ``role`` names it in the error, e.g. "worker 1's address").

    Raises:
        UserError: the port is not a number in 1-65535."""
    _, _, text = address.rpartition(":")
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise UserError(f"{role} {address}: expected a port number in 1-65535")
    return int(text)


def claim_port(address: str, role: str) -> None:
    """Check that this process can serve ``address`` (``host:port``, the port it is about to listen on
    as ``role``, e.g. "process 0's coordinator") before its framework tries: a port held by another
    program fails JAX's coordinator with a segmentation fault and TensorFlow's server with a traceback,
    while the other processes wait until their time-out. A port left in TIME_WAIT by an earlier run
    is free (``SO_REUSEADDR``, as the frameworks' servers bind).

    Raises:
        UserError: the port is not a number in 1-65535, or another program listens on it.
    """
    port = port_of(address, role)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as err:
            raise UserError(
                f"{role} {address}: port {port} is in use on {platform.node()} ({err.strerror or err}); "
                "choose a free port (PORT for scripts/launch/single_host.sh)"
            ) from None


def lost_process(text: str, rank: int, size: int) -> str:
    """The words for another process of a run that ended, from a framework's error ``text``: the
    process the text names other than this one (TensorFlow's ``reported from /job:worker/task:N``,
    the coordination service's ``Task N``), else the other one in a world of two, else "a process";
    then the text's line that says what failed (the first where none does), with the line after it
    where it ends in a colon (the list it introduces: TensorFlow's unhealthy tasks); at most 200
    characters, cut at a word with " ..." where longer."""
    patterns = (r"reported from /job:\w+/task:(\d+)", r"\bTask (\d+)\b", r"/job:\w+/task:(\d+)")
    named = [int(n) for pattern in patterns for n in re.findall(pattern, text) if int(n) != rank]
    if named:
        lost = f"process {named[0]} (of {size})"
    elif size == 2:
        lost = f"process {1 - rank} (of 2)"
    else:
        lost = f"a process (of {size})"
    text = re.sub(r"\{\{function_node [^}]*\}\}", "", text)  # TF's name of the graph function that failed
    text = re.sub(r"\[[^\]\s]+\.(?:cc|h|cpp):\d+\] ?", "", text)  # a source line of the library's (Gloo's)
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()] or ["no detail"]
    marks = ("Collective ops is aborted", "unhealthy", "Connection reset", "Connection closed", "Gloo ", "NCCL")
    at = next((i for i, line in enumerate(lines) if any(mark in line for mark in marks)), 0)
    telling = " ".join(lines[at : at + 2]) if lines[at].endswith(":") else lines[at]
    return f"{lost}: {textwrap.shorten(telling, 200, placeholder=' ...')}"


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def _missing(rank: int, size: int, listeners: Mapping[int, str]) -> str:
    """The processes that did not join, as far as their ports tell: a process of ``listeners`` (rank ->
    host:port it serves once started) whose port is closed has not started or has died."""
    closed = [r for r, address in sorted(listeners.items()) if r != rank and not _listening(address)]
    if closed:
        return ", ".join(f"process {r} ({listeners[r]}) is not listening" for r in closed)
    others = [r for r in range(size) if r != rank and r not in listeners]
    if not others:
        return "every process is listening, yet the start did not complete"
    names = ", ".join(map(str, others))
    return f"process {names} did not join" if len(others) == 1 else f"processes {names}: not all of them joined"


@contextlib.contextmanager
def joining(
    rank: int,
    size: int,
    where: str,
    listeners: Mapping[int, str],
    env: Mapping[str, str] = os.environ,
    *,
    holds_interpreter: bool = False,
):
    """Around the wait of process ``rank`` of ``size`` for the others (``where``: the addresses it
    waits at): log which processes it waits for, where and until when; after ``DLAS_START_TIMEOUT``
    seconds end with one ``error:`` line naming the processes missing (:func:`_missing` probes
    ``listeners``), exit code 2. A watchdog thread does it; where the wait holds the interpreter
    (``holds_interpreter``: TensorFlow's start of collective ops, during which no Python thread or
    signal handler runs) a watchdog process prints the line and sends SIGINT, whose handler in the C
    runtime is then :func:`_exit_on_sigint`'s.
    """
    timeout = start_timeout(env)
    others = ", ".join(str(r) for r in range(size) if r != rank)
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + timeout))
    plural = "es" if size > 2 else ""
    if rank != 0:  # the rank is known from here: this line and the rest carry its tag
        logs.setup_logging(rank)
    logging.getLogger(logs.RANK_LOGGER).info(
        f"process {rank} of {size}: waiting for process{plural} {others} at {where} until {until} "
        f"({START_TIMEOUT_VARIABLE}={timeout:g} s)"
    )
    args = json.dumps([rank, size, where, {str(k): v for k, v in listeners.items()}, timeout])
    if holds_interpreter:
        code = "import sys; from shared_data.runtime import launch; launch.watch(sys.argv[1], sys.argv[2])"
        watcher = subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), args], stdin=subprocess.DEVNULL)
        try:
            with _exit_on_sigint():
                yield timeout
        finally:
            watcher.kill()
            watcher.wait()
        return
    done = threading.Event()

    def watchdog():
        if not done.wait(timeout):
            say(f"error: {timeout_message(args)}")
            os._exit(2)

    threading.Thread(target=watchdog, name="start-watchdog", daemon=True).start()
    try:
        yield timeout
    finally:
        done.set()


@contextlib.contextmanager
def _exit_on_sigint():
    """Inside the block SIGINT ends the process at once with exit code 2, and SIGTERM and SIGUSR1 end
    it as their default actions do (killed by the signal: 143 and 138 in a shell), even while a C call
    holds the interpreter: the C handler of SIGINT is libc's ``_exit``, which the kernel calls with the
    signal's number, and SIGINT's is 2; those of SIGTERM and SIGUSR1 are the defaults. (A Ctrl-C there
    ends it the same way; the watchdog process says so: :func:`watch`.) The previous C handlers
    (Python's) return after the block."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype, libc.signal.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p]
    handlers = {signal.SIGINT: ctypes.cast(libc._exit, ctypes.c_void_p).value}
    handlers.update({s: int(signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGUSR1)})
    previous = {s: libc.signal(s, h) for s, h in handlers.items()}
    try:
        yield
    finally:
        for s, h in previous.items():
            libc.signal(s, h)


def timeout_message(args: str) -> str:
    """The time-out line of :func:`joining` (its arguments as JSON)."""
    rank, size, where, listeners, timeout = json.loads(args)
    missing = _missing(rank, size, {int(k): v for k, v in listeners.items()})
    return f"process {rank} of {size} waited {timeout:g} s ({START_TIMEOUT_VARIABLE}) at {where}: {missing}"


def status_signals(pid: int, field: str) -> set[signal.Signals]:
    """The signals of the mask ``field`` of ``/proc/PID/status`` (Linux; empty elsewhere or once the
    process is gone): ``ShdPnd`` those sent to the process that wait, blocked in all its threads (a
    TensorFlow worker holds SIGTERM so during its start: :func:`shared_data.runtime.signals.hold_sigterm`),
    ``SigBlk`` those its main thread blocks, ``SigCgt`` those it handles."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            mask = int(next(line for line in fh if line.startswith(f"{field}:")).split()[1], 16)
    except (OSError, StopIteration, ValueError, IndexError):
        return set()
    return {s for s in signal.Signals if mask >> (s - 1) & 1}


def watch(parent: str, args: str) -> None:
    """The watchdog process of :func:`joining`: at the time-out, if process ``parent`` still waits (it
    kills this one once joined), print the time-out line and end it with exit code 2 (SIGINT, whose C
    handler there is ``_exit``); if ``parent`` ends before (a signal, which it cannot report while the
    start holds its interpreter), say so in one line. SIGTERM or SIGUSR1 sent to the process group
    (SLURM's, ``timeout``'s) ends the parent the same way with the signal's line: TensorFlow's
    coordination service takes SIGTERM in the parent and records it only; a SIGTERM sent to the
    parent alone waits there, held (:func:`status_signals`), and ends it the same way. A Ctrl-C of
    the terminal is the parent's (its C handler ends it), not this process's: this one only notes it,
    to name it in the line that says the parent ended."""
    noted = []
    signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))  # the terminal's Ctrl-C
    if hasattr(signal, "pthread_sigmask"):  # started while the parent holds SIGTERM (signals.hold_sigterm)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    rank, size, where, _, timeout = json.loads(args)

    def stop(signum: int, frame=None) -> None:  # a signal to the process group: SLURM's, timeout's
        say(
            f"stopped by {signal.Signals(signum).name} while process {rank} of {size} waited for the others at "
            f"{where}: nothing is lost"
        )
        if os.getppid() == int(parent):
            os.kill(int(parent), signal.SIGINT)
        os._exit(0)

    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, stop)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
        if signal.SIGTERM in status_signals(int(parent), "ShdPnd"):  # sent to the parent alone, held there
            stop(signal.SIGTERM)
        if os.getppid() != int(parent):
            what = signal.Signals(noted[0]).name if noted else "a signal"
            say(f"stopped by {what} while process {rank} of {size} waited for the others at {where}: nothing is lost")
            return
    if os.getppid() == int(parent):
        say(f"error: {timeout_message(args)}")
        os.kill(int(parent), signal.SIGINT)
