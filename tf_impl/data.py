"""Input pipelines for TensorFlow: the shared NumPy crop reader (``synthetic``, ``inmem``, ``lowmem``) in
``tf.data``, the device-resident ``device`` loader, and DALI (:mod:`tf_impl.dali`). The counterpart of
:mod:`jax_impl.data`.

``make_input(cfg, split, strategy)`` returns an :class:`Input` whose ``epoch(e)`` iterates that
epoch's batches, distributed over the strategy's replicas, each replica's ``tf.data`` pipeline
prefetching ahead of the step that consumes it. The crop and symmetry logic is the shared one
(:func:`shared_data.data.host_batches.NumpyLoader.load`, run in parallel by ``tf.data``'s map; for
``lowmem`` in worker processes).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from shared_data.core import loader_kinds
from shared_data.core.config import Config, batch_sizes
from shared_data.data import crop_readers, host_batches
from shared_data.data.sampler import SPLITS

from tf_impl import distribute


class Input:
    """Batches of one split for this process: ``steps`` per epoch, ``epoch(e)`` an iterator of them.

    TensorFlow: one ``tf.data`` pipeline per local replica, their batches distributed by the strategy."""

    def __init__(
        self, cfg: Config, split: str, strategy: tf.distribute.Strategy, first_epoch: int = 0, first_step: int = 0
    ):
        self.cfg, self.split, self.strategy = cfg, SPLITS[split], strategy
        self.cursor = host_batches.EpochCursor(self.split, first_epoch, first_step)
        self.reader = crop_readers.make_reader(cfg, split)
        self.workers = host_batches.crop_workers(self.reader, cfg)  # lowmem: processes, started at the first batch
        self.shards = distribute.local_shards(strategy)
        self.replicas = distribute.num_replicas(strategy)
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

    def dataset(self, epoch: int, shard: int) -> tf.data.Dataset:
        """The batches of ``epoch`` from its :meth:`EpochCursor.first_step` on, read by the shared loader.

        TensorFlow: replica ``shard``'s (B_local, s, s, s, C), read in parallel by ``tf.data``, prefetched."""
        plan = self.plan(epoch, self.cursor.first_step(epoch), [shard])
        source = host_batches.NumpyLoader(self.reader, plan, self.cfg, workers=self.workers)
        cfg, s = self.cfg, self.cfg.crop_size

        def load(step):
            b = source.load(int(step))
            return b["inputs"], b["targets"], b["mask"]

        def to_dict(x, y, m):
            return {
                "inputs": tf.ensure_shape(x, (None, s, s, s, cfg.N_in_channels)),
                "targets": tf.ensure_shape(y, (None, s, s, s, cfg.N_out_channels)),
                "mask": tf.ensure_shape(m, (None,)),
            }

        ds = tf.data.Dataset.range(len(source))
        ds = ds.map(
            lambda i: tf.numpy_function(load, [i], (tf.float32, tf.float32, tf.float32), stateful=False),
            num_parallel_calls=source.in_flight,
            deterministic=True,
        )
        return ds.map(to_dict).prefetch(tf.data.AUTOTUNE)

    def epoch(self, epoch: int) -> Iterator:
        """Batches of ``epoch``, on the devices. The loaders start at the first batch, so inside
        :func:`shared_data.runtime.steps.epoch_steps` (a stop signal during their start stops the run at the
        epoch's first step boundary).

        TensorFlow: plain dicts with one replica, per-replica values with several (replica ``r`` gets shard
        ``r``'s batch)."""
        iters = [iter(self.dataset(epoch, r)) for r in self.shards]
        yield from distribute.replica_batches(
            self.strategy, self.shards, iters, self.steps - self.cursor.first_step(epoch)
        )


