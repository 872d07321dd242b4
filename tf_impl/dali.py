"""DALI input for TensorFlow: the shared pipelines (:mod:`shared_data.data.dali_pipelines`) through
``nvidia.dali.plugin.tf.experimental.DALIDatasetWithInputs``, one dataset per replica.

The per-step crop starts and symmetry parameters enter as ``tf.data`` input datasets made from the
epoch's plan (the TF plugin runs Python callbacks only as non-parallel generators); for ``dali-h5``
the channel-first crops come from a ``tf.data`` map over the shared HDF5 reader; for ``dali-device``
they are sliced from the volumes loaded once into memory, fed the same way (so TF's ``dali-device``
crops on the host: the GPU-resident form needs DLPack hand-over of TF GPU tensors, which no machine
of this project can run, TF having no GPU build there). With a GPU the
dataset is placed on the replica's GPU (``device_id``), without one it runs CPU-only
(``device_id=None``).
"""

from __future__ import annotations

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
from tf_impl import distribute

log = logging.getLogger(__name__)


class DaliInput:
    """Batches of one split from DALI, one ``DALIDatasetWithInputs`` per replica and epoch:
    ``steps`` per epoch, ``epoch(e)`` an iterator (the contract of :class:`tf_impl.data.Input`)."""

    def __init__(self, cfg: Config, split: str, strategy: tf.distribute.Strategy, first_epoch: int = 0):
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
        self.steps = len(self.plan(0, self.shards))
        self.cursor = host_batches.EpochCursor(self.split, first_epoch)

    def plan(self, epoch: int, shards: list[int]) -> host_batches.EpochPlan:
        return host_batches.make_plan(self.cfg, self.split, epoch, shards, self.replicas, self.reader.size)

    def dataset(self, epoch: int, shard: int) -> Iterator[dict]:
        """One replica's batches of ``epoch`` from a DALI pipeline fed by its plan."""
        cfg, s = self.cfg, self.cfg.crop_size
        plan = self.plan(epoch, [shard])
        params = dp.plan_params(plan, cfg)
        inputs = {
            k: self.dali_tf.experimental.Input(tf.data.Dataset.from_tensor_slices(v), batch=True)
            for k, v in params.items()
        }
        local = shard - self.shards[0]
        if self.crops_outside:
            inputs.update(self._crop_inputs(plan, self.gpus[local].name if self.gpus else None))
        device_id = distribute.physical_gpu_index(local) if self.gpus else None
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
        self.cursor.advance(epoch)
        iters = [iter(self.dataset(epoch, r)) for r in self.shards]
        return distribute.replica_batches(self.strategy, self.shards, iters, self.steps)

    def _crop_inputs(self, plan, gpu: str | None) -> dict:
        """``Nbody``/``Hydro`` input datasets: each step's channel-first crops read by the shared
        reader (``dali-h5``) or sliced from the loaded volumes (``dali-device``) in a parallel
        ``tf.data`` map on the CPU. For a dataset on ``gpu`` the crops are copied there
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
