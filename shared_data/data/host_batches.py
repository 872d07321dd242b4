"""Epoch plans (which crops each step reads) and the native NumPy batch iterator both frameworks wrap.

A data-parallel run has ``num_replicas`` replicas; replica ``r`` is data *shard* ``r`` and reads rows
``[r B, (r + 1) B)`` of each global batch (:mod:`shared_data.data.sampler`; ``B`` the local batch).
A process loads the shards of its local devices and concatenates them in replica order, so the
global batch of step t is the same crops on 1 device, 2 devices in one process or 2 processes.

Every batch is a dict of NumPy arrays: ``inputs`` float32 (B, s, s, s, N_in), ``targets`` float32
(B, s, s, s, N_out), ``mask`` float32 (B,): 1 for real samples, 0 for the padding of the last
validation batch (``Nsamples_val`` need not divide by the batch).

The input protocol of both frameworks (``make_input(cfg, split, ..., first_epoch, first_step)``, an
object with ``steps`` and ``epoch(e)``) is :class:`EpochCursor`'s: training epochs are read in order
from ``first_epoch``, whose batches start at step ``first_step`` (a run resumed mid-epoch: the data
cursor of its checkpoint); every later epoch is read whole.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from shared_data.core import config as config_mod
from shared_data.core.config import Config
from shared_data.data import symmetry
from shared_data.data.crop_readers import H5LowMemReader, make_batch
from shared_data.data.crop_workers import CropWorkers
from shared_data.data.sampler import TRAIN, VAL, Draws, epoch_draws


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """The draws of each step of one epoch for one process, and the sample masks."""

    draws: list[Draws]
    masks: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.draws)


def _concat(parts: Sequence[Draws]) -> Draws:
    return Draws(np.concatenate([p.starts for p in parts]), np.concatenate([p.symmetries for p in parts]))


def make_plan(
    cfg: Config,
    split: int,
    epoch: int,
    shards: Sequence[int],
    num_replicas: int,
    volume_size: int,
    first_step: int = 0,
) -> EpochPlan:
    """Plan ``epoch`` of ``split`` (TRAIN or VAL) for the process holding replicas ``shards``, from
    global step ``first_step`` (TRAIN only; a run resumed mid-epoch) to the epoch's end.

    TRAIN: ``steps_per_epoch`` steps, symmetries from ``cfg.symmetry_group``. VAL: ``val_steps``
    steps over the same ``Nsamples_val`` crops each epoch, no symmetry, padding masked. Step t of
    shard r holds rows ``[r B, (r + 1) B)`` of global batch t (:func:`shared_data.data.sampler.epoch_draws`),
    whatever ``num_data_workers`` and however the replicas spread over processes.

    Raises:
        ValueError: ``first_step`` outside ``[0, steps)``, or given for VAL.
    """
    global_bs, local_bs = config_mod.batch_sizes(cfg, num_replicas)
    steps = config_mod.steps_per_epoch(cfg, num_replicas) if split == TRAIN else config_mod.val_steps(cfg, num_replicas)
    if not 0 <= first_step < steps or (first_step and split != TRAIN):
        raise ValueError(f"first_step {first_step}: a training epoch has steps 0 to {steps - 1}")
    per_shard = {
        r: epoch_draws(
            cfg.seed,
            epoch,
            r,
            num_replicas,
            steps,
            global_bs,
            volume_size,
            cfg.crop_size,
            cfg.symmetry_group,
            split,
            first_step,
        )
        for r in shards
    }
    draws, masks = [], []
    for i, s in enumerate(range(first_step, steps)):
        draws.append(_concat([per_shard[r][i] for r in shards]))
        if split == TRAIN:
            masks.append(np.ones(local_bs * len(shards), np.float32))
        else:
            index = np.concatenate([s * global_bs + r * local_bs + np.arange(local_bs) for r in shards])
            masks.append((index < cfg.Nsamples_val).astype(np.float32))
    return EpochPlan(draws, masks)


def synthetic_batch(cfg: Config, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A random batch of ``cfg``'s shapes (inputs and targets N(0, 0.1^2) float32, mask ones): the
    one cached batch of the benchmarks' SYNTHETIC mode (random, not zeros, so no kernel sees
    unrealistically uniform data)."""
    rng = np.random.default_rng(seed)
    s = cfg.crop_size
    return {
        "inputs": (0.1 * rng.standard_normal((batch_size, s, s, s, cfg.N_in_channels))).astype(np.float32),
        "targets": (0.1 * rng.standard_normal((batch_size, s, s, s, cfg.N_out_channels))).astype(np.float32),
        "mask": np.ones(batch_size, np.float32),
    }


class EpochCursor:
    """The input protocol: a training input is read epoch by epoch, in order, from ``first_epoch`` (a
    resumed run's first epoch), whose batches start at step ``first_step`` (the data cursor of a
    mid-epoch checkpoint); a validation input reads the same ``Nsamples_val`` crops whatever epoch
    is asked. DALI pipelines count epochs themselves, so an epoch read out of order would give
    another epoch's crops without a sign; :meth:`advance` refuses it instead."""

    def __init__(self, split: int, first_epoch: int = 0, first_step: int = 0):
        self.split, self.next = split, first_epoch
        self.resume_at = (first_epoch, first_step if split == TRAIN else 0)

    def first_step(self, epoch: int) -> int:
        """The step ``epoch``'s batches start at: ``first_step`` for ``first_epoch``, else 0."""
        return self.resume_at[1] if epoch == self.resume_at[0] else 0

    def advance(self, epoch: int) -> int:
        """Record that ``epoch`` is read now; return its :meth:`first_step`.

        Raises:
            ValueError: a training epoch other than the next one.
        """
        if self.split == VAL:
            return 0
        if epoch != self.next:
            raise ValueError(f"training epoch {epoch} asked for; the input reads epochs in order, next {self.next}")
        self.next += 1
        return self.first_step(epoch)


