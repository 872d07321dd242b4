"""The one crop sampler: where crops start and which symmetry each gets, for every reader.

A *sample* is a crop of ``crop_size``^3 voxels of input and target at the same place, plus one
symmetry of the cube. Draws come from a NumPy generator seeded by the key
``(seed, split, epoch, shard, worker)`` (``numpy.random.SeedSequence``), so a run is reproducible,
and shards (data-parallel replicas) and loader workers never share a stream.

How an epoch's batches map onto streams, the same for every loader (NumPy, tf.data, DALI):
shard ``s`` produces ``steps`` local batches; batch ``b`` is made by worker ``b % num_workers``
from that worker's stream, which yields its batches in order. Validation uses ``split=1``,
``epoch=0`` (the same crops every epoch) and no symmetry.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from shared_data.data.symmetry import num_symmetries

TRAIN, VAL = 0, 1
SPLITS = {"train": TRAIN, "val": VAL}  # split names (configs, readers) -> stream key


@dataclasses.dataclass(frozen=True)
class StreamKey:
    """Identifies one independent stream of draws. All fields are non-negative integers."""

    seed: int
    epoch: int
    shard: int = 0
    worker: int = 0
    split: int = TRAIN

    def generator(self) -> np.random.Generator:
        """A fresh PCG64 generator for this key."""
        return np.random.default_rng(
            np.random.SeedSequence([self.seed, self.split, self.epoch, self.shard, self.worker])
        )


@dataclasses.dataclass(frozen=True)
class Draws:
    """A batch of draws: ``starts`` int64 (n, 3) voxel offsets (x, y, z); ``symmetries`` int64 (n,)."""

    starts: np.ndarray
    symmetries: np.ndarray

    def __len__(self) -> int:
        return len(self.symmetries)


class CropStream:
    """Sequential draws for one :class:`StreamKey` over a cubic volume of side ``volume_size``.

    Each call of :meth:`next_batch` consumes the generator, so the k-th batch of a stream is
    always the same for the same key, volume size, crop size and group.
    """

    def __init__(self, key: StreamKey, volume_size: int, crop_size: int, symmetry_group: str):
        if crop_size > volume_size:
            raise ValueError(f"crop_size {crop_size} exceeds volume size {volume_size}")
        self.key = key
        self.max_start = volume_size - crop_size  # inclusive
        self.n_sym = num_symmetries(symmetry_group)
        self._rng = key.generator()

    def next_batch(self, n: int) -> Draws:
        """Draw ``n`` crop starts uniform in ``[0, volume_size - crop_size]`` per axis and symmetries."""
        starts = self._rng.integers(0, self.max_start + 1, size=(n, 3), dtype=np.int64)
        syms = self._rng.integers(0, self.n_sym, size=n, dtype=np.int64)
        return Draws(starts, syms)


def epoch_draws(
    seed: int,
    epoch: int,
    shard: int,
    num_workers: int,
    steps: int,
    batch: int,
    volume_size: int,
    crop_size: int,
    symmetry_group: str,
    split: int = TRAIN,
) -> list[Draws]:
    """All local batches of one shard's epoch, in order: batch ``b`` from worker ``b % num_workers``.

    This is the reference order every loader reproduces; tests compare loaders against it.
    """
    group = symmetry_group if split == TRAIN else "none"
    ep = epoch if split == TRAIN else 0
    streams = [
        CropStream(StreamKey(seed, ep, shard, w, split), volume_size, crop_size, group) for w in range(num_workers)
    ]
    return [streams[b % num_workers].next_batch(batch) for b in range(steps)]
