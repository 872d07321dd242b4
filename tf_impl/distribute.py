"""Data parallelism in TensorFlow: ``tf.distribute`` strategies.

Replica ``r`` of the run is data shard ``r``: a process loads the shards of its own devices
(:func:`local_shards`), one run on any world size is the same experiment, and every process agrees on
a stop or a verdict through one collective (:func:`any_process`, :func:`main_process_flag`).

The devices' other business lives here too: :func:`configure_xla`, the one place that sets XLA
options, and the facts a record carries about the devices (:func:`banner`, :func:`versions`,
:func:`peak_memory_bytes`).

TensorFlow: ``MirroredStrategy`` over one host's GPUs (or logical CPU devices for tests),
``MultiWorkerMirroredStrategy`` across processes from ``TF_CONFIG`` or the SLURM cluster resolver; a
single device uses the default strategy, so the same loop runs everywhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence

import keras
import numpy as np
import tensorflow as tf

from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.runtime import launch, xla_flags

from tf_impl import cluster
from tf_impl.cluster import process_count, process_index

log = logging.getLogger(__name__)


# --- replicas and processes -------------------------------------------------------------------


def make_strategy(num_devices: int | None = None) -> tf.distribute.Strategy:
    """The strategy for this process: multi-worker when ``TF_CONFIG`` or a SLURM step of several
    tasks describes a cluster, mirrored over the first ``num_devices`` local devices (all GPUs by
    default), else the default strategy.

    Raises:
        UserError: more devices asked for than there are.
    """
    if os.environ.get("TF_CONFIG") or launch.slurm_step(os.environ):
        return cluster.join_workers()
    gpus = tf.config.list_logical_devices("GPU")
    devices = gpus or tf.config.list_logical_devices("CPU")
    if num_devices is not None and not 1 <= num_devices <= len(devices):
        raise UserError(
            f"--num_devices {num_devices}: this process sees {len(devices)} {'GPU' if gpus else 'CPU'} device(s)"
        )
    devices = devices[: num_devices or len(devices)] if (gpus or num_devices) else devices[:1]
    if len(devices) > 1:
        # NCCL refuses two replicas on one physical GPU (logical GPUs, split_gpu): reduce through one device
        shared = gpus and len(gpus) > len(tf.config.list_physical_devices("GPU"))
        cross = tf.distribute.ReductionToOneDevice() if shared else None
        return tf.distribute.MirroredStrategy([d.name for d in devices], cross_device_ops=cross)
    return tf.distribute.get_strategy()


def num_replicas(strategy: tf.distribute.Strategy) -> int:
    """Data-parallel replicas of the run, over all its processes: one per device.

    TensorFlow: the strategy's replicas in sync."""
    return strategy.num_replicas_in_sync


def local_shards(strategy: tf.distribute.Strategy) -> list[int]:
    """Replica indices (data shards) of this process's devices, in replica order.

    TensorFlow: this worker's devices, after the other workers' (task index x local devices)."""
    if strategy.num_replicas_in_sync == 1:
        return [0]
    local = len(strategy.extended.worker_devices)
    return [process_index() * local + i for i in range(local)]


def is_main_process() -> bool:
    """True on process 0, which alone writes logs, metrics and weights files."""
    return process_index() == 0


def main_process_flag(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """Process 0's ``flag`` on every process, so all processes take the same branch.

    TensorFlow: replica 0's value summed over the replicas."""
    if process_count() == 1:
        return bool(flag)
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(float(flag) if ctx.replica_id_in_sync_group == 0 else 0.0)
    )
    return bool(strategy.reduce("SUM", values, axis=None) > 0)


def any_process(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """Whether ``flag`` is True on any process (every process must call it at the same point); the
    flag itself in a one-process run.

    TensorFlow: a sum over the replicas of the workers' flags."""
    if process_count() == 1:
        return flag
    value = per_replica(strategy, lambda: tf.constant(int(flag), tf.int32))
    return int(strategy.reduce("SUM", value, axis=None)) > 0


def process_rows(strategy: tf.distribute.Strategy, row: np.ndarray) -> np.ndarray:
    """Every process's ``row`` (one shape and dtype on all), stacked in process order: shape
    ``(processes, *row.shape)`` on every process (every process must call it at the same point).

    TensorFlow: a sum over the replicas of a table that holds the row in this worker's line, given by
    the worker's first replica alone."""
    if process_count() == 1:
        return np.asarray(row)[None]
    table = np.zeros((process_count(), *np.shape(row)), np.asarray(row).dtype)
    table[process_index()] = row
    first = local_shards(strategy)[0]
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(table if ctx.replica_id_in_sync_group == first else np.zeros_like(table))
    )
    return strategy.reduce("SUM", value, axis=None).numpy()


