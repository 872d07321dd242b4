"""Crop readers (``lowmem``, ``inmem``, ``synthetic``) and the NumPy sample assembly all loaders share.

A reader copies the channel-first crop at a start into preallocated buffers:
``read(start, out_in, out_tar)`` with ``out_in`` float32 (N_in, s, s, s) and ``out_tar`` float32
(N_out, s, s, s). :func:`make_sample` then applies the symmetry (vector channels included) and
returns channels-last DHWC arrays, the layout of the models.

* ``lowmem`` (the tutorial's): h5py ``read_direct`` of just the crop; the file is opened lazily,
  once per process (a forked child reopens it; a spawned child receives no handle when pickled).
  h5py holds a process-wide lock for the whole read, so threads sharing a handle read one crop at a
  time; the native loaders read it in worker processes (:mod:`shared_data.data.crop_workers`).
* ``inmem``: both volumes read into memory once (per process), crops are slices.
* ``synthetic``: a random volume of ``synthetic_volume_size`` made once per process from the seed;
  the same copy pattern with no file (the tutorial's ``RandomJunkDataset``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_data.core import loader_kinds
from shared_data.core.config import Config
from shared_data.core.errors import ConfigError
from shared_data.data import dataset, symmetry
from shared_data.data.sampler import Draws


class H5LowMemReader:
    """Reads crops straight from the HDF5 file with ``read_direct`` (no full-volume copy).

    Args:
        path: HDF5 file of the dataset contract.
        n_in, n_out: channel counts of ``Nbody`` and ``Hydro``.
        crop_size: side of a crop in voxels (checked against the volume).

    Raises:
        DatasetError: at construction if the file breaks the contract; at :meth:`read` if the crop
            holds NaN, inf or a value beyond :data:`shared_data.data.dataset.MAX_ABS_VALUE`.
    """

    def __init__(self, path: str | Path, n_in: int, n_out: int, crop_size: int):
        self.info = dataset.validate(path, n_in, n_out, crop_size)
        self.path, self.size, self.crop_size = Path(path), self.info.size, crop_size
        self._file, self._pid, self._lock = None, None, threading.Lock()

    def _handle(self):
        with self._lock:  # loader threads share one handle per process
            if self._file is None or self._pid != os.getpid():
                self._file, self._pid = dataset.open_h5(self.path), os.getpid()
            return self._file

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_file"], state["_pid"], state["_lock"] = None, None, None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def read(self, start: Sequence[int], out_in: np.ndarray, out_tar: np.ndarray) -> None:
        """Copy the crop at ``start`` (x, y, z) into ``out_in`` / ``out_tar`` (C, s, s, s) float32."""
        self.read_one("Nbody", start, out_in)
        self.read_one("Hydro", start, out_tar)

    def read_one(self, key: str, start: Sequence[int], out: np.ndarray) -> None:
        """Copy the crop of dataset ``key`` at ``start`` into ``out`` (C, s, s, s) float32 and check it."""
        x, y, z = (int(v) for v in start)
        s = self.crop_size
        with dataset.reading(self.path, f"the {key} crop at {(x, y, z)}"):
            self._handle()[key].read_direct(out, source_sel=np.s_[:, x : x + s, y : y + s, z : z + s])
        if dataset.first_bad(out) is not None:
            dataset.check_finite(out, f"{self.path} {key} crop at {(x, y, z)}")


class InMemReader:
    """Holds both volumes in memory (float32, channel-first) and slices crops from them.

    The volumes are read and checked for NaN/inf once per process; a spawned worker re-reads them.

    Raises:
        DatasetError: the file breaks the contract or holds NaN/inf.
    """

    def __init__(self, path: str | Path, n_in: int, n_out: int, crop_size: int):
        self.info = dataset.validate(path, n_in, n_out, crop_size)
        self.path, self.size, self.crop_size = Path(path), self.info.size, crop_size
        self._arrays = self._load()

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        arrays = []
        with dataset.open_h5(self.path) as f:
            for key in dataset.KEYS:
                ds = f[key]
                a = np.empty(ds.shape, np.float32)
                with dataset.reading(self.path, f"the {key} volume"):
                    ds.read_direct(a)
                dataset.check_finite(a, f"{self.path} {key}")
                checksum = dataset.ChannelChecksum(self.path, self.info.attrs, key)
                checksum.update(a)
                checksum.verify()
                arrays.append(a)
        return arrays[0], arrays[1]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_arrays"] = None
        return state

    def volumes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(Nbody, Hydro)`` arrays, loading them in this process if needed."""
        if self._arrays is None:
            self._arrays = self._load()
        return self._arrays

    def read(self, start: Sequence[int], out_in: np.ndarray, out_tar: np.ndarray) -> None:
        """Copy the crop at ``start`` (x, y, z) into ``out_in`` / ``out_tar`` (C, s, s, s) float32."""
        nbody, hydro = self.volumes()
        x, y, z = (int(v) for v in start)
        s = self.crop_size
        out_in[...] = nbody[:, x : x + s, y : y + s, z : z + s]
        out_tar[...] = hydro[:, x : x + s, y : y + s, z : z + s]


