"""The one crop sampler: where crops start and which symmetry each gets, for every reader.

A *sample* is a crop of ``crop_size``^3 voxels of input and target at the same place, plus one
symmetry of the cube. The draws of a *global* batch come from a NumPy generator seeded by the key
``(seed, split, epoch, step)`` (``numpy.random.SeedSequence``; ``step`` counts global steps from
the epoch's start), so a run is reproducible and every step draws from its own stream.

The global batch of step t is the same crops with the same symmetries whatever the number of
devices, processes and hosts, and whatever ``num_data_workers`` (as PyTorch's
``DistributedSampler`` gives): replica (data *shard*) ``r`` of ``R`` takes rows
``[r B, (r + 1) B)`` of it, ``B`` = global batch / ``R`` the local batch. A run on N devices is
then the same experiment as on one, and a run can resume on another world size. A process reads
only the crops of its own shards (drawing a global batch's few integers costs nothing).

Every loader (NumPy, the ``device`` gather, tf.data, DALI) reads these draws through
:func:`shared_data.data.host_batches.make_plan`. Validation uses ``split=1``, ``epoch=0`` (the same
crops every epoch) and no symmetry.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from shared_data.data.symmetry import num_symmetries

TRAIN, VAL = 0, 1
SPLITS = {"train": TRAIN, "val": VAL}  # split names (configs, readers) -> stream key


@dataclasses.dataclass(frozen=True)
class StreamKey:
    """Identifies the stream of one global step's draws. All fields are non-negative integers;
    ``step`` is the global step within ``epoch``."""

    seed: int
    epoch: int
    step: int = 0
    split: int = TRAIN

    def generator(self) -> np.random.Generator:
        """A fresh PCG64 generator for this key."""
        return np.random.default_rng(np.random.SeedSequence([self.seed, self.split, self.epoch, self.step]))


@dataclasses.dataclass(frozen=True)
class Draws:
    """A batch of draws: ``starts`` int64 (n, 3) voxel offsets (x, y, z); ``symmetries`` int64 (n,)."""

    starts: np.ndarray
    symmetries: np.ndarray

    def __len__(self) -> int:
        return len(self.symmetries)

    def rows(self, lo: int, hi: int) -> Draws:
        """Samples ``lo`` to ``hi - 1`` (a shard's slice of a global batch)."""
        return Draws(self.starts[lo:hi], self.symmetries[lo:hi])


class CropStream:
    """Sequential draws for one :class:`StreamKey` over a cubic volume of side ``volume_size``.

    Each call of :meth:`next_batch` consumes the generator, so the k-th batch of a stream is
    always the same for the same key, volume size, crop size and group.

    Raises:
        ValueError: ``crop_size`` exceeds ``volume_size``.
    """

    def __init__(self, key: StreamKey, volume_size: int, crop_size: int, symmetry_group: str):
        if crop_size > volume_size:
            raise ValueError(f"crop_size {crop_size} exceeds volume size {volume_size}")
        self.key = key
        self.max_start = volume_size - crop_size  # inclusive
        self.n_sym = num_symmetries(symmetry_group)
        self._rng = key.generator()

    def next_batch(self, n: int) -> Draws:
        """Draw ``n`` crop starts uniform in ``[0, volume_size - crop_size]`` per axis, then ``n`` symmetries."""
        starts = self._rng.integers(0, self.max_start + 1, size=(n, 3), dtype=np.int64)
        syms = self._rng.integers(0, self.n_sym, size=n, dtype=np.int64)
        return Draws(starts, syms)


def global_batch_draws(
    seed: int,
    epoch: int,
    step: int,
    global_batch: int,
    volume_size: int,
    crop_size: int,
    symmetry_group: str,
    split: int = TRAIN,
) -> Draws:
    """The ``global_batch`` draws of global step ``step`` of ``epoch`` (validation: epoch 0, no symmetry)."""
    group = symmetry_group if split == TRAIN else "none"
    ep = epoch if split == TRAIN else 0
    return CropStream(StreamKey(seed, ep, step, split), volume_size, crop_size, group).next_batch(global_batch)


def epoch_draws(
    seed: int,
    epoch: int,
    shard: int,
    num_shards: int,
    steps: int,
    global_batch: int,
    volume_size: int,
    crop_size: int,
    symmetry_group: str,
    split: int = TRAIN,
    first_step: int = 0,
) -> list[Draws]:
    """Shard ``shard``'s local batches of global steps ``first_step`` .. ``steps - 1`` of one epoch,
    in order: rows ``[shard B, (shard + 1) B)`` of each global batch, ``B = global_batch // num_shards``.

    This is the reference every loader reproduces; tests compare loaders against it.

    Raises:
        ValueError: ``global_batch`` does not divide over ``num_shards``, or ``shard`` is not below it.
    """
    if global_batch % num_shards or not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} of {num_shards}: global batch {global_batch} must divide over the shards")
    local = global_batch // num_shards
    return [
        global_batch_draws(seed, epoch, t, global_batch, volume_size, crop_size, symmetry_group, split).rows(
            shard * local, (shard + 1) * local
        )
        for t in range(first_step, steps)
    ]
