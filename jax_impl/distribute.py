"""Data parallelism in JAX: one device mesh, the batch sharded over its ``data`` axis, parameters
replicated, all inside the one jitted step (XLA inserts the gradient all-reduce).

Replica ``r`` of the mesh is data shard ``r``; a process loads the shards of its own devices
(:func:`local_shards`) and :func:`put_batch` assembles the global array from process-local data.

The devices' other business lives here too: :func:`configure_xla`, the one place that sets XLA
options, and the facts a record carries about the devices (:func:`banner`, :func:`versions`,
:func:`peak_memory_bytes`), as in :mod:`tf_impl.distribute`.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shared_data.core.config import Config
from shared_data.core.errors import UserError

log = logging.getLogger(__name__)


def initialize() -> None:
    """Join a multi-process run when the environment describes one (SLURM, Open MPI, or
    ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID``); no-op otherwise.

    ``jax.distributed.initialize`` detects SLURM and Open MPI itself; the explicit variables cover
    a plain launch on several hosts or several processes on one host.
    """
    if jax.distributed.is_initialized():
        return
    addr = os.environ.get("JAX_COORDINATOR_ADDRESS")
    multi = addr or int(os.environ.get("SLURM_NTASKS", "1")) > 1 or int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
    if multi and os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes all-reduce over gloo
    if addr:
        jax.distributed.initialize(addr, int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"]))
    elif int(os.environ.get("SLURM_NTASKS", "1")) > 1 or int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        jax.distributed.initialize()
    else:
        return
    log.info(
        "jax.distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


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
    return mesh.size


def local_shards(mesh: Mesh) -> list[int]:
    """Replica indices (data shards) whose devices belong to this process, in mesh order."""
    return [i for i, d in enumerate(mesh.devices.flat) if d.process_index == jax.process_index()]


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over ``data``."""
    return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def process_index() -> int:
    """This process's rank in a multi-process run (0 alone)."""
    return jax.process_index()


def is_main_process() -> bool:
    """True on process 0, which alone writes logs, metrics and weights files."""
    return process_index() == 0


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

    The persistent compilation cache makes a second run of the same config skip compilation.
    """
    settings = {}
    if cfg.xla_cache_dir:
        cache = str(cfg.resolve_path(cfg.xla_cache_dir))
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        settings["jax_compilation_cache_dir"] = cache
    settings["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    return settings


# --- device facts: what a record says about where it ran ---------------------------------------------


def banner() -> str:
    """The first log line's framework, version and backend."""
    return f"JAX {jax.__version__} on {jax.default_backend()}"


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
    """Peak bytes in use on the first local device, if the backend reports it (GPU)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")