def make_input(cfg: Config, split: str, strategy: tf.distribute.Strategy, first_epoch: int = 0, first_step: int = 0):
    """The input pipeline of ``cfg.data_loader_config`` for ``split`` (``"train"`` / ``"val"``);
    ``first_epoch`` and ``first_step`` are where a resumed run starts (the input protocol,
    :class:`shared_data.data.host_batches.EpochCursor`)."""
    kind = loader_kinds.loader_kind(cfg)
    if kind.dali:
        from tf_impl.dali import DaliDeviceInput, DaliInput

        if kind.device_volumes and tf.config.list_logical_devices("GPU"):
            return DaliDeviceInput(cfg, split, strategy, first_epoch, first_step)
        return DaliInput(cfg, split, strategy, first_epoch, first_step)
    if kind.device_volumes:
        return DeviceInput(cfg, split, strategy, first_epoch, first_step)
    return Input(cfg, split, strategy, first_epoch, first_step)


def gather_batch(
    volume: tf.Tensor,
    starts: tf.Tensor,
    syms: tf.Tensor,
    mask: tf.Tensor,
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
    same result as :func:`jax_impl.data.gather_batch`, bit for bit).

    ``volume`` (L^3, C) float32, channels last, C = N_in + N_out; ``starts`` int32 (B, 3);
    ``syms`` int32 (B,). Output voxel y of a sample reads the volume at ``start + w`` with
    ``w[perm[i]] = y_i`` (or ``crop - 1 - y_i`` where ``sign[i] < 0``), the gather form of
    :func:`shared_data.data.symmetry.apply_spatial`; output channel d is ``chan_sign[g, d] *
    volume[..., src[g, d]]`` (:func:`shared_data.data.symmetry.gather_tables`), so the channel turn is
    folded into the same gather (one element per output value, values copied exactly), and inputs
    and targets are gathered separately, so each is written once.
    """
    p, sg = tf.gather(perms, syms), tf.gather(signs, syms)  # (B, 3)
    y = tf.range(crop, dtype=tf.int32)[None]
    shapes = [(-1, crop, 1, 1), (-1, 1, crop, 1), (-1, 1, 1, crop)]
    yi = [tf.reshape(tf.where(sg[:, i : i + 1] > 0, y, crop - 1 - y), shapes[i]) for i in range(3)]
    w = [sum(tf.where(tf.reshape(p[:, i], (-1, 1, 1, 1)) == j, yi[i], 0) for i in range(3)) for j in range(3)]
    st = [tf.reshape(starts[:, i], (-1, 1, 1, 1)) for i in range(3)]
    row = ((st[0] + w[0]) * size + (st[1] + w[1])) * size + (st[2] + w[2])  # (B, s, s, s)
    row = tf.broadcast_to(row, tf.stack([tf.shape(starts)[0], crop, crop, crop]))[..., None]
    ch, ch_sign = tf.gather(src, syms), tf.gather(chan_sign, syms)  # (B, C)

    def part(lo, hi):
        cols = tf.broadcast_to(ch[:, None, None, None, lo:hi], tf.concat([tf.shape(row)[:4], [hi - lo]], 0))
        rows = tf.broadcast_to(row, tf.shape(cols))
        return tf.gather_nd(volume, tf.stack([rows, cols], -1)) * ch_sign[:, None, None, None, lo:hi]

    return {"inputs": part(0, n_in), "targets": part(n_in, src.shape[1]), "mask": mask}


class DeviceInput(Input):
    """The ``device`` loader: both volumes in device memory, each batch a crop plan that the step cuts
    from the volume (:func:`crops`, inside the compiled step, where XLA fuses the gather with what reads
    the crops), so the host sends crop starts and symmetry indices, not crops.

    TensorFlow: a volume on every replica's device; each replica's epoch of draws goes there once, at the
    epoch's start, as one float32 tensor (steps, B, 4) of crop starts and symmetry indices (exact: both
    are below 2^24) and one (steps, B) mask, sliced into per-step device tensors: a step takes no host
    input. A host tensor fed to a GPU function every step would make TensorFlow copy it while the
    previous step still runs, and the host would wait for the device each step."""

    def __init__(
        self, cfg: Config, split: str, strategy: tf.distribute.Strategy, first_epoch: int = 0, first_step: int = 0
    ):
        super().__init__(cfg, split, strategy, first_epoch, first_step)
        host = host_batches.device_volume(self.reader)
        self.devices = list(strategy.extended.worker_devices) if self.replicas > 1 else [distribute.default_device()]
        self.volumes = []
        for d in self.devices:
            with tf.device(d):
                self.volumes.append(tf.identity(tf.constant(host)))

    def spec(self) -> dict[str, tf.TensorSpec]:
        """Shapes and dtypes of a batch as the steps compile for it: ``volume`` (L^3, C), ``draws``
        (B, 4), ``mask`` (B,).

        TensorFlow: one replica's batch, all float32."""
        _, local_bs = batch_sizes(self.cfg, self.replicas)
        shapes = {"volume": self.volumes[0].shape, "draws": (local_bs, 4), "mask": (local_bs,)}
        return {k: tf.TensorSpec(v, tf.float32) for k, v in shapes.items()}

    def dataset(self, epoch: int, shard: int) -> Iterator[dict]:
        """One replica's batches of ``epoch`` (the :meth:`Input.epoch` contract: an iterable of
        elements), each ``{"volume", "draws", "mask"}`` on that replica's device."""
        plan, i = self.plan(epoch, self.cursor.first_step(epoch), [shard]), shard - self.shards[0]
        draws = np.stack([np.concatenate([d.starts, d.symmetries[:, None]], 1) for d in plan.draws]).astype(np.float32)
        with tf.device(self.devices[i]):
            steps = tf.unstack(tf.identity(tf.constant(draws)))
            masks = tf.unstack(tf.identity(tf.constant(np.stack(plan.masks).astype(np.float32))))
        for step_draws, mask in zip(steps, masks):
            yield {"volume": self.volumes[i], "draws": step_draws, "mask": mask}


