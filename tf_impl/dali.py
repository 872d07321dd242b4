"""DALI input for TensorFlow: the shared pipelines (:mod:`shared_data.data.dali_pipelines`).

:class:`DaliInput` runs them through DALI's TF plugin
(``nvidia.dali.plugin.tf.experimental.DALIDatasetWithInputs``), one dataset per replica and epoch.
The per-step crop starts and symmetry parameters enter as ``tf.data`` input datasets made from the
epoch's plan (the TF plugin runs Python callbacks only as generators of CPU data); for ``dali-h5``
the channel-first crops come from a ``tf.data`` map over the shared HDF5 reader; for ``dali-device``
without a GPU they are sliced from the volumes in host memory, fed the same way. With a GPU the
dataset is placed on the replica's GPU (``device_id``), without one it runs CPU-only
(``device_id=None``).

:class:`DaliDeviceInput` is ``dali-device`` on GPUs: ``tf.data`` cannot carry GPU tensors into the
plugin, so the pipelines (one per replica) run from Python as JAX's do, their crops cut on the GPU
by :func:`crop_fns` and handed to DALI as DLPack capsules, their outputs handed back to TensorFlow
the same way.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from shared_data.core import loader_kinds
from shared_data.core.config import Config, batch_sizes
from shared_data.data import dali_pipelines as dp
from shared_data.data import dataset, host_batches
from shared_data.data.crop_readers import H5LowMemReader
from shared_data.data.sampler import SPLITS

from tf_impl import cluster, distribute

log = logging.getLogger(__name__)


class DaliInput:
    """Batches of one split from DALI, one ``DALIDatasetWithInputs`` per replica and epoch:
    ``steps`` per epoch, ``epoch(e)`` an iterator (the contract of :class:`tf_impl.data.Input`)."""

    def __init__(
        self, cfg: Config, split: str, strategy: tf.distribute.Strategy, first_epoch: int = 0, first_step: int = 0
    ):
        dp.require_dali()
        import nvidia.dali.plugin.tf as dali_tf

        self.dali_tf = dali_tf
        self.cfg, self.split_name, self.split, self.strategy = cfg, split, SPLITS[split], strategy
        self.path = cfg.data_file(split)
        self.reader = H5LowMemReader(self.path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
        self.shards = distribute.local_shards(strategy)
        self.replicas = distribute.num_replicas(strategy)
        _, self.local_bs = batch_sizes(cfg, self.replicas)
        self.gpus = tf.config.list_logical_devices("GPU")
        if not self.gpus:
            log.info("DALI %s/%s: no GPU, CPU-only pipelines (device_id=None)", cfg.data_loader_config, split)
        kind = loader_kinds.loader_kind(cfg)
        self.volumes = dp.load_volumes(self.path, cfg) if kind.device_volumes else None
        self.crops_outside = kind.crops_outside_dali
        self.steps = len(self.plan(0, 0, self.shards))
        self.cursor = host_batches.EpochCursor(self.split, first_epoch, first_step)

    def plan(self, epoch: int, first_step: int = 0, shards: list[int] | None = None) -> host_batches.EpochPlan:
        """The crops of ``epoch`` from ``first_step`` on for ``shards`` (default: this process's)."""
        return host_batches.make_plan(
            self.cfg, self.split, epoch, shards or self.shards, self.replicas, self.reader.size, first_step
        )

    def dataset(self, epoch: int, shard: int, first_step: int = 0) -> Iterator[dict]:
        """One replica's batches of ``epoch`` from step ``first_step``, from a DALI pipeline fed by its plan."""
        cfg, s = self.cfg, self.cfg.crop_size
        plan = self.plan(epoch, first_step, [shard])
        params = dp.plan_params(plan, cfg)
        inputs = {
            k: self.dali_tf.experimental.Input(tf.data.Dataset.from_tensor_slices(v), batch=True)
            for k, v in params.items()
        }
        local = shard - self.shards[0]
        if self.crops_outside:
            inputs.update(self._crop_inputs(plan, self.gpus[local].name if self.gpus else None))
        device_id = cluster.physical_gpu_index(local) if self.gpus else None
        pipe = dp.build_pipeline(cfg, self.split_name, self.local_bs, device_id)
        shapes = (
            (self.local_bs, s, s, s, cfg.N_in_channels),
            (self.local_bs, s, s, s, cfg.N_out_channels),
            (self.local_bs,),
        )
        with tf.device(self.gpus[local].name if self.gpus else "/cpu:0"):
            ds = self.dali_tf.experimental.DALIDatasetWithInputs(
                pipeline=pipe,
                input_datasets=inputs,
                batch_size=self.local_bs,
                output_dtypes=(tf.float32,) * 3,
                output_shapes=shapes,
                device_id=device_id,
                num_threads=cfg.dali_threads,
                prefetch_queue_depth=cfg.dali_prefetch_queue_depth,
            )
        # no tf.data map after a GPU-placed DALIDataset: the tuples become dicts here
        return ({"inputs": x, "targets": y, "mask": m} for x, y, m in ds)

    def epoch(self, epoch: int) -> Iterator:
        """Batches of ``epoch``: plain dicts with one replica, per-replica values with several."""
        first = self.cursor.advance(epoch)
        iters = [iter(self.dataset(epoch, r, first)) for r in self.shards]
        return distribute.replica_batches(self.strategy, self.shards, iters, self.steps - first)

    def _crop_inputs(self, plan, gpu: str | None) -> dict:
        """``Nbody``/``Hydro`` input datasets: each step's crops, channel-first as the shared reader
        reads them (``dali-h5``) or DHWC with their channels mapped as :func:`shared_data.data.
        dali_pipelines.numpy_crops` slices them from the loaded volumes (``dali-device``), in a
        parallel ``tf.data`` map on the CPU. For a dataset on ``gpu`` the crops are copied there
        (``copy_to_device``, as DALI's plugin does with its own callback inputs): a map instantiated
        inside the GPU-placed ``DALIDataset`` fails with CUDA_ERROR_INVALID_VALUE."""
        cfg, s = self.cfg, self.cfg.crop_size
        out = {}
        for key, n in zip(dataset.KEYS, (cfg.N_in_channels, cfg.N_out_channels)):
            src, sign = dp.channel_tables(cfg, key)

            def read(step, key=key, n=n, src=src, sign=sign):
                draws = plan.draws[int(step)]
                if self.volumes is not None:  # dali-device: the channel part is applied while cutting
                    g = draws.symmetries
                    return dp.numpy_crops(self.volumes[key], draws.starts, src[g], sign[g], size=s)
                buf = np.empty((len(draws), n, s, s, s), np.float32)
                for i, start in enumerate(draws.starts):
                    self.reader.read_one(key, start, buf[i])
                return buf

            with tf.device("/cpu:0"):
                ds = tf.data.Dataset.range(len(plan)).map(
                    lambda i, read=read: tf.numpy_function(read, [i], tf.float32, stateful=False),
                    num_parallel_calls=cfg.num_data_workers,
                    deterministic=True,
                )
                ds = ds.prefetch(2)
            if gpu is not None:
                ds = ds.apply(tf.data.experimental.copy_to_device(gpu))
            out[key] = self.dali_tf.experimental.Input(ds, batch=True)
        return out


def cut_crops(volume: tf.Tensor, starts: tf.Tensor, src: tf.Tensor, sign: tf.Tensor, *, size: int, crop: int):
    """DHWC crops with their channels mapped, from a channels-last volume on the device.

    ``volume`` float32 (L^3 * C,) flattened from (L, L, L, C); ``starts`` int32 (n, 3); ``src``
    int32 (n, C); ``sign`` float32 (n, C); returns float32 (n, s, s, s, C) with channel d of crop
    i equal to ``sign[i, d] * volume[start + (x, y, z), src[i, d]]`` (:func:`shared_data.data.
    dali_pipelines.numpy_crops`), one flat-index gather per output value."""
    channels = src.shape[-1]
    y = tf.range(crop, dtype=tf.int32)
    st = [starts[:, i, None] + y[None] for i in range(3)]  # (n, s) each
    row = (st[0][:, :, None, None] * size + st[1][:, None, :, None]) * size + st[2][:, None, None, :]
    idx = row[..., None] * channels + src[:, None, None, None, :]  # (n, s, s, s, C)
    return tf.gather(volume, idx) * sign[:, None, None, None, :]


def crop_fns(volumes: dict, device: str | None, size: int) -> dict:
    """``dali-device`` crop functions by key (the :class:`shared_data.data.dali_pipelines.
    DeviceCropSource` contract; TF twin of :func:`jax_impl.dali.crop_fns`): draws of k steps,
    ``(starts, src, sign)`` (k, B, 3) int32, (k, B, C) int32, (k, B, C) float32 -> k DHWC batches
    (B, s, s, s, C) float32. On ``device`` (a TF GPU) the volume is put in its memory once, all k
    steps are cut by one XLA call, complete when returned, and handed over as DLPack capsules;
    without a device, NumPy."""
    if device is None:
        return {k: functools.partial(dp.numpy_step_crops, v, size=size) for k, v in volumes.items()}

    def make(volume: np.ndarray):
        channels = volume.shape[0]
        with tf.device(device):
            flat = tf.identity(tf.constant(np.ascontiguousarray(np.moveaxis(volume, 0, -1)).reshape(-1)))
        cut = functools.partial(cut_crops, size=volume.shape[1], crop=size)

        @tf.function(jit_compile=True)
        def steps(starts, src, sign):
            k, b = starts.shape[0], starts.shape[1]
            out = cut(
                flat, tf.reshape(starts, (-1, 3)), tf.reshape(src, (-1, channels)), tf.reshape(sign, (-1, channels))
            )
            return tuple(tf.unstack(tf.reshape(out, (k, b, size, size, size, channels))))

        def run(starts, src, sign):
            with tf.device(device):
                out = steps(tf.constant(starts), tf.constant(src), tf.constant(sign))
            np.asarray(tf.reshape(out[-1], [-1])[:1])  # the device finished: DALI reads the memory next
            return [tf.experimental.dlpack.to_dlpack(t) for t in out]

        return run

    return {k: make(v) for k, v in volumes.items()}


class DaliDeviceInput:
    """``dali-device`` on GPUs: one pipeline per replica, run from Python (the contract of
    :class:`tf_impl.data.Input`: ``steps`` per epoch, ``epoch(e)`` an iterator). Each replica's
    crops are cut on its GPU by :func:`crop_fns`, DALI applies the symmetry there, and each output
    is handed to TensorFlow by DLPack and copied into TensorFlow's memory (DALI reuses its output
    buffers)."""

    def __init__(
        self, cfg: Config, split: str, strategy: tf.distribute.Strategy, first_epoch: int = 0, first_step: int = 0
    ):
        dp.require_dali()
        self.cfg, self.strategy, self.split = cfg, strategy, SPLITS[split]
        path = cfg.data_file(split)
        size = dataset.validate(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size).size
        self.shards, replicas = distribute.local_shards(strategy), distribute.num_replicas(strategy)
        _, local_bs = batch_sizes(cfg, replicas)
        gpus = tf.config.list_logical_devices("GPU")
        # without a GPU (tests) the same path runs CPU-only: NumPy crops, device_id=None
        self.devices = [gpus[i].name if gpus else None for i in range(len(self.shards))]
        volumes = dp.load_volumes(path, cfg)
        self.pipes = []
        for i, shard in enumerate(self.shards):
            plans = dp.EpochPlans(cfg, self.split, [shard], replicas, size, first_epoch)
            sources = dp.device_crop_sources(plans, crop_fns(volumes, self.devices[i], cfg.crop_size), cfg)
            device_id = cluster.physical_gpu_index(i) if gpus else None
            pipe = dp.build_pipeline(cfg, split, local_bs, device_id, plans, sources)
            pipe.build()
            self.pipes.append(pipe)
        self.steps = len(plans(0))
        self.cursor = host_batches.EpochCursor(self.split, first_epoch, first_step)
        self.copy = tf.function(tf.identity, jit_compile=True)  # an XLA output is a new buffer
        self.runs = [0] * len(self.pipes)  # steps each pipeline has run in its current epoch

    def _finish_epoch(self, i: int) -> None:
        """Ends pipeline ``i``'s current epoch if it has begun: the steps nobody took are run and
        dropped, the sources' closing StopIteration is taken, and the pipeline is reset. This runs
        when the next epoch starts, since the trainer takes ``steps`` batches and never asks the
        generator for more (code after its last ``yield`` would never run)."""
        if not self.runs[i]:
            return
        pipe = self.pipes[i]
        for _ in range(self.steps - self.runs[i]):
            pipe.run()
        try:
            pipe.run()
        except StopIteration:
            pass
        pipe.reset()
        self.runs[i] = 0

    def dataset(self, epoch: int, shard: int, first_step: int = 0) -> Iterator[dict]:
        """One replica's batches of the pipeline's next epoch (``epoch`` is the cursor's) from step
        ``first_step``: the pipeline runs the whole epoch and the batches before it are dropped."""
        i = shard - self.shards[0]
        self._finish_epoch(i)
        pipe = self.pipes[i]
        for step in range(self.steps):
            outputs = pipe.run()
            self.runs[i] += 1
            if step < first_step:
                continue
            with tf.device(self.devices[i]):
                yield {
                    name: self.copy(tf.experimental.dlpack.from_dlpack(t.as_tensor().__dlpack__()))
                    for name, t in zip(dp.OUTPUTS, outputs)
                }

    def epoch(self, epoch: int) -> Iterator:
        """Batches of ``epoch``: plain dicts with one replica, per-replica values with several."""
        first = self.cursor.advance(epoch)
        iters = [iter(self.dataset(epoch, r, first)) for r in self.shards]
        return distribute.replica_batches(self.strategy, self.shards, iters, self.steps - first)
