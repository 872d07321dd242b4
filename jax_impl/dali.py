"""DALI input for JAX: the shared pipelines (:mod:`shared_data.dali_pipelines`) through DALI's JAX
iterator (``nvidia.dali.plugin.jax.DALIGenericIterator``).

On GPUs there is one pipeline per local device, each producing its replica's shard of the batch on
that device, and the iterator assembles global arrays with the mesh's batch ``sharding``. Without a
GPU one CPU-only pipeline (``device_id=None``) makes this process's batch, which is then placed on
the mesh like the native loaders' batches.
"""
from __future__ import annotations

import logging
from typing import Iterator

import jax
from jax.sharding import Mesh

from jax_impl import distribute
from shared_data import dali_pipelines as dp
from shared_data import dataset
from shared_data.config import Config, batch_sizes
from shared_data.sampler import TRAIN, VAL

log = logging.getLogger(__name__)
SPLITS = {"train": TRAIN, "val": VAL}


class DaliInput:
    """Batches of one split from DALI: ``steps`` per epoch, ``epoch(e)`` an iterator of global arrays."""

    def __init__(self, cfg: Config, split: str, mesh: Mesh, epoch_offset: int = 0):
        dp.require_dali()
        from nvidia.dali.plugin.jax import DALIGenericIterator

        self.cfg, self.mesh = cfg, mesh
        path = cfg.resolve_path(cfg.train_path if split == "train" else cfg.val_path)
        size = dataset.validate(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size).size
        shards, replicas = distribute.local_shards(mesh), distribute.num_replicas(mesh)
        _, local_bs = batch_sizes(cfg, replicas)
        self.on_gpu = jax.default_backend() == "gpu"
        if self.on_gpu:  # one pipeline per local device = per shard
            groups = [([r], i) for i, r in enumerate(shards)]
        else:
            log.info("DALI %s/%s: no GPU, one CPU-only pipeline (device_id=None)", cfg.data_loader_config, split)
            groups = [(shards, None)]
        pipes = []
        for group, device_id in groups:
            plans = dp.EpochPlans(cfg, SPLITS[split], group, replicas, size, epoch_offset)
            sources = dp.crop_sources(plans, path, cfg) if cfg.data_loader_config == "dali-h5" else None
            pipes.append(dp.build_pipeline(cfg, cfg.data_loader_config, path, local_bs * len(group), device_id, plans, sources))
        self.steps = len(plans(0))
        kwargs = dict(sharding=distribute.batch_sharding(mesh)) if self.on_gpu else {}
        self.iterator = DALIGenericIterator(pipes, list(dp.OUTPUTS), auto_reset=True, **kwargs)
        self._next_epoch = 0

    def epoch(self, epoch: int) -> Iterator[dict[str, jax.Array]]:
        """The next epoch of the pipeline (DALI counts epochs itself; ``epoch`` must follow in order)."""
        del epoch  # the pipeline's own epoch counter + epoch_offset selects the plan
        for batch in self.iterator:
            yield batch if self.on_gpu else distribute.put_batch({k: jax.device_get(v) for k, v in batch.items()}, self.mesh)