class SyntheticReader(InMemReader):
    """Random volumes (uniform in [-0.5, 0.5), float32) of side ``size``, made from ``seed`` per process."""

    def __init__(self, size: int, n_in: int, n_out: int, crop_size: int, seed: int):
        if size < crop_size:
            raise ConfigError(f"synthetic_volume_size {size} is smaller than crop_size {crop_size}")
        self.path, self.size, self.crop_size = Path("<synthetic>"), size, crop_size
        self.n_in, self.n_out, self.seed = n_in, n_out, seed
        self._arrays = None

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        shape = (self.size,) * 3
        make = lambda n: rng.random((n, *shape), dtype=np.float32) - np.float32(0.5)
        return make(self.n_in), make(self.n_out)


def make_reader(cfg: Config, split: str = "train"):
    """The host reader of ``cfg.data_loader_config`` (:attr:`shared_data.core.loader_kinds.LoaderKind.host_reader`)
    on ``split`` (``"train"`` or ``"val"``): :class:`SyntheticReader`, :class:`InMemReader` (``inmem``,
    ``device``, ``dali-device``) or :class:`H5LowMemReader` (``lowmem`` and the file-reading DALI
    loaders; ``dali-h5`` reads through it)."""
    n_in, n_out, s = cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size
    reader = loader_kinds.loader_kind(cfg).host_reader
    if reader == "synthetic":
        return SyntheticReader(cfg.synthetic_volume_size, n_in, n_out, s, cfg.seed + (split == "val"))
    path = cfg.data_file(split)
    if reader == "inmem":
        return InMemReader(path, n_in, n_out, s)
    return H5LowMemReader(path, n_in, n_out, s)


def make_sample(crop_in: np.ndarray, crop_tar: np.ndarray, sym: int, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """Apply symmetry ``sym`` to a channel-first crop pair; return contiguous DHWC float32 arrays."""
    x = symmetry.apply(crop_in, sym, cfg.nbody_vector_channels, channel_axis=0, out_channel_axis=-1)
    y = symmetry.apply(crop_tar, sym, cfg.hydro_vector_channels, channel_axis=0, out_channel_axis=-1)
    return x, y


def make_batch(
    reader, draws: Draws, cfg: Config, out: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read and transform every draw: returns ``(inputs, targets)``, float32 NDHWC
    (n, s, s, s, N_in) and (n, s, s, s, N_out), written into ``out`` (arrays of those shapes, e.g.
    a shared-memory slot of :mod:`shared_data.data.crop_workers`) where given, else new arrays."""
    s, n = cfg.crop_size, len(draws)
    if out is None:
        out = (
            np.empty((n, s, s, s, cfg.N_in_channels), np.float32),
            np.empty((n, s, s, s, cfg.N_out_channels), np.float32),
        )
    xs, ys = out
    buf_in = np.empty((cfg.N_in_channels, s, s, s), np.float32)
    buf_tar = np.empty((cfg.N_out_channels, s, s, s), np.float32)
    for i in range(n):
        reader.read(draws.starts[i], buf_in, buf_tar)
        xs[i], ys[i] = make_sample(buf_in, buf_tar, int(draws.symmetries[i]), cfg)
    return xs, ys
