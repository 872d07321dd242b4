"""Data parallelism in JAX: one device mesh, the batch sharded over its ``data`` axis.

Replica ``r`` of the run is data shard ``r``: a process loads the shards of its own devices
(:func:`local_shards`), one run on any world size is the same experiment, and every process agrees on
a stop or a verdict through one collective (:func:`any_process`, :func:`main_process_flag`).

The devices' other business lives here too: :func:`configure_xla`, the one place that sets XLA
options, and the facts a record carries about the devices (:func:`banner`, :func:`versions`,
:func:`peak_memory_bytes`).

JAX: parameters replicated, all inside the one jitted step (XLA inserts the gradient all-reduce);
processes join through ``jax.distributed`` (:func:`jax_impl.cluster.initialize`) and :func:`put_batch` assembles the
global array from process-local data.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.runtime import launch, xla_flags

from jax_impl import cluster
from jax_impl.cluster import process_count, process_index

log = logging.getLogger(__name__)


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


def is_main_process() -> bool:
    """True on process 0, which alone writes logs, metrics and weights files."""
    return process_index() == 0


def main_process_flag(flag: bool) -> bool:
    """Process 0's ``flag`` on every process, so all processes take the same branch.

    JAX: a broadcast from process 0."""
    if process_count() == 1:
        return bool(flag)
    return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is True on any process (every process must call it at the same point); the
    flag itself in a one-process run.

    JAX: a one-integer all-gather over the processes."""
    if process_count() == 1:
        return flag
    return bool(np.max(multihost_utils.process_allgather(np.int32(flag))))


def process_rows(row: np.ndarray) -> np.ndarray:
    """Every process's ``row`` (one shape and dtype on all), stacked in process order: shape
    ``(processes, *row.shape)`` on every process (every process must call it at the same point).

    JAX: an all-gather over the processes."""
    if process_count() == 1:
        return np.asarray(row)[None]
    return np.asarray(multihost_utils.process_allgather(np.asarray(row)))


def lost_peer(err: BaseException) -> str | None:
    """What ``err`` says of another process of the run that ended (its collective failed, its heartbeat
    stopped): ``"process N (of M): <the framework's first line>"`` (N where the world has two
    processes or the error names it), else None.

    JAX: a ``JaxRuntimeError`` (a ``ValueError`` where the collective runs inside ``jax.jit``'s
    dispatch) from Gloo's or NCCL's transport, or from the coordination service; or the
    :class:`jax_impl.cluster.PeerLost` of :func:`jax_impl.cluster.watch_peers`."""
    if isinstance(err, cluster.PeerLost):  # seen by the watch of the processes, not by a collective
        cluster.leave_alone()
        return str(err)
    if not isinstance(err, jax.errors.JaxRuntimeError | ValueError):
        return None
    text = str(err)
    if not any(mark in text for mark in ("Gloo ", "NCCL", "heartbeat timeout", "coordination service")):
        return None
    cluster.leave_alone()
    return launch.lost_process(text, process_index(), process_count())


# --- batches on the devices ----------------------------------------------------------------------


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over ``data``."""
    return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device of ``mesh`` holds the whole array (the train state's parameters)."""
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
