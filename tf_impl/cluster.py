"""How a TensorFlow process joins a multi-process run: the counterpart of :mod:`jax_impl.cluster`.

:func:`initialize` reads what the launcher describes (``TF_CONFIG``, a SLURM step of several tasks)
before TensorFlow sets up its devices; :func:`process_index` and :func:`process_count` say where this
process stands; :func:`join_workers` builds the multi-worker strategy once every worker is there
(:func:`tf_impl.distribute.make_strategy` calls it). What the processes then do together (replicas,
collectives) is :mod:`tf_impl.distribute`. The devices a process drives are set here too: its GPUs
under SLURM, and logical devices that give one GPU or the CPU several replicas (:func:`split_gpu`,
:func:`split_cpu`; JAX's CPU devices come from ``XLA_FLAGS``).

TensorFlow: ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG``'s cluster or TensorFlow's SLURM cluster
resolver, with this task's GPUs as SLURM gives them.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from shared_data.core.errors import UserError
from shared_data.runtime import launch, signals

#: ``DLAS_TF_PORT``: the first worker port of a SLURM step (each task of a node takes the next one).
PORT_VARIABLE = "DLAS_TF_PORT"


# --- joining a multi-process run -----------------------------------------------------------------


def initialize() -> str | None:
    """Join a multi-process run when the environment describes one and return the line that says
    where this process stands (``None`` alone). Under a SLURM step the GPUs each task drives come from
    :func:`shared_data.runtime.launch.task_gpus` (right for ``--gpus-per-task`` too).

    TensorFlow: ``TF_CONFIG`` or a SLURM step of several tasks; this keeps the task's own GPUs visible,
    and the strategy joins the cluster (:func:`make_strategy`)."""
    env = os.environ
    if env.get("TF_CONFIG"):
        return f"tf.distribute (TF_CONFIG): worker {process_index()} of {process_count()}"
    if not launch.slurm_step(env):
        return None
    gpus = tf.config.list_physical_devices("GPU")
    ids = launch.task_gpus(env, len(gpus)) or []
    if gpus:
        tf.config.set_visible_devices([gpus[i] for i in ids], "GPU")
    return (
        f"tf.distribute (SLURM): worker {process_index()} of {process_count()}, "
        f"GPUs {','.join(map(str, ids)) or 'none'} of CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
    )


def join_workers() -> tf.distribute.MultiWorkerMirroredStrategy:
    """The multi-worker strategy of ``TF_CONFIG`` or the SLURM step, once every worker has joined (its
    start waits for them), said and timed by :func:`shared_data.runtime.launch.joining`
    (``DLAS_START_TIMEOUT``), which names the workers whose port is closed."""
    resolver = (
        tf.distribute.cluster_resolver.TFConfigClusterResolver() if os.environ.get("TF_CONFIG") else slurm_resolver()
    )
    spec = resolver.cluster_spec()
    workers = [address for job in spec.jobs for address in spec.job_tasks(job)]
    for i, address in enumerate(workers):  # a worker that cannot listen would be waited for until the time-out
        launch.port_of(address, f"worker {i}'s address")
    launch.claim_port(workers[process_index()], f"worker {process_index()}'s address")
    with launch.joining(
        process_index(), len(workers), ", ".join(workers), dict(enumerate(workers)), holds_interpreter=True
    ):
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    # the coordination service took SIGTERM from Python (its preemption notifier): SLURM's SIGTERM
    # is the run's, which stops every worker at one step boundary (shared_data.runtime.signals);
    # held since the import (tf_impl), it reaches the run's handler from here on
    signals.reinstall()
    signals.release_sigterm()
    return strategy


def slurm_resolver() -> tf.distribute.cluster_resolver.ClusterResolver:
    """The cluster of this SLURM step (TensorFlow's SLURM resolver) with this task's GPUs as
    :func:`initialize` left them visible: the resolver's own GPU choice assumes every task sees every
    GPU of the node, needs nvidia-smi, and cannot say zero GPUs (a CPU node).

    Raises:
        UserError: the resolver cannot read the step from the environment (a ``SLURM_STEP_*``
            variable missing or malformed: a process not started by ``srun``).
    """
    gpus = len(tf.config.get_visible_devices("GPU"))
    per_task = max(gpus, 1)  # the resolver divides by it; the accelerator count below is the real one
    try:
        slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
            gpus_per_node=per_task * launch.slurm_tasks_on_node(os.environ),
            gpus_per_task=per_task,
            port_base=slurm_port_base(os.environ),
            auto_set_gpu=False,
        )
        spec = slurm.cluster_spec()
    except (KeyError, RuntimeError, ValueError) as err:  # the resolver reads SLURM_STEP_* itself
        raise UserError(f"tf.distribute (SLURM): {err}") from None
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=slurm.task_type, task_id=slurm.task_id, num_accelerators={"GPU": gpus}, rpc_layer="grpc"
    )


def slurm_port_base(env) -> int:
    """The first worker port of a SLURM step: ``DLAS_TF_PORT``, else 40000 + 8 x (job id mod 2048), so two
    jobs on one node seldom collide (the resolver's own default, 8888, is every job's).

    Raises:
        UserError: ``DLAS_TF_PORT`` is not a port number; ``SLURM_JOB_ID`` is not an integer.
    """
    if env.get(PORT_VARIABLE):
        value = env[PORT_VARIABLE]
        if not value.isdigit() or not 1024 <= int(value) <= 65000:
            raise UserError(f"{PORT_VARIABLE}={value!r}: expected a port number in 1024-65000")
        return int(value)
    return 40000 + 8 * (launch.env_int(env, "SLURM_JOB_ID", 0) % 2048)


def process_index() -> int:
    """This process's rank in a multi-process run (0 alone).

    TensorFlow: the task index of ``TF_CONFIG``, else ``SLURM_PROCID`` in a SLURM step of several
    tasks."""
    config = tf_config()
    if config:
        try:
            return int(config.get("task", {}).get("index", 0))
        except (ValueError, AttributeError):
            raise UserError(f"TF_CONFIG: expected a task index, found {config.get('task')!r}") from None
    if launch.slurm_step(os.environ):
        return launch.env_int(os.environ, "SLURM_PROCID", 0)
    return 0


def process_count() -> int:
    """The processes of the run (1 alone).

    TensorFlow: the tasks of ``TF_CONFIG``'s cluster, else ``SLURM_STEP_NUM_TASKS`` in a SLURM step of
    several tasks."""
    config = tf_config()
    if config:
        cluster = config.get("cluster", {})
        return sum(len(v) for v in cluster.values() if isinstance(v, list)) if isinstance(cluster, dict) else 1
    if launch.slurm_step(os.environ):
        return launch.env_int(os.environ, "SLURM_STEP_NUM_TASKS", 1, 1)
    return 1


def tf_config() -> dict:
    """``TF_CONFIG`` read as JSON (empty where it is unset).

    Raises:
        UserError: ``TF_CONFIG`` is not a JSON object."""
    text = os.environ.get("TF_CONFIG")
    try:
        config = json.loads(text) if text else {}
    except ValueError:
        config = None
    if not isinstance(config, dict):
        raise UserError(f"TF_CONFIG is not the JSON TensorFlow expects: {text[:80]!r}")
    return config


# --- logical devices: several replicas on one device (tests, one GPU) -------------------------


def physical_gpu_index(logical_index: int) -> int:
    """The physical GPU behind logical GPU ``logical_index`` (DALI's ``device_id``): logical GPUs
    are made per physical GPU in order, the same number on each (:func:`split_gpu`)."""
    physical = len(tf.config.list_physical_devices("GPU"))
    logical = len(tf.config.list_logical_devices("GPU"))
    return logical_index * physical // max(logical, 1)


def split_gpu(n: int, memory_mb: int = 16384) -> None:
    """Expose ``n`` logical GPUs of ``memory_mb`` MiB each on the first GPU (data parallel on one
    GPU: the MirroredStrategy code path without a second GPU). Must run before TensorFlow
    initialises its devices.

    Raises:
        UserError: TensorFlow sees no GPU.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise UserError("split_gpu: TensorFlow sees no GPU")
    config = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * n
    tf.config.set_logical_device_configuration(gpus[0], config)


def split_cpu(n: int) -> None:
    """Expose ``n`` logical CPU devices (tests of MirroredStrategy on a machine without GPUs).
    Must run before TensorFlow initialises its devices."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)


def split_cpu_once(n: int) -> None:
    """:func:`split_cpu` where TensorFlow has not yet set up its devices; where it has, its devices
    stay as they are (a later :func:`make_strategy` then says how many it sees)."""
    try:
        split_cpu(n)
    except RuntimeError:  # "Virtual devices cannot be modified after being initialized"
        pass
