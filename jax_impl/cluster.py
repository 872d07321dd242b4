"""How a JAX process joins a multi-process run: the counterpart of :mod:`tf_impl.cluster`.

:func:`initialize` reads what the launcher describes (SLURM, Open MPI, the ``JAX_*`` variables) and
joins before JAX sets up its devices; :func:`process_index` and :func:`process_count` say where this
process stands. What the processes then do together (the mesh, collectives) is
:mod:`jax_impl.distribute`. Process 0 runs JAX's coordination service in a child process
(:class:`CoordinationService`), so that the others outlive its loss and end in the kit's line
(:func:`watch_peers`); ``python -m jax_impl.cluster`` is that child.

JAX: ``jax.distributed.initialize``, with the coordinator's address from the environment or JAX's own
cluster detection.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import jax

from shared_data.core import errors
from shared_data.core.errors import UserError
from shared_data.runtime import launch, logs, signals

log = logging.getLogger(__name__)

#: ``DLAS_JAX_CLUSTER``: ``auto`` lets ``jax.distributed`` detect any environment it knows (Kubernetes,
#: Cloud TPU, SLURM, Open MPI); a detection method's name (``mpi4py``, ``k8s``, ...) asks for that one;
#: ``none`` keeps the process alone. Unset, the run joins when SLURM, Open MPI or the ``JAX_*``
#: variables describe several processes.
CLUSTER_VARIABLE = "DLAS_JAX_CLUSTER"
#: Seconds a process of a multi-process run that ends by an error or a signal waits for the others to end
#: too (:func:`leave_together`); well under SLURM's default KillWait of 30 s.
LEAVE_WAIT_S = 10

#: Seconds a process gives its main thread to end in its own line once another process of the run is
#: seen killed (:func:`watch_peers`).
LOST_GRACE_S = 3.0

#: Seconds a process waits for process 0's watch port, and then for its connection (:func:`watch_peers`).
WATCH_CONNECT_S = 60

#: Seconds JAX's coordination service, in its own process (:class:`CoordinationService`), stays up after
#: process 0 ended without JAX's shutdown (killed, or ended alone) while other processes are still
#: connected to it: long enough for them to end in the kit's line (:func:`watch_peers`' two grace periods,
#: :func:`leave_together`'s wait).
SERVICE_LINGER_S = 2 * LOST_GRACE_S + LEAVE_WAIT_S + 10
#: Seconds without a connection after which that service's process ends: a process that has said its
#: line may still be exiting, its client's poll of the service running until it has (the service's loss
#: then aborts it in JAX's fatal line).
SERVICE_IDLE_S = 3.0
#: Seconds the service's process gives jaxlib's shutdown of the service once process 0 says ``stop``.
SERVICE_STOP_S = 1.0

_left: dict = {"alone": False, "lost": None}  # left alone (no JAX shutdown); the process the watch saw lost
_watched: list[socket.socket] = []
_WATCH_KEY = "dlas_peer_watch_port"
_GOODBYE = b"bye"
#: The signals the service's process ignores: it ends by process 0's word or once no process needs it.
_SERVICE_IGNORES = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}
_GLOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")  # absl / glog's line head


# --- joining a multi-process run -----------------------------------------------------------------


def initialize() -> str | None:
    """Join a multi-process run when the environment describes one and return the line that says
    where this process stands (``None`` alone). Under a SLURM step the GPUs each task drives come from
    :func:`shared_data.runtime.launch.task_gpus` (right for ``--gpus-per-task`` too).

    JAX: ``jax.distributed.initialize`` with what :func:`join_arguments` reads: ``JAX_COORDINATOR_ADDRESS``
    (host:port of process 0), ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` (and optionally
    ``JAX_LOCAL_DEVICE_IDS``), for several processes on one host or a launcher JAX does not know; else
    JAX's own detection (SLURM, Open MPI; :data:`CLUSTER_VARIABLE` for others).

    Raises:
        UserError: ``JAX_COORDINATOR_ADDRESS`` without ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``, one
            that is not an integer in range (:func:`shared_data.runtime.launch.env_int`), or an unknown
            ``DLAS_JAX_CLUSTER``."""
    if jax.distributed.is_initialized():
        return None
    env = os.environ
    joined = join_arguments(env, env.get(CLUSTER_VARIABLE, "").strip().lower())
    if joined is None:
        return None
    how, kwargs, wait = joined
    ids = launch.task_gpus(env)
    if ids is not None and not env.get("JAX_LOCAL_DEVICE_IDS"):
        kwargs["local_device_ids"] = ids
    if env.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes all-reduce over gloo
    # SIGTERM (scancel, a requeue, the time limit) is the run's to handle: every rank stops at one step
    # boundary and saves its data cursor (shared_data.runtime.preemption). JAX's preemption service would take
    # SIGTERM from Python's handler and leave the steps running.
    jax.config.update("jax_enable_preemption_service", False)
    # JAX's own time-out aborts the process with a C++ trace: the watchdog of launch.joining ends it first
    kwargs["initialization_timeout"] = int(launch.start_timeout(env)) + 30
    try:
        with wait:  # on a thread, so SIGTERM and Ctrl-C end a process that waits for its peers
            launch.interruptible(_join, **kwargs)
    except ValueError as err:  # JAX found no environment to join
        raise UserError(f"jax.distributed ({how}): {err}") from None
    if jax.process_count() > 1:
        # after JAX's own exit function, so they run before it; the error and signal exits end after the
        # atexit functions, without the interpreter's finalisation (which would shut the runtime down again)
        watch_peers()
        atexit.register(leave_together)
        errors.EXIT_AFTER_ATEXIT.append("a multi-process JAX run")
    return (
        f"jax.distributed ({how}): process {jax.process_index()} of {jax.process_count()}, "
        f"{jax.local_device_count()} local / {jax.device_count()} global devices, "
        f"GPUs {jax.config.read('jax_cuda_visible_devices')} of CUDA_VISIBLE_DEVICES="
        f"{env.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
    )


def _join(**kwargs) -> None:
    """``jax.distributed.initialize(**kwargs)`` with process 0's coordination service in a process of its
    own (:class:`CoordinationService`) instead of inside process 0 (inside it where mutual TLS is asked
    for, whose files the child is not handed).

    JAX: ``jax._src.distributed`` creates the service through its module's ``_jax`` (jaxlib), which is
    swapped for the time of the call (``jax.distributed`` has no way to use a service started
    elsewhere)."""
    from jax._src import distributed

    jaxlib = distributed._jax

    def service(address: str, num_nodes: int, **options):
        if any(options.get(key) for key in options if key.startswith("mtls") or key.startswith("verify")):
            return jaxlib.get_distributed_runtime_service(address, num_nodes, **options)  # TLS: in process 0
        return CoordinationService(address, num_nodes, **options)

    class _Lib:
        get_distributed_runtime_service = staticmethod(service)

        def __getattr__(self, name):
            return getattr(jaxlib, name)

    distributed._jax = _Lib()
    try:
        jax.distributed.initialize(**kwargs)
    finally:
        distributed._jax = jaxlib


class CoordinationService:
    """JAX's coordination service (the key-value store, barriers and heartbeats of a multi-process run),
    run by process 0 in a child process of its own rather than inside itself. The service's loss ends
    every other process at once in a native abort (JAX's client: "Terminating process because the JAX
    distributed service detected fatal errors"); kept alive past a kill -9 of process 0, the others see
    the loss through :func:`watch_peers` and end in the kit's line. The child stays up until
    :meth:`shutdown` (JAX's distributed shutdown, after its barrier of all processes), or, where process 0
    ends without it, while other processes stay connected and :data:`SERVICE_IDLE_S` seconds after, at most
    :data:`SERVICE_LINGER_S` seconds.

    Arguments are jaxlib's ``get_distributed_runtime_service``'s (``address``: the bind address
    ``host:port``, ``num_nodes``: the processes of the run, the time-outs in seconds).

    Raises:
        UserError: the service did not start (its port taken, say), with its error line."""

    def __init__(self, address: str, num_nodes: int, **options):
        args = [address, str(num_nodes), *(f"{key}={value}" for key, value in options.items() if value is not None)]
        # Held from its start, then ignored (_serve): a stop is the run's to handle, through the service
        # (SLURM signals every process of a step, a terminal its process group).
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _SERVICE_IGNORES)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "jax_impl.cluster", *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        said = self._proc.stdout.readline()
        if said.strip() != "ready":
            said += self._proc.stdout.read()
            code = self._proc.wait()
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            lines = [_GLOG_PREFIX.sub("", line).strip() for line in said.splitlines()]
            first = next((line for line in lines if line), "no word")
            raise UserError(f"JAX's coordination service did not start on {address} ({how}): {first}")

    def shutdown(self) -> None:
        """End the service's process (JAX's distributed shutdown calls this after its barrier)."""
        with contextlib.suppress(OSError):
            self._proc.stdin.write("stop\n")
            self._proc.stdin.flush()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _serve(argv: list[str]) -> None:
    """The child of :class:`CoordinationService`: start jaxlib's service on ``argv`` (the address, the
    processes, then ``key=value`` options), say ``ready`` on stdout, and keep it until the parent writes
    ``stop`` (then shut it down, at most :data:`SERVICE_STOP_S` seconds); where the parent's pipe closes
    without it, until no process has been connected for :data:`SERVICE_IDLE_S` seconds (checked every
    0.2 s), at most :data:`SERVICE_LINGER_S` seconds. It ignores the stop signals
    (:data:`_SERVICE_IGNORES`), held blocked from its start by its parent."""
    for signum in _SERVICE_IGNORES:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SERVICE_IGNORES)
    import psutil
    from jax._src.lib import _jax

    address, nodes, *rest = argv
    options = {
        key: int(value) if value.lstrip("-").isdigit() else value == "True"
        for key, value in (item.split("=", 1) for item in rest)
    }
    try:
        service = _jax.get_distributed_runtime_service(address, int(nodes), **options)
    except Exception as err:  # jaxlib's error type is its own
        print(f"{type(err).__name__}: {err}", flush=True)
        sys.exit(1)
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    if sys.stdin.readline().strip() == "stop":
        # jaxlib's shutdown returns at once when every process has left through JAX's shutdown, and waits
        # for the ones that never joined (a stop during the start) for seconds: given SERVICE_STOP_S
        stopping = threading.Thread(target=service.shutdown, daemon=True)
        stopping.start()
        stopping.join(SERVICE_STOP_S)
        os._exit(0)
    me, port = psutil.Process(), int(address.rpartition(":")[2])
    deadline, idle_since = time.monotonic() + SERVICE_LINGER_S, None
    while time.monotonic() < deadline:
        try:
            connected = any(
                c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port for c in me.net_connections("tcp")
            )
        except (psutil.Error, OSError):
            connected = True
        if connected:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= SERVICE_IDLE_S:
            break
        time.sleep(0.2)
    os._exit(0)


def watch_peers() -> None:
    """Keep one TCP connection between process 0 and each other process of the run (process 0's port
    through JAX's key-value store), so that a process killed without a word (kill -9, the OOM killer, a
    lost node) is seen at once: its connection closes without the goodbye every process sends at its
    exit. The survivor's main thread usually ends the process first, in its one line (a collective's
    error); where it waits where no collective shows the loss (for the previous epoch's checkpoint,
    whose last step is a barrier of all processes that a lost process holds until JAX's heartbeat
    time-out aborts the others), the watcher ends the process after :data:`LOST_GRACE_S` seconds in the
    same line (:func:`_lost`). Where the connection cannot be made, one warning, and the run goes on
    without it.

    JAX: the client's key-value store of ``jax._src.distributed`` (``jax.distributed`` exposes none)."""
    from jax._src import distributed

    client, rank = distributed.global_state.client, jax.process_index()
    signal.signal(signal.SIGUSR2, _raise_lost)
    try:
        if rank == 0:
            server = socket.create_server(("", 0))
            client.key_value_set(_WATCH_KEY, str(server.getsockname()[1]))
            threading.Thread(target=_accept, args=(server,), name="peer-watch", daemon=True).start()
        else:
            port = int(client.blocking_key_value_get(_WATCH_KEY, WATCH_CONNECT_S * 1000))
            host = distributed.global_state.coordinator_address.rpartition(":")[0].strip("[]")
            conn = socket.create_connection((host, port), timeout=WATCH_CONNECT_S)
            conn.settimeout(None)
            conn.sendall(f"{rank}\n".encode())
            _watched.append(conn)
            threading.Thread(target=_watch, args=(conn, 0), name="peer-watch", daemon=True).start()
    except (OSError, ValueError, jax.errors.JaxRuntimeError) as err:
        log.warning(
            "no watch of the other processes (%s): a process killed without a word is seen by the "
            "next collective, or by JAX's heartbeat time-out",
            err,
        )
        return
    atexit.register(_say_goodbye)


def _accept(server: socket.socket) -> None:
    """Process 0's side of :func:`watch_peers`: take each other process's connection (its first line is its
    rank) and watch it; a connection that does not say a rank (another program) is closed and not counted."""
    peers = set(range(1, jax.process_count()))
    while peers:
        conn, _ = server.accept()
        try:
            peer = int(conn.makefile("r").readline())
        except (OSError, ValueError):
            peer = None
        if peer not in peers:
            conn.close()
            continue
        peers.discard(peer)
        _watched.append(conn)
        threading.Thread(target=_watch, args=(conn, peer), name="peer-watch", daemon=True).start()
    server.close()


def _watch(conn: socket.socket, peer: int) -> None:
    """Wait on ``peer``'s connection: its goodbye ends the watch; its close without one is a lost process."""
    try:
        said = conn.recv(16)
    except OSError:
        said = b""
    if not said.startswith(_GOODBYE):
        _lost(peer)


class PeerLost(RuntimeError):
    """Another process of the run ended without a word (:func:`watch_peers`), raised in the main thread."""

    def __init__(self, peer: int):
        super().__init__(
            f"process {peer} (of {jax.process_count()}): its connection closed without a word (the process was killed)"
        )


def _lost(peer: int) -> None:
    """``peer`` ended without its goodbye: give this process's main thread :data:`LOST_GRACE_S` seconds to
    end in its own line (a collective's error), then raise :class:`PeerLost` in it (a signal wakes a
    thread that waits in Python, and the run ends in its one line: :func:`jax_impl.distribute.lost_peer`),
    and :data:`LOST_GRACE_S` seconds later, where it still waits (in native code), end the process here
    in that line, after the ``atexit`` functions, exit code 2."""
    time.sleep(LOST_GRACE_S)
    if errors.ending_code() is not None or _left["alone"]:
        return  # the main thread is ending the process
    _left["lost"] = peer
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
    time.sleep(LOST_GRACE_S)
    if errors.ending_code() is not None or _left["alone"]:
        return
    message = f"process {jax.process_index()} of this run lost {PeerLost(peer)}; it stops {signals.where()}"
    logs.log_to_file_only(logging.ERROR, f"error: {message}")
    errors.say(f"error: {message}")
    leave_alone()
    errors.exit_after_atexit(2)


def _raise_lost(signum: int, frame=None) -> None:
    """SIGUSR2's handler in a multi-process run: :class:`PeerLost` of the process :func:`_lost` saw."""
    if _left["lost"] is not None:
        raise PeerLost(_left["lost"])


def _say_goodbye() -> None:
    """At this process's exit: tell the watched processes it ends by itself."""
    for conn in _watched:
        with contextlib.suppress(OSError):
            conn.sendall(_GOODBYE)


def leave_together() -> None:
    """At the exit of a process of a multi-process run that ends by an error or a signal
    (:func:`shared_data.core.errors.ending_code`): wait up to :data:`LEAVE_WAIT_S` seconds for every
    process to reach its exit too, then leave through JAX's distributed shutdown; a process that does
    not come (lost, or still compiling) leaves this one to end alone (:func:`leave_alone`). Does nothing
    at a normal end, or where a lost process was already seen.

    JAX's shutdown is a barrier of all processes that waits for a lost process until the coordination
    service misses its heartbeats (100 s), then aborts this process with a native trace.
    JAX: the distributed client's ``wait_at_barrier``, reached through JAX's private ``distributed``
    module (``jax.distributed`` exposes no barrier with a time-out)."""
    if _left["alone"] or not errors.ending_code():
        return
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        return
    try:
        client.wait_at_barrier("dlas_leave_together", LEAVE_WAIT_S * 1000)
    except jax.errors.JaxRuntimeError as err:
        log.info("the other processes did not end within %d s (%s): this one ends alone", LEAVE_WAIT_S, err)
        leave_alone()


def leave_alone() -> None:
    """End this process without JAX's distributed shutdown (its exit function), which would wait for a
    process that is gone and then abort: the run's process that ends by an error or a stop does so after
    the ``atexit`` functions, without the interpreter's finalisation (``jax.distributed.shutdown`` is the
    exit function's own step)."""
    from jax._src import api as jax_api

    _left["alone"] = True
    atexit.unregister(jax_api.clean_up)


def join_arguments(env, choice: str) -> tuple[str, dict, contextlib.AbstractContextManager] | None:
    """How this process joins a run (``choice``: :data:`CLUSTER_VARIABLE`'s value): the launcher's name,
    the ``jax.distributed.initialize`` arguments it implies and the start's wait (said and timed where
    the processes are known); None when the process runs alone.

    Raises:
        UserError: ``JAX_COORDINATOR_ADDRESS`` without ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``, or one
            that is not an integer in range.
    """
    kwargs: dict = {}
    wait = contextlib.nullcontext()
    if choice == "none":
        return None
    if env.get("JAX_COORDINATOR_ADDRESS"):
        missing = [v for v in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if not env.get(v)]
        if missing:
            raise UserError(f"JAX_COORDINATOR_ADDRESS is set: set {' and '.join(missing)} as well")
        count = launch.env_int(env, "JAX_NUM_PROCESSES", 1, 1)
        kwargs.update(num_processes=count, process_id=launch.env_int(env, "JAX_PROCESS_ID", 0, 0, count))
        address = env["JAX_COORDINATOR_ADDRESS"]
        if kwargs["process_id"] == 0:
            launch.claim_port(address, "JAX_COORDINATOR_ADDRESS")
        wait = launch.joining(kwargs["process_id"], kwargs["num_processes"], address, {0: address}, env)
        return "JAX_COORDINATOR_ADDRESS", kwargs, wait
    if choice and choice != "auto":
        return choice, {"cluster_detection_method": choice}, wait
    if choice != "auto" and not launch.slurm_step(env) and not launch.ompi_job(env):
        return None
    how = "SLURM" if launch.slurm_step(env) else "Open MPI" if launch.ompi_job(env) else "auto-detected"
    if launch.slurm_step(env) and choice != "auto":
        address = kwargs["coordinator_address"] = slurm_coordinator(env)
        size = launch.env_int(env, "SLURM_STEP_NUM_TASKS", 1, 1)
        rank = launch.env_int(env, "SLURM_PROCID", 0, 0, size)
        if rank == 0:
            launch.claim_port(address, "the SLURM step's coordinator")
        wait = launch.joining(rank, size, address, {0: address}, env)
    return how, kwargs, wait


def slurm_coordinator(env) -> str:
    """Process 0's address in a SLURM step, as JAX's own SLURM detection picks it: the step's first
    node, port ``JAX_COORDINATOR_PORT`` or 61440 + (job id mod 4096).

    Raises:
        UserError: ``JAX_COORDINATOR_PORT`` is not a port number or ``SLURM_JOB_ID`` not an integer.
    """
    port = launch.env_int(env, "JAX_COORDINATOR_PORT", 0, 1, 65536)
    port = port or launch.env_int(env, "SLURM_JOB_ID", 0) % 4096 + 61440
    return f"{launch.expand_hostlist(env['SLURM_STEP_NODELIST'])[0]}:{port}"


def process_index() -> int:
    """This process's rank in a multi-process run (0 alone).

    JAX: ``jax.process_index()``."""
    return jax.process_index()


def process_count() -> int:
    """The processes of the run (1 alone).

    JAX: ``jax.process_count()``."""
    return jax.process_count()


if __name__ == "__main__":
    _serve(sys.argv[1:])
