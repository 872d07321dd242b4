"""Data parallelism in JAX: one device mesh, the batch sharded over its ``data`` axis.

Replica ``r`` of the run is data shard ``r``: a process loads the shards of its own devices
(:func:`local_shards`), one run on any world size is the same experiment, and every process agrees on
a stop or a verdict through one collective (:func:`any_process`, :func:`main_process_flag`).

The devices' other business lives here too: :func:`configure_xla`, the one place that sets XLA
options, and the facts a record carries about the devices (:func:`banner`, :func:`versions`,
:func:`peak_memory_bytes`).

JAX: parameters replicated, all inside the one jitted step (XLA inserts the gradient all-reduce);
processes join through ``jax.distributed`` (:func:`initialize`) and :func:`put_batch` assembles the
global array from process-local data.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.runtime import launch, xla_flags

log = logging.getLogger(__name__)


#: ``DLAS_JAX_CLUSTER``: ``auto`` lets ``jax.distributed`` detect any environment it knows (Kubernetes,
#: Cloud TPU, SLURM, Open MPI); a detection method's name (``mpi4py``, ``k8s``, ...) asks for that one;
#: ``none`` keeps the process alone. Unset, the run joins when SLURM, Open MPI or the ``JAX_*``
#: variables describe several processes.
CLUSTER_VARIABLE = "DLAS_JAX_CLUSTER"


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
            launch.interruptible(jax.distributed.initialize, **kwargs)
    except ValueError as err:  # JAX found no environment to join
        raise UserError(f"jax.distributed ({how}): {err}") from None
    return (
        f"jax.distributed ({how}): process {jax.process_index()} of {jax.process_count()}, "
        f"{jax.local_device_count()} local / {jax.device_count()} global devices, "
        f"GPUs {jax.config.read('jax_cuda_visible_devices')} of CUDA_VISIBLE_DEVICES="
        f"{env.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
    )


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


# --- replicas and processes -------------------------------------------------------------------


def make_mesh(num_devices: int | None = None) -> Mesh:
    """A 1-D mesh named ``data`` over the first ``num_devices`` devices (all by default).

    Raises:
        UserError: more devices asked for than there are.
    """
    if num_devices is not None and not 1 <= num_devices <= jax.device_count():
        raise UserError(
            f"--num_devices {num_devices}: this process sees {jax.device_count()} {jax.default_backend()} device(s)"
        )
    devices = jax.devices()[: num_devices or jax.device_count()]
    return Mesh(np.array(devices), ("data",))


def num_replicas(mesh: Mesh) -> int:
    """Data-parallel replicas of the run, over all its processes: one per device.

    JAX: the mesh's devices."""
    return mesh.size


def local_shards(mesh: Mesh) -> list[int]:
    """Replica indices (data shards) of this process's devices, in replica order.

    JAX: the mesh's devices that belong to this process."""
    return [i for i, d in enumerate(mesh.devices.flat) if d.process_index == jax.process_index()]


def process_index() -> int:
    """This process's rank in a multi-process run (0 alone).

    JAX: ``jax.process_index()``."""
    return jax.process_index()


def is_main_process() -> bool:
    """True on process 0, which alone writes logs, metrics and weights files."""
    return process_index() == 0


def main_process_flag(flag: bool) -> bool:
    """Process 0's ``flag`` on every process, so all processes take the same branch.

    JAX: a broadcast from process 0."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is True on any process (every process must call it at the same point); the
    flag itself in a one-process run.

    JAX: a one-integer all-gather over the processes."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.max(multihost_utils.process_allgather(np.int32(flag))))


def process_rows(row: np.ndarray) -> np.ndarray:
    """Every process's ``row`` (one shape and dtype on all), stacked in process order: shape
    ``(processes, *row.shape)`` on every process (every process must call it at the same point).

    JAX: an all-gather over the processes."""
    if jax.process_count() == 1:
        return np.asarray(row)[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(row)))


def lost_peer(err: BaseException) -> str | None:
    """What ``err`` says of another process of the run that ended (its collective failed, its heartbeat
    stopped): ``"process N (of M): <the framework's first line>"`` (N where the world has two
    processes or the error names it), else None.

    JAX: a ``JaxRuntimeError`` (a ``ValueError`` where the collective runs inside ``jax.jit``'s
    dispatch) from Gloo's or NCCL's transport, or from the coordination service."""
    if not isinstance(err, jax.errors.JaxRuntimeError | ValueError):
        return None
    text = str(err)
    if not any(mark in text for mark in ("Gloo ", "NCCL", "heartbeat timeout", "coordination service")):
        return None
    # JAX's exit function shuts the distributed runtime down, which waits for the lost process and then
    # aborts the process: the run ends without it (jax.distributed.shutdown is JAX's own step there)
    from jax._src import api as jax_api

    atexit.unregister(jax_api.clean_up)
    return launch.lost_process(text, jax.process_index(), jax.process_count())


# --- batches on the devices ----------------------------------------------------------------------


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over ``data``."""
    return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def put_replicated(host: np.ndarray, mesh: Mesh) -> jax.Array:
    """A copy of ``host`` on every device of the mesh (each process passes the same array)."""
    return jax.make_array_from_callback(host.shape, replicated(mesh), lambda index: host[index])


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Global arrays, sharded on the batch axis, from this process's part of the batch."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def abstract(tree):
    """Shapes, dtypes and shardings of the arrays of ``tree`` (``jax.ShapeDtypeStruct``s)."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree)


# --- compilation: the one place that sets XLA options -------------------------------------------


def configure_xla(cfg: Config) -> dict:
    """The one place that sets JAX/XLA options; returns what was set (logged by the run).

    The persistent compilation cache makes a second run of the same config skip compilation. It goes
    where ``JAX_COMPILATION_CACHE_DIR`` says (a centre points it at scratch), else in the config's
    ``xla_cache_dir``: the environment wins over the config, as ``TF_XLA_FLAGS`` does in
    :func:`tf_impl.distribute.configure_xla`; a folder that cannot be written is left out with a
    warning (:func:`shared_data.runtime.xla_flags.writable_cache`).
    """
    settings = {}
    from_env = os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
    cache = from_env or (str(cfg.resolve_path(cfg.xla_cache_dir)) if cfg.xla_cache_dir else "")
    source = "JAX_COMPILATION_CACHE_DIR" if from_env else "xla_cache_dir"
    if cache and xla_flags.writable_cache(cache, source):
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        settings["jax_compilation_cache_dir"] = cache + (" (JAX_COMPILATION_CACHE_DIR)" if from_env else "")
    settings["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    return settings


# --- device facts: what a record says about where it ran ---------------------------------------------


def banner() -> str:
    """The first log line's framework and version (with JAX, its backend)."""
    return f"JAX {jax.__version__} on {jax.default_backend()}"


def device_kind() -> str:
    """The first accelerator's name as its driver reports it (``NVIDIA H200``), else the platform.

    JAX: the first device's ``device_kind`` (``cpu`` without one)."""
    d = jax.devices()[0]
    return getattr(d, "device_kind", d.platform)


def versions() -> dict:
    """Library versions, devices and backend, recorded by runs, benchmarks, predictions and exports."""
    import flax
    import optax

    return {
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "backend": jax.default_backend(),
    }


def peak_memory_bytes() -> int | None:
    """Peak bytes in use on the first accelerator, where the framework reports it (a GPU), else None."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")
