"""Input pipelines for JAX: the shared NumPy crop reader (``synthetic``, ``inmem``, ``lowmem``), the
device-resident ``device`` loader, and DALI (:mod:`jax_impl.dali`). The counterpart of :mod:`tf_impl.data`.

``make_input(cfg, split, mesh)`` returns an :class:`Input` whose ``epoch(e)`` iterates that epoch's
batches as global ``jax.Array``s sharded over the mesh's ``data`` axis, one batch prefetched to the
devices ahead of the step that consumes it. The crop and symmetry logic is the shared one
(:func:`shared_data.data.host_batches.NumpyLoader.load`; for ``lowmem`` in worker processes).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from shared_data.core import loader_kinds
from shared_data.core.config import Config, batch_sizes
from shared_data.data import crop_readers, host_batches
from shared_data.data.sampler import SPLITS
from shared_data.runtime.nvtx import nvtx_range

from jax_impl import distribute


class Input:
    """Batches of one split for this process: ``steps`` per epoch, ``epoch(e)`` an iterator of them.

    JAX: global arrays split over the mesh's devices."""

    def __init__(self, cfg: Config, split: str, mesh: Mesh, first_epoch: int = 0, first_step: int = 0):
        self.cfg, self.split, self.mesh = cfg, SPLITS[split], mesh
        self.cursor = host_batches.EpochCursor(self.split, first_epoch, first_step)
        self.reader = crop_readers.make_reader(cfg, split)
        self.workers = host_batches.crop_workers(self.reader, cfg)  # lowmem: processes, started at the first batch
        self.shards = distribute.local_shards(mesh)
        self.replicas = distribute.num_replicas(mesh)
        self.steps = len(self.plan(0))

    def close(self) -> None:
        """Stop the ``lowmem`` worker processes and free their shared memory (also done at exit)."""
        if self.workers is not None:
            self.workers.close()

    def plan(self, epoch: int, first_step: int = 0, shards: list[int] | None = None) -> host_batches.EpochPlan:
        """The crops of ``epoch`` from ``first_step`` on for ``shards`` (default: this process's)."""
        return host_batches.make_plan(
            self.cfg, self.split, epoch, shards or self.shards, self.replicas, self.reader.size, first_step
        )

    def dataset(self, epoch: int) -> Iterator[dict]:
        """The batches of ``epoch`` from its :meth:`EpochCursor.first_step` on, read by the shared loader.

        JAX: this process's part of each global batch (B_process, s, s, s, C), on the host."""
        plan = self.plan(epoch, self.cursor.first_step(epoch))
        return iter(host_batches.NumpyLoader(self.reader, plan, self.cfg, workers=self.workers))

    def epoch(self, epoch: int) -> Iterator[dict[str, jax.Array]]:
        """Batches of ``epoch``, on the devices. The loaders start at the first batch, so inside
        :func:`shared_data.runtime.steps.epoch_steps` (a stop signal during their start stops the run at the
        epoch's first step boundary).

        JAX: global arrays split over the mesh's devices, one batch put ahead."""
        yield from prefetch_to_mesh(self.dataset(epoch), self.mesh)


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


def make_input(cfg: Config, split: str, mesh: Mesh, first_epoch: int = 0, first_step: int = 0):
    """The input pipeline of ``cfg.data_loader_config`` for ``split`` (``"train"`` / ``"val"``);
    ``first_epoch`` and ``first_step`` are where a resumed run starts (the input protocol,
    :class:`shared_data.data.host_batches.EpochCursor`)."""
    kind = loader_kinds.loader_kind(cfg)
    if kind.dali:
        from jax_impl.dali import DaliInput

        return DaliInput(cfg, split, mesh, first_epoch, first_step)
    if kind.device_volumes:
        return DeviceInput(cfg, split, mesh, first_epoch, first_step)
    return Input(cfg, split, mesh, first_epoch, first_step)


