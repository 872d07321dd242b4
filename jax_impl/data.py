"""Input pipelines for JAX: native NumPy loaders (``synthetic``, ``inmem``, ``lowmem``) and DALI.

``make_input(cfg, split, mesh)`` returns an :class:`Input` whose ``epoch(e)`` iterates that epoch's
batches as global ``jax.Array``s sharded over the mesh's ``data`` axis, one batch prefetched to
the devices ahead of the step that consumes it.
"""
from __future__ import annotations

import collections
from typing import Iterator

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jax_impl import distribute
from shared_data import loader, readers
from shared_data.config import Config, batch_sizes
from shared_data.nvtx import nvtx_range
from shared_data.sampler import TRAIN, VAL

SPLITS = {"train": TRAIN, "val": VAL}


class Input:
    """Batches of one split for this process: ``steps`` per epoch, ``epoch(e)`` an iterator."""

    def __init__(self, cfg: Config, split: str, mesh: Mesh):
        self.cfg, self.split, self.mesh = cfg, SPLITS[split], mesh
        self.reader = readers.make_reader(cfg, split)
        self.shards = distribute.local_shards(mesh)
        self.replicas = distribute.num_replicas(mesh)
        self.steps = len(self.plan(0))

    def plan(self, epoch: int) -> loader.EpochPlan:
        return loader.make_plan(self.cfg, self.split, epoch, self.shards, self.replicas, self.reader.size)

    def epoch(self, epoch: int) -> Iterator[dict[str, jax.Array]]:
        host = iter(loader.NumpyLoader(self.reader, self.plan(epoch), self.cfg))
        return prefetch_to_mesh(host, self.mesh)


def prefetch_to_mesh(batches: Iterator[dict], mesh: Mesh, depth: int = 2) -> Iterator[dict[str, jax.Array]]:
    """Transfer host batches to the mesh ``depth`` batches ahead (device_put is asynchronous)."""
    queue: collections.deque = collections.deque()
    for batch in batches:
        with nvtx_range("h2d", "green"):
            queue.append(distribute.put_batch(batch, mesh))
        if len(queue) >= depth:
            yield queue.popleft()
    while queue:
        yield queue.popleft()


def make_input(cfg: Config, split: str, mesh: Mesh, first_epoch: int = 0):
    """The input pipeline of ``cfg.data_loader_config`` for ``split`` (``"train"`` / ``"val"``);
    ``first_epoch`` is where a resumed run starts (DALI pipelines count epochs from there)."""
    if cfg.data_loader_config.startswith("dali"):
        from jax_impl.dali import DaliInput
        return DaliInput(cfg, split, mesh, first_epoch)
    return Input(cfg, split, mesh)


def batch_spec(cfg: Config, mesh: Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes, dtypes and shardings of a global batch (what the steps are compiled for)."""
    global_bs, _ = batch_sizes(cfg, distribute.num_replicas(mesh))
    s, sharding = cfg.crop_size, distribute.batch_sharding(mesh)
    shapes = {"inputs": (global_bs, s, s, s, cfg.N_in_channels), "targets": (global_bs, s, s, s, cfg.N_out_channels),
              "mask": (global_bs,)}
    return {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=sharding) for k, v in shapes.items()}