def crops(batch: dict, cfg: Config) -> dict:
    """The batch a step trains on: a ``device`` loader's batch (``volume`` (L^3, C), ``draws`` (B, 4):
    crop starts and symmetry index, ``mask`` (B,)) cut by :func:`gather_batch` into ``inputs`` (B, s,
    s, s, N_in), ``targets`` (B, s, s, s, N_out) and ``mask``; any other batch as it is. Called
    inside the steps, so under XLA the gather compiles into the step with what reads the crops."""
    if "draws" not in batch:
        return batch
    volume, draws = batch["volume"], batch["draws"]
    static = host_batches.gather_statics(cfg, host_batches.volume_side(volume.shape[0]))
    return gather_batch(
        volume, tf.cast(draws[:, :3], tf.int32), tf.cast(draws[:, 3], tf.int32), batch["mask"], **static
    )


def input_spec(inp, cfg: Config, strategy: tf.distribute.Strategy) -> dict[str, tf.TensorSpec]:
    """Shapes and dtypes of a batch of the input ``inp`` as its steps compile for it."""
    return inp.spec() if isinstance(inp, DeviceInput) else batch_spec(cfg, strategy)


def batch_spec(cfg: Config, strategy: tf.distribute.Strategy) -> dict[str, tf.TensorSpec]:
    """Shapes and dtypes of a batch of crops as the steps compile for it.

    TensorFlow: one replica's batch."""
    _, local_bs = batch_sizes(cfg, distribute.num_replicas(strategy))
    s = cfg.crop_size
    shapes = {
        "inputs": (local_bs, s, s, s, cfg.N_in_channels),
        "targets": (local_bs, s, s, s, cfg.N_out_channels),
        "mask": (local_bs,),
    }
    return {k: tf.TensorSpec(v, tf.float32) for k, v in shapes.items()}
