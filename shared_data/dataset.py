"""The dataset contract: HDF5 volumes of the NERSC tutorial's layout, and their validation.

A dataset file holds two float32 datasets, channel-first, spatial axes 0, 1, 2 = x, y, z:

* ``Nbody`` (N_in, L, L, L): dark matter [density transform, vx, vy, vz] in our generator.
* ``Hydro`` (N_out, L, L, L): gas [density transform, temperature transform, vx, vy, vz].

This is the layout of the tutorial's ``downsamp_2048crop_train.h5`` / ``downsamp_1024crop_valid.h5``,
which load unchanged. Our generator adds attributes (channel names, transforms, units, box size,
cosmology, seed); files without them are accepted. The DHWC ``.npy`` form for DALI's numpy reader
is ``<stem>_Nbody.npy`` (L, L, L, N_in) and ``<stem>_Hydro.npy`` (L, L, L, N_out) beside the file.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from shared_data.errors import DatasetError

KEYS = ("Nbody", "Hydro")


@dataclasses.dataclass(frozen=True)
class VolumeInfo:
    """What :func:`validate` learned about a file: side ``size`` (voxels) and channel counts."""

    path: Path
    size: int
    n_in: int
    n_out: int
    chunks: tuple | None
    attrs: dict


def _h5py():
    import h5py  # imported here so that config-only tools start fast
    return h5py


def open_h5(path: str | Path):
    """Open ``path`` read-only with h5py.

    Raises:
        DatasetError: the file does not exist or is not an HDF5 file.
    """
    path = Path(path)
    if path.is_dir():
        raise DatasetError(f"dataset file {path} is a folder, expected an HDF5 file")
    if not path.is_file():
        raise DatasetError(f"dataset file {path} not found (generate one with: python -m shared_data.generate --help)")
    h5py = _h5py()
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise DatasetError(f"dataset file {path} is not a readable HDF5 file ({err})") from None


def validate(path: str | Path, n_in: int, n_out: int, crop_size: int = 1) -> VolumeInfo:
    """Check ``path`` against the contract (keys, ndim, channels, cubic, size >= crop, float dtype).

    Values are not scanned here (see :func:`check_finite`).

    Raises:
        DatasetError: naming the file, the key and what was expected.
    """
    path = Path(path)
    with open_h5(path) as f:
        shapes = {}
        for key, n in zip(KEYS, (n_in, n_out)):
            if key not in f:
                raise DatasetError(f"{path}: missing dataset {key!r} (expected {key} of shape ({n}, L, L, L); found keys: {sorted(f.keys())})")
            ds = f[key]
            if not hasattr(ds, "shape"):
                raise DatasetError(f"{path}: {key!r} is a group, expected a dataset of shape ({n}, L, L, L)")
            if ds.ndim != 4:
                raise DatasetError(f"{path}: {key!r} has shape {ds.shape}, expected 4 axes ({n}, L, L, L), channel-first")
            if ds.shape[0] != n:
                raise DatasetError(f"{path}: {key!r} has {ds.shape[0]} channels (shape {ds.shape}), expected {n}")
            if not np.issubdtype(ds.dtype, np.floating):
                raise DatasetError(f"{path}: {key!r} has dtype {ds.dtype}, expected float32")
            if len(set(ds.shape[1:])) != 1:
                raise DatasetError(f"{path}: {key!r} has spatial shape {ds.shape[1:]}, expected a cube (L, L, L)")
            shapes[key] = ds.shape[1:]
        if shapes["Nbody"] != shapes["Hydro"]:
            raise DatasetError(f"{path}: Nbody spatial shape {shapes['Nbody']} differs from Hydro {shapes['Hydro']}")
        size = shapes["Nbody"][0]
        if size < crop_size:
            raise DatasetError(f"{path}: volume side {size} is smaller than crop_size {crop_size}")
        attrs = {k: _plain(v) for k, v in f.attrs.items()}
        return VolumeInfo(path, size, n_in, n_out, f["Nbody"].chunks, attrs)


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def check_finite(array: np.ndarray, what: str) -> None:
    """Raise :class:`DatasetError` naming ``what`` if ``array`` holds NaN or inf."""
    if not np.isfinite(array).all():
        bad = np.argwhere(~np.isfinite(array))[0]
        raise DatasetError(f"{what}: non-finite value {array[tuple(bad)]} at index {tuple(int(i) for i in bad)}; expected finite floats")


def npy_paths(path: str | Path) -> tuple[Path, Path]:
    """The DHWC ``.npy`` files that :mod:`shared_data.convert` writes for HDF5 file ``path``."""
    path = Path(path)
    stem = path.with_suffix("")
    return Path(f"{stem}_Nbody.npy"), Path(f"{stem}_Hydro.npy")