def gather_batch(
    volume: jax.Array,
    starts: jax.Array,
    syms: jax.Array,
    mask: jax.Array,
    *,
    size: int,
    crop: int,
    n_in: int,
    perms: np.ndarray,
    signs: np.ndarray,
    src: np.ndarray,
    chan_sign: np.ndarray,
) -> dict:
    """Crop and transform a batch from a device-resident volume, inside one compiled function (the
    same result as :func:`tf_impl.data.gather_batch`, bit for bit).

    ``volume`` (L^3, C) float32, channels last, C = N_in + N_out; ``starts`` int32 (B, 3);
    ``syms`` int32 (B,). Output voxel y of a sample reads the volume at ``start + w`` with
    ``w[perm[i]] = y_i`` (or ``crop - 1 - y_i`` where ``sign[i] < 0``), the gather form of
    :func:`shared_data.data.symmetry.apply_spatial`; output channel d is ``chan_sign[g, d] *
    volume[..., src[g, d]]`` (:func:`shared_data.data.symmetry.gather_tables`), so the channel turn is
    folded into the same gather (one element per output value, values copied exactly), and inputs
    and targets are gathered separately, so each is written once.
    """
    perms, signs, src, sgn = (jnp.asarray(t) for t in (perms, signs, src, chan_sign))
    y = jnp.arange(crop, dtype=jnp.int32)
    shapes = [(crop, 1, 1), (1, crop, 1), (1, 1, crop)]

    def one(start, g):
        p, sg = perms[g], signs[g]
        yi = [jnp.where(sg[i] > 0, y, crop - 1 - y).reshape(shapes[i]) for i in range(3)]
        w = [sum(jnp.where(p[i] == j, yi[i], 0) for i in range(3)) for j in range(3)]
        row = (((start[0] + w[0]) * size + (start[1] + w[1])) * size + (start[2] + w[2]))[..., None]
        part = lambda lo, hi: volume[row, src[g, lo:hi]] * sgn[g, lo:hi]
        return part(0, n_in), part(n_in, src.shape[1])

    inputs, targets = jax.vmap(one)(starts, syms)
    return {"inputs": inputs, "targets": targets, "mask": mask}


class DeviceInput(Input):
    """The ``device`` loader: both volumes in device memory, each batch a crop plan that the step cuts
    from the volume (:func:`crops`, inside the compiled step, where XLA fuses the gather with what reads
    the crops), so the host sends crop starts and symmetry indices, not crops.

    JAX: the volume replicated over the mesh; each step's draws (a few hundred bytes) put on the devices."""

    def __init__(self, cfg: Config, split: str, mesh: Mesh, first_epoch: int = 0, first_step: int = 0):
        super().__init__(cfg, split, mesh, first_epoch, first_step)
        self.volume = distribute.put_replicated(host_batches.device_volume(self.reader), mesh)

    def spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes and dtypes of a batch as the steps compile for it: ``volume`` (L^3, C), ``draws``
        (B, 4), ``mask`` (B,).

        JAX: the global batch, with its shardings (the volume replicated; draws int32)."""
        global_bs, _ = batch_sizes(self.cfg, distribute.num_replicas(self.mesh))
        sharding = distribute.batch_sharding(self.mesh)
        return {
            "volume": jax.ShapeDtypeStruct(self.volume.shape, jnp.float32, sharding=self.volume.sharding),
            "draws": jax.ShapeDtypeStruct((global_bs, 4), jnp.int32, sharding=sharding),
            "mask": jax.ShapeDtypeStruct((global_bs,), jnp.float32, sharding=sharding),
        }

    def dataset(self, epoch: int) -> Iterator[dict]:
        """The batches of ``epoch`` from its :meth:`EpochCursor.first_step` on: the draws (crop start,
        symmetry index) and mask of this process's part of each step, on the host."""
        plan = self.plan(epoch, self.cursor.first_step(epoch))
        for draws, mask in zip(plan.draws, plan.masks):
            yield {"draws": np.concatenate([draws.starts, draws.symmetries[:, None]], 1).astype(np.int32), "mask": mask}

    def epoch(self, epoch: int) -> Iterator[dict[str, jax.Array]]:
        """Batches of ``epoch``: ``{"volume", "draws", "mask"}``, the draws and mask split on the batch
        axis, put on the devices one step ahead."""
        for batch in prefetch_to_mesh(self.dataset(epoch), self.mesh):
            yield {"volume": self.volume, **batch}


def crops(batch: dict, cfg: Config) -> dict:
    """The batch a step trains on: a ``device`` loader's batch (``volume`` (L^3, C), ``draws`` (B, 4):
    crop starts and symmetry index, ``mask`` (B,)) cut by :func:`gather_batch` into ``inputs`` (B, s,
    s, s, N_in), ``targets`` (B, s, s, s, N_out) and ``mask``; any other batch as it is. Called
    inside the jitted steps, so the gather compiles into the step with what reads the crops."""
    if "draws" not in batch:
        return batch
    volume, draws = batch["volume"], batch["draws"]
    static = host_batches.gather_statics(cfg, host_batches.volume_side(volume.shape[0]))
    return gather_batch(volume, draws[:, :3], draws[:, 3], batch["mask"], **static)


def input_spec(inp, cfg: Config, mesh: Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of a batch of the input ``inp`` as its steps compile for it."""
    return inp.spec() if isinstance(inp, DeviceInput) else batch_spec(cfg, mesh)


def batch_spec(cfg: Config, mesh: Mesh) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of a batch of crops as the steps compile for it.

    JAX: the global batch, with its shardings."""
    global_bs, _ = batch_sizes(cfg, distribute.num_replicas(mesh))
    s, sharding = cfg.crop_size, distribute.batch_sharding(mesh)
    shapes = {
        "inputs": (global_bs, s, s, s, cfg.N_in_channels),
        "targets": (global_bs, s, s, s, cfg.N_out_channels),
        "mask": (global_bs,),
    }
    return {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=sharding) for k, v in shapes.items()}