def forever(inp) -> Iterator:
    """Batches of epoch 0, 1, 2, ... of an input (anything with ``epoch(e)``) without end (benchmarks).
    Closing the generator closes the input where it has ``close()`` (``lowmem``'s worker processes
    stop then, not at the input's collection), as the PyTorch reference's loader does."""
    epoch = 0
    try:
        while True:
            yield from inp.epoch(epoch)
            epoch += 1
    finally:
        if hasattr(inp, "close"):
            inp.close()


class NumpyLoader:
    """Iterate a plan's batches in order, ``prefetch`` batches ahead.

    Each batch is read by one of ``num_workers`` threads of this process, or, where ``workers`` is
    given (``lowmem``), by one of its worker processes, which a thread hands the batch to and waits
    for (:class:`shared_data.data.crop_workers.CropWorkers`); then :attr:`in_flight` threads (the
    ``prefetch`` batches) keep a batch queued behind each process's, so a process never idles while
    its last batch travels back. ``inmem`` and ``synthetic`` crops are NumPy copies, which release the
    GIL, so threads overlap them with the training step; ``lowmem`` reads hold h5py's process-wide
    lock for their whole length, so only processes, each with its own file handle, read in parallel.
    Either way the batches equal :meth:`load`'s bit for bit.
    """

    def __init__(
        self,
        reader,
        plan: EpochPlan,
        cfg: Config,
        num_workers: int | None = None,
        prefetch: int | None = None,
        workers: CropWorkers | None = None,
    ):
        self.reader, self.plan, self.cfg, self.workers = reader, plan, cfg, workers
        self.num_workers = num_workers or cfg.num_data_workers
        self.prefetch = prefetch or self.num_workers + 1

    @property
    def in_flight(self) -> int:
        """Batches read at once: ``num_workers`` threads, or ``prefetch`` handed to ``workers``."""
        return self.prefetch if self.workers else self.num_workers

    def __len__(self) -> int:
        return len(self.plan)

    def load(self, step: int) -> dict[str, np.ndarray]:
        """The batch of ``step`` (synchronously; read by a worker process where ``workers`` is given).

        Raises:
            DatasetError: the crops cannot be read or hold bad values (naming the file).
            RuntimeError: a worker process died or hung (:meth:`CropWorkers.batch`).
        """
        draws = self.plan.draws[step]
        x, y = self.workers.batch(draws) if self.workers else make_batch(self.reader, draws, self.cfg)
        return {"inputs": x, "targets": y, "mask": self.plan.masks[step]}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """The batches in order; closed early (``close()``, or dropped), it cancels the reads not yet
        started and waits only for those under way."""
        with cf.ThreadPoolExecutor(self.in_flight, thread_name_prefix="crops") as pool:
            pending: collections.deque = collections.deque()
            try:
                for step in range(len(self.plan)):
                    pending.append(pool.submit(self.load, step))
                    if len(pending) >= self.prefetch:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()


def crop_workers(reader, cfg: Config) -> CropWorkers | None:
    """The worker processes a native loader of ``reader`` reads through: ``cfg.num_data_workers``
    processes (started at the first batch) for an h5py reader (``lowmem``), None (threads) for the
    in-memory and synthetic readers."""
    if isinstance(reader, H5LowMemReader):
        return CropWorkers(reader, cfg, cfg.num_data_workers)
    return None


def device_volume(reader) -> np.ndarray:
    """What both frameworks' ``device`` loaders put on the device: the volumes of ``reader`` (an
    in-memory reader) as one channels-last (L^3, N_in + N_out) float32 array; their ``gather_batch``
    cuts crops from it with the static arguments of :func:`gather_statics`."""
    nbody, hydro = reader.volumes()
    return np.concatenate([np.moveaxis(nbody, 0, -1), np.moveaxis(hydro, 0, -1)], axis=-1).reshape(reader.size**3, -1)


def gather_statics(cfg: Config, size: int) -> dict:
    """The static keyword arguments of both frameworks' ``gather_batch`` for a volume of side ``size``
    voxels: ``size``, ``crop``, ``n_in`` and the tables of :func:`shared_data.data.symmetry.gather_tables`
    (vector channels of the targets shifted by N_in)."""
    vectors = list(cfg.nbody_vector_channels) + [[c + cfg.N_in_channels for c in t] for t in cfg.hydro_vector_channels]
    perms, signs, src, chan_sign = symmetry.gather_tables(cfg.N_in_channels + cfg.N_out_channels, vectors)
    return dict(
        size=size, crop=cfg.crop_size, n_in=cfg.N_in_channels, perms=perms, signs=signs, src=src, chan_sign=chan_sign
    )


def volume_side(rows: int) -> int:
    """The side L of a cubic volume flattened to ``rows`` = L^3 rows (a ``device`` loader's volume).

    Raises:
        ValueError: ``rows`` is not a cube.
    """
    side = round(rows ** (1 / 3))
    if side**3 != rows:
        raise ValueError(f"a device volume of {rows} rows is not a flattened cube (L^3 rows)")
    return side
