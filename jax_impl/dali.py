"""DALI input for JAX: the shared pipelines (:mod:`shared_data.data.dali_pipelines`) through DALI's JAX
iterator (``nvidia.dali.plugin.jax.DALIGenericIterator``).

On GPUs there is one pipeline per local device, each producing its replica's shard of the batch on
that device, and the iterator assembles global arrays with the mesh's batch ``sharding``. Without a
GPU one CPU-only pipeline (``device_id=None``) makes this process's batch, which is then placed on
the mesh like the native loaders' batches.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh

from shared_data.core import loader_kinds
from shared_data.core.config import Config, batch_sizes
from shared_data.data import dali_pipelines as dp
from shared_data.data import dataset, host_batches
from shared_data.data.sampler import SPLITS

from jax_impl import distribute

log = logging.getLogger(__name__)


def crop_fns(volumes: dict, device_id, size: int) -> dict:
    """``dali-device`` crop functions by key (the :class:`shared_data.data.dali_pipelines.DeviceCropSource`
    contract): draws of k steps, ``(starts, src, sign)`` (k, B, 3) int32, (k, B, C) int32,
    (k, B, C) float32 -> k DHWC arrays (B, s, s, s, C) float32 with output channel d = ``sign[..., d] *
    volume[src[..., d]]`` (:func:`shared_data.data.dali_pipelines.numpy_crops`). On GPU ``device_id``
    the volume is put in that device's memory once and all k steps are cut by one jitted call
    (``lax.dynamic_slice``, channel gather and the move of the channels last per sample, fused by XLA
    into one pass per output), complete when returned; without a GPU, NumPy."""
    if device_id is None:
        return {k: functools.partial(dp.numpy_step_crops, v, size=size) for k, v in volumes.items()}
    dev = jax.local_devices()[device_id]

    @jax.jit
    def crop(volume, starts, src, sign):
        c = volume.shape[0]
        zero = jnp.zeros((), starts.dtype)

        def one(st, sr, sg):
            cut = lax.dynamic_slice(volume, (zero, st[0], st[1], st[2]), (c, size, size, size))
            return jnp.moveaxis(cut[sr] * sg[:, None, None, None], 0, -1)

        return tuple(jax.vmap(one)(starts[k], src[k], sign[k]) for k in range(starts.shape[0]))

    def make(volume):
        on_dev = jax.device_put(volume, dev)

        def cut(starts, src, sign):
            args = (jax.device_put(a, dev) for a in (starts, src, sign))
            return jax.block_until_ready(crop(on_dev, *args))

        return cut

    return {k: make(v) for k, v in volumes.items()}


def make_iterator(pipes: list, samples_per_pipe: int, sharding=None):
    """DALI's JAX iterator over ``pipes`` (one per local GPU, each yielding ``samples_per_pipe`` samples
    per epoch), assembling global arrays with ``sharding`` when given. One pipeline ends its epoch by
    its sources' ``StopIteration``; several need the epoch's total ``size`` (DALI: "negative size is
    supported only for a single pipeline"), the sum over the pipelines."""
    from nvidia.dali.plugin.jax import DALIGenericIterator

    kwargs = dict(sharding=sharding) if sharding is not None else {}
    if len(pipes) > 1:
        kwargs["size"] = samples_per_pipe * len(pipes)
    return DALIGenericIterator(pipes, list(dp.OUTPUTS), auto_reset=True, **kwargs)


class DaliInput:
    """Batches of one split from DALI: ``steps`` per epoch, ``epoch(e)`` an iterator of global arrays."""

    def __init__(self, cfg: Config, split: str, mesh: Mesh, first_epoch: int = 0, first_step: int = 0):
        dp.require_dali()
        self.cfg, self.mesh = cfg, mesh
        path = cfg.data_file(split)
        size = dataset.validate(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size).size
        shards, replicas = distribute.local_shards(mesh), distribute.num_replicas(mesh)
        _, local_bs = batch_sizes(cfg, replicas)
        self.on_gpu = jax.default_backend() == "gpu"
        if self.on_gpu:  # one pipeline per local device = per shard
            groups = [([r], i) for i, r in enumerate(shards)]
        else:
            log.info("DALI %s/%s: no GPU, CPU-only pipelines (device_id=None)", cfg.data_loader_config, split)
            groups = [(shards, None)]
        kind = loader_kinds.loader_kind(cfg)
        host_volumes = dp.load_volumes(path, cfg) if kind.device_volumes else None
        pipes = []
        for group, device_id in groups:
            plans = dp.EpochPlans(cfg, SPLITS[split], group, replicas, size, first_epoch)
            sources = None
            if kind.device_volumes:
                sources = dp.device_crop_sources(plans, crop_fns(host_volumes, device_id, cfg.crop_size), cfg)
            elif kind.crops_outside_dali:
                sources = dp.crop_sources(plans, path, cfg)
            pipes.append(dp.build_pipeline(cfg, split, local_bs * len(group), device_id, plans, sources))
        self.steps = len(plans(0))
        sharding = distribute.batch_sharding(mesh) if self.on_gpu else None
        self.iterator = make_iterator(pipes, self.steps * local_bs * len(groups[0][0]), sharding)
        self.cursor = host_batches.EpochCursor(SPLITS[split], first_epoch, first_step)

    def epoch(self, epoch: int) -> Iterator[dict[str, jax.Array]]:
        """Batches of ``epoch``, the pipeline's next one (DALI counts epochs itself from ``first_epoch``);
        the first epoch of a run resumed mid-epoch is run whole and its first ``first_step`` batches
        dropped, so the pipelines' epochs keep one length."""
        skip = self.cursor.advance(epoch)
        for i, batch in enumerate(self.iterator):
            if i < skip:
                continue
            yield (
                batch
                if self.on_gpu
                else distribute.put_batch({k: jax.device_get(v) for k, v in batch.items()}, self.mesh)
            )