def lost_peer(err: BaseException) -> str | None:
    """What ``err`` says of another process of the run that ended (its collective failed, its heartbeat
    stopped): ``"process N (of M): <the framework's first line>"`` (N where the world has two
    processes or the error names it), else None.

    TensorFlow: an ``UnavailableError`` or ``AbortedError`` whose collective ops were aborted."""
    if not isinstance(err, tf.errors.UnavailableError | tf.errors.AbortedError):
        return None
    text = str(err)
    if "Collective ops is aborted" not in text and "unhealthy" not in text:
        return None
    return launch.lost_process(text, process_index(), process_count())


# --- batches on the devices ----------------------------------------------------------------------


def per_replica(strategy: tf.distribute.Strategy, make: Callable[[], dict]):
    """``make()`` as this step's batch: a plain dict with one replica, per-replica values with several."""
    if strategy.num_replicas_in_sync == 1:
        return make()
    return strategy.experimental_distribute_values_from_function(lambda _ctx: make())


def replica_batches(
    strategy: tf.distribute.Strategy, shards: Sequence[int], iterators: Sequence[Iterator], steps: int
) -> Iterator:
    """``steps`` batches from one iterator per local replica: plain dicts with one replica,
    per-replica values with several (replica ``r`` gets shard ``r``'s batch, as in JAX)."""
    if strategy.num_replicas_in_sync == 1:
        yield from iterators[0]
        return
    first = shards[0]
    for _ in range(steps):
        parts = [next(it) for it in iterators]
        yield strategy.experimental_distribute_values_from_function(
            lambda ctx: parts[ctx.replica_id_in_sync_group - first]
        )


def default_device() -> str:
    """The device a single replica runs on: the first GPU, else the CPU."""
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def sync_devices(strategy: tf.distribute.Strategy) -> None:
    """Return once every op dispatched to this worker's devices has run: TensorFlow's
    ``tf.test.experimental.sync_devices`` over this worker's devices alone. TF's own visits every
    device of the context, which under ``MultiWorkerMirroredStrategy`` lists the other workers' devices
    too; those take collectives, not eager ops ("Haven't set up remote eager worker")."""
    if isinstance(strategy, tf.distribute.MirroredStrategy | tf.distribute.MultiWorkerMirroredStrategy):
        devices = strategy.extended.worker_devices
    else:
        devices = [d.name for d in tf.config.list_logical_devices()]
    for name in devices:
        with tf.device(name):
            tf.raw_ops.SyncDevice()


# --- compilation: the one place that sets XLA options -------------------------------------------


def configure_xla(cfg: Config) -> dict:
    """The one place that sets TF/XLA options; returns what was set (logged by the run).

    XLA compiles only where asked (the steps' ``jit_compile=enable_jit``). TF's persistent
    compilation cache (``--tf_xla_persistent_cache_directory``, read at the first compilation)
    goes where ``TF_XLA_FLAGS`` names one, else in ``<xla_cache_dir>/tf``: the environment wins over
    the config, as ``JAX_COMPILATION_CACHE_DIR`` does in :func:`jax_impl.distribute.configure_xla`; a
    folder that cannot be written is left out with a warning (:func:`shared_data.runtime.xla_flags.writable_cache`).
    A second run of the same config loads its executables instead of compiling them. TensorFlow
    reads ``TF_XLA_FLAGS`` once, at the first device query (``list_logical_devices``, a strategy), so
    this runs before those.
    """
    tf.config.optimizer.set_jit(False)
    flags = os.environ.get("TF_XLA_FLAGS", "")
    named = xla_flags.tf_cache_folder(flags)
    if named is not None and not xla_flags.writable_cache(named, "TF_XLA_FLAGS"):
        os.environ["TF_XLA_FLAGS"] = xla_flags.without_tf_cache(flags)  # TF would fail the first compilation
    elif named is None and cfg.xla_cache_dir:
        cache = cfg.resolve_path(cfg.xla_cache_dir) / "tf"
        if xla_flags.writable_cache(cache, "xla_cache_dir"):
            os.environ["TF_XLA_FLAGS"] = f"{flags} {xla_flags.TF_CACHE_FLAG}={cache}".strip()
    return {
        "jit_compile": cfg.enable_jit,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "TF_XLA_FLAGS": os.environ.get("TF_XLA_FLAGS", ""),
    }


# --- device facts: what a record says about where it ran ---------------------------------------------


def banner() -> str:
    """The first log line's framework and version (with JAX, its backend)."""
    return f"TensorFlow {tf.__version__} (Keras {keras.__version__})"


def device_kind() -> str:
    """The first accelerator's name as its driver reports it (``NVIDIA H200``), else the platform.

    TensorFlow: the first GPU's ``device_name`` (``CPU`` without one)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU"
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")


def versions() -> dict:
    """Library versions, devices and backend, recorded by runs, benchmarks, predictions and exports."""
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "devices": [d.name for d in tf.config.list_logical_devices()],
        "backend": "gpu" if tf.config.list_logical_devices("GPU") else "cpu",
    }


def peak_memory_bytes() -> int | None:
    """Peak bytes in use on the first accelerator, where the framework reports it (a GPU), else None."""
    if not tf.config.list_logical_devices("GPU"):
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"]
