"""The dataset contract: HDF5 volumes of the NERSC tutorial's layout, and their validation.

A dataset file holds two float32 datasets, channel-first, spatial axes 0, 1, 2 = x, y, z:

* ``Nbody`` (N_in, L, L, L): dark matter [density transform, vx, vy, vz] in our generator.
* ``Hydro`` (N_out, L, L, L): gas [density transform, temperature transform, vx, vy, vz].

This is the layout of the tutorial's ``downsamp_2048crop_train.h5`` / ``downsamp_1024crop_valid.h5``,
which load unchanged. Our generator adds attributes (channel names, transforms, units, box size,
cosmology, seed); files without them are accepted. The DHWC ``.npy`` twins for DALI's numpy reader
are ``<stem>_Nbody.npy`` (L, L, L, N_in) and ``<stem>_Hydro.npy`` (L, L, L, N_out) beside the file
(or the tutorial's ``*_data.npy`` / ``*_label.npy``, named by config keys); :func:`check_npy_twins`
checks that they hold the same values as their HDF5 file.

Every read of a file goes through :func:`reading`, so a damaged file (bad metadata, a damaged
compressed chunk) ends in a :class:`~shared_data.core.errors.DatasetError` naming the file, never in
h5py's traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from shared_data.core.commands import command_name
from shared_data.core.errors import DatasetError

KEYS = ("Nbody", "Hydro")
SAMPLE_VOXELS = 16  # voxels compared between an HDF5 file and its .npy twins


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
        generate = command_name("shared_data.data.generate")
        raise DatasetError(f"dataset file {path} not found (generate one with: {generate} --help)")
    h5py = _h5py()
    try:
        return h5py.File(path, "r")
    except (OSError, RuntimeError, ValueError) as err:
        raise DatasetError(f"dataset file {path} is not a readable HDF5 file ({_short(err)})") from None


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:200] + ("..." if len(text) > 200 else "")


@contextlib.contextmanager
def reading(path: str | Path, what: str) -> Iterator[None]:
    """Turn h5py's and NumPy's errors inside the body into a :class:`DatasetError` naming ``path``
    and ``what`` was being read: a damaged file reaches the user as one line."""
    try:
        yield
    except DatasetError:
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
        raise DatasetError(
            f"{path}: cannot read {what} ({_short(err)}); the file is damaged or not of the dataset contract"
        ) from None


def validate(path: str | Path, n_in: int, n_out: int, crop_size: int = 1) -> VolumeInfo:
    """Check ``path`` against the contract (keys, ndim, channels, cubic, size >= crop, float32).

    Values are not scanned here (see :func:`scan_values`). The result is cached per file version
    (path, size and modification time), so the loaders of one run check a file once.

    Raises:
        DatasetError: naming the file, the key and what was expected.
    """
    path = Path(path).absolute()
    try:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, n_in, n_out)
    except OSError:
        key = None
    if key is not None and key in _VALIDATED:
        info = _VALIDATED[key]
    else:
        with reading(path, "the dataset layout"):
            info = _validate(path, n_in, n_out)
        if key is not None:
            _VALIDATED[key] = info
    if info.size < crop_size:
        raise DatasetError(f"{path}: volume side {info.size} is smaller than crop_size {crop_size}")
    return info


_VALIDATED: dict[tuple, VolumeInfo] = {}


def _validate(path: Path, n_in: int, n_out: int) -> VolumeInfo:
    with open_h5(path) as f:
        shapes = {}
        for key, n in zip(KEYS, (n_in, n_out)):
            if key not in f:
                raise DatasetError(
                    f"{path}: missing dataset {key!r} (expected {key} of shape ({n}, L, L, L); "
                    f"found keys: {sorted(f.keys())})"
                )
            ds = f[key]
            if not hasattr(ds, "shape"):
                raise DatasetError(f"{path}: {key!r} is a group, expected a dataset of shape ({n}, L, L, L)")
            if ds.ndim != 4:
                raise DatasetError(
                    f"{path}: {key!r} has shape {ds.shape}, expected 4 axes ({n}, L, L, L), channel-first"
                )
            if ds.shape[0] != n:
                raise DatasetError(f"{path}: {key!r} has {ds.shape[0]} channels (shape {ds.shape}), expected {n}")
            if ds.dtype != np.float32:
                raise DatasetError(
                    f"{path}: {key!r} has dtype {ds.dtype}, expected float32 (the dataset "
                    f"contract; convert the file, e.g. with h5py: f[key][...].astype('float32'))"
                )
            if len(set(ds.shape[1:])) != 1:
                raise DatasetError(f"{path}: {key!r} has spatial shape {ds.shape[1:]}, expected a cube (L, L, L)")
            shapes[key] = ds.shape[1:]
        if shapes["Nbody"] != shapes["Hydro"]:
            raise DatasetError(f"{path}: Nbody spatial shape {shapes['Nbody']} differs from Hydro {shapes['Hydro']}")
        size = shapes["Nbody"][0]
        attrs = plain_attrs(f.attrs)
        return VolumeInfo(path, size, n_in, n_out, f["Nbody"].chunks, attrs)


def plain_attrs(attrs) -> dict:
    """An HDF5 attribute set as plain Python values (bytes -> str, arrays -> lists, NumPy scalars ->
    Python numbers), for JSON and comparisons."""
    return {k: _plain(v) for k, v in attrs.items()}


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


#: The largest magnitude a dataset value may have: float16's largest finite value. The contract's
#: transforms keep values of order 1 (targets inside tanh's (-1, 1)); a value beyond this turns into
#: inf in float16 compute and, near float32's limit (3.4e38), in the float32 network or loss too.
MAX_ABS_VALUE = 65504.0
EXPECTED_VALUES = (
    f"expected finite floats within +-{MAX_ABS_VALUE:g} (the dataset contract's transforms keep values of order 1)"
)


#: The largest magnitude a target (``Hydro``) value may have: the model's output is tanh's, inside
#: (-1, 1), and the readers' crops and symmetries keep each value's magnitude (a flip negates it), so a
#: target beyond it is one the network cannot fit: the loss stays at the excess, whatever the training.
TARGET_LIMIT = 1.0
OUTSIDE_OUTPUT = (
    "outside [-1, 1], the range of the model's output (tanh), so the network cannot fit it; the "
    "dataset contract's transforms keep targets inside it (the generator writes them so)"
)


#: The largest magnitude an input (``Nbody``) value may have: the contract's transforms keep inputs of order 1
#: (the generator's within +-0.5); an input a hundred times that (a file written without the transforms)
#: trains to a model that never sees data of its kind, and the run would end rc 0 without a word.
INPUT_LIMIT = 100.0
FAR_OUTSIDE_INPUTS = (
    f"beyond +-{INPUT_LIMIT:g}, far outside the dataset contract's transformed inputs (values of order 1): "
    "was the file written without the transforms?"
)


#: Each dataset's bound on a finite value's magnitude and what a value beyond it means.
LIMITS = {"Nbody": (INPUT_LIMIT, FAR_OUTSIDE_INPUTS), "Hydro": (TARGET_LIMIT, OUTSIDE_OUTPUT)}


def limit_problem(where: str, key: str, channel: int, voxel: tuple[int, int, int], value: float) -> str:
    """The line of a finite ``value`` of dataset ``key`` beyond its bound in :data:`LIMITS` (the inputs'
    :data:`INPUT_LIMIT`, the targets' :data:`TARGET_LIMIT`) at ``voxel`` of ``channel``."""
    x, y, z = voxel
    return f"{where}: {key} channel {channel} holds {value:.6g} at voxel ({x}, {y}, {z}), {LIMITS[key][1]}"


def value_problem(value: float, limit: float = MAX_ABS_VALUE) -> str:
    """How one value breaks the bound: ``non-finite value nan`` or ``value 3e+38 ... beyond +-65504``."""
    if not np.isfinite(value):
        return f"non-finite value {value}"
    return f"value {value:.6g} beyond +-{limit:g}"


def first_bad(array: np.ndarray, limit: float = MAX_ABS_VALUE) -> tuple[int, ...] | None:
    """The index of the first value of ``array`` that is NaN, inf or beyond ``+-limit``; None if all
    are fine. Two reductions (min, max: NaN propagates) decide; only a bad array is searched."""
    if array.size == 0 or (array.min() >= -limit and array.max() <= limit):
        return None
    bad = np.argwhere(~(np.abs(array) <= limit))
    return tuple(int(i) for i in bad[0])


def check_finite(array: np.ndarray, what: str) -> None:
    """Raise :class:`DatasetError` naming ``what`` if ``array`` holds NaN, inf or a value beyond
    :data:`MAX_ABS_VALUE`."""
    bad = first_bad(array)
    if bad is not None:
        raise DatasetError(f"{what}: {value_problem(array[bad])} at index {bad}; {EXPECTED_VALUES}")


def scan_values(path: str | Path, slab_bytes: int = 1 << 27) -> None:
    """Scan both datasets of HDF5 file ``path`` for NaN, inf and values beyond :data:`MAX_ABS_VALUE`,
    the targets (``Hydro``) for values beyond :data:`TARGET_LIMIT` and the inputs (``Nbody``) beyond
    :data:`INPUT_LIMIT`, a slab of x planes (128 MiB)
    at a time, before a run reads it: a value near float32's limit (3e38) is finite, passes the
    readers' checks and makes the loss inf steps later; a target of 30 trains to a loss of 30. Cost:
    one read of the file (0.23 s for a 256^3 volume, 604 MB, from the page cache on one core).

    Raises:
        DatasetError: the first bad value, with its dataset, channel and voxel (x, y, z).
    """
    with open_h5(path) as f:
        for key in KEYS:
            ds = f[key]
            step = max(1, slab_bytes // max(ds.shape[0] * int(np.prod(ds.shape[2:])) * 4, 1))
            for x0 in range(0, ds.shape[1], step):
                with reading(path, f"{key} values (x from {x0})"):
                    slab = ds[:, x0 : x0 + step]
                bad = first_bad(slab)
                if bad is not None:
                    c, x, y, z = bad
                    raise DatasetError(
                        f"{path}: {key} channel {c} holds a {value_problem(slab[bad])} at voxel "
                        f"({x0 + x}, {y}, {z}); {EXPECTED_VALUES}"
                    )
                bad = first_bad(slab, LIMITS[key][0])
                if bad is not None:
                    c, x, y, z = bad
                    raise DatasetError(limit_problem(str(path), key, c, (x0 + x, y, z), float(slab[bad])))


def _compare_twin(h5, arr: np.ndarray, npy: Path, path: Path, key: str, fix: str, slab_bytes: int = 1 << 27) -> None:
    """Compare an HDF5 dataset (C, L, L, L) with its DHWC twin, a slab of x planes at a time."""
    step = max(1, slab_bytes // max(arr[0].nbytes, 1))
    for x0 in range(0, arr.shape[0], step):
        want = h5[:, x0 : x0 + step]
        have = np.moveaxis(np.asarray(arr[x0 : x0 + step]), -1, 0)
        if not np.array_equal(want, have, equal_nan=True):
            c, x, y, z = (int(i) for i in np.argwhere(~((want == have) | (np.isnan(want) & np.isnan(have))))[0])
            raise DatasetError(
                f"{npy} does not match {path}: {key} channel {c} at voxel ({x0 + x}, {y}, {z}) is "
                f"{want[c, x, y, z]} in the HDF5 file and {have[c, x, y, z]} in the .npy; {fix}"
            )


def check_finite_npy(npy: Path, slab_bytes: int = 1 << 27, targets: bool = False) -> None:
    """Scan a DHWC ``.npy`` twin for NaN, inf and values beyond :data:`MAX_ABS_VALUE`, and beyond
    :data:`INPUT_LIMIT` (the ``Nbody`` twin) or, with ``targets`` (the ``Hydro`` twin), beyond
    :data:`TARGET_LIMIT`, a slab of x planes at a time (memory-mapped): DALI's numpy reader puts its
    values on the device unchecked, so a bad value is caught here or not at all.

    Raises:
        DatasetError: the first bad value, with its voxel (x, y, z) and channel.
    """
    arr = np.load(npy, mmap_mode="r")
    step = max(1, slab_bytes // max(arr[0].nbytes, 1))
    for x0 in range(0, arr.shape[0], step):
        slab = np.asarray(arr[x0 : x0 + step])
        bad = first_bad(slab)
        if bad is not None:
            x, y, z, c = bad
            raise DatasetError(
                f"{npy}: {value_problem(slab[bad])} at voxel ({x0 + x}, {y}, {z}) channel {c}; "
                f"{EXPECTED_VALUES} (DALI's numpy reader reads this file)"
            )
        key = "Hydro" if targets else "Nbody"
        bad = first_bad(slab, LIMITS[key][0])
        if bad is not None:
            x, y, z, c = bad
            where = f"{npy} (DALI's numpy reader reads it)"
            raise DatasetError(limit_problem(where, key, c, (x0 + x, y, z), float(slab[bad])))


def json_attr(attrs: dict, key: str, path: str | Path) -> object | None:
    """The attribute ``key`` of a file, parsed as JSON when it is a string (None when absent).

    Raises:
        DatasetError: the attribute is a string that is not valid JSON.
    """
    value = attrs.get(key)
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise DatasetError(f"{path}: attribute {key!r} = {value[:80]!r} is not valid JSON") from None


def npy_paths(path: str | Path) -> tuple[Path, Path]:
    """The DHWC ``.npy`` files that :mod:`shared_data.data.convert` writes for HDF5 file ``path``."""
    path = Path(path)
    stem = path.with_suffix("")
    return Path(f"{stem}_Nbody.npy"), Path(f"{stem}_Hydro.npy")


def source_record(npy: Path) -> Path:
    """The file beside a ``.npy`` twin that records what it was made from (written by the converter)."""
    return npy.with_name(npy.name + ".source.json")


def sample_voxels(size: int, n: int = SAMPLE_VOXELS) -> np.ndarray:
    """``n`` voxel indices (n, 3) spread over a volume of side ``size``, the same every time."""
    return np.random.default_rng(size).integers(0, size, size=(n, 3))


def check_npy_twins(info: VolumeInfo, npys: tuple[Path, Path]) -> None:
    """Check that the DHWC ``.npy`` twins of ``info``'s HDF5 file exist, have its shape as (L, L, L, C)
    float32, C order, and hold its values, so DALI's numpy reader trains on the same data as the
    HDF5 loaders: the values at :data:`SAMPLE_VOXELS` voxels must equal the HDF5 file's, a twin
    that records its conversion (:func:`write_source_record`) must still have the recorded CRC-32
    (read in full each time), and one without that record must equal the HDF5 file at every voxel.

    Raises:
        DatasetError: a twin is missing (the message names the converter), unreadable, of another
            shape, dtype or layout, holds other values (a regenerated or other volume), or was
            changed after its conversion.
    """
    fix = f"re-create it with: {command_name('shared_data.data.convert')} {info.path}"
    for key, npy, n in zip(KEYS, npys, (info.n_in, info.n_out)):
        if not npy.is_file():
            raise DatasetError(
                f"{npy} not found: the DALI numpy reader reads the DHWC .npy twin of {info.path}; "
                f"create it with: {command_name('shared_data.data.convert')} {info.path}"
            )
        try:
            arr = np.load(npy, mmap_mode="r")
        except (ValueError, OSError, EOFError) as err:
            raise DatasetError(f"{npy} is not a readable .npy file ({_short(err)}); {fix}") from None
        want = (info.size,) * 3 + (n,)
        if arr.shape != want or arr.dtype != np.float32 or not arr.flags.c_contiguous:
            layout = "Fortran order" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C order"
            raise DatasetError(
                f"{npy} has shape {arr.shape} {arr.dtype} in {layout}, expected {want} float32 in "
                f"C order (channels last, the DHWC twin of {info.path}); {fix}"
            )
        record = _read_record(npy)
        with open_h5(info.path) as f, reading(info.path, f"{key} values"):
            for x, y, z in sample_voxels(info.size):
                h5 = f[key][:, x, y, z]
                if not np.array_equal(h5, arr[x, y, z], equal_nan=True):
                    made_from = f" (it records being made from {record['source']})" if record.get("source") else ""
                    raise DatasetError(
                        f"{npy} does not match {info.path}{made_from}: {key} at voxel ({x}, {y}, {z}) "
                        f"is {h5.tolist()} in the HDF5 file and {arr[x, y, z].tolist()} in the .npy; "
                        f"{fix}"
                    )
            if record.get("crc32") is None:  # no record of what it was made from: compare every voxel
                _compare_twin(f[key], arr, npy, info.path, key, fix)
        # every byte, every time: a twin edited in place keeps its size, and its time can be set back
        if record.get("crc32") is not None and file_crc32(npy) != record["crc32"]:
            raise DatasetError(
                f"{npy} changed after it was converted from {info.path} (its CRC-32 differs from "
                f"the one recorded in {source_record(npy).name}); {fix}"
            )


def channel_crc32(volume: np.ndarray, start: list[int] | None = None) -> list[int]:
    """CRC-32 (zlib) of each channel's float32 values in C order: ``volume`` (C, ...); with ``start``
    (one running CRC per channel), continued from those, so slabs read in order give the whole
    channel's CRC."""
    import zlib

    start = start or [0] * volume.shape[0]
    return [zlib.crc32(np.ascontiguousarray(volume[c], np.float32).tobytes(), start[c]) for c in range(len(start))]


class ChannelChecksum:
    """Checks the per-channel CRC-32 that file ``path`` records in its attributes ``attrs``
    (``<key>_crc32``) against values read in order, slab by slab along the first spatial axis (or
    whole): :meth:`update` with each (C, n, L, L) float32 slab, then :meth:`verify`. Files without
    the attribute (the tutorial's) are not checked.

    Raises:
        DatasetError: the attribute is not JSON (at construction).
    """

    def __init__(self, path: Path, attrs, key: str):
        self.path, self.key = path, key
        recorded = json_attr(attrs, f"{key}_crc32", path)
        self.recorded = list(recorded) if isinstance(recorded, list) else None
        self.crc = [0] * len(self.recorded or [])

    def update(self, slab: np.ndarray) -> None:
        n = min(len(self.crc), slab.shape[0])
        if self.recorded is not None and n:
            self.crc[:n] = channel_crc32(slab[:n], self.crc[:n])

    def verify(self) -> None:
        """Raises: DatasetError: a channel's values differ from what was written."""
        if self.recorded is None:
            return
        for c, (got, want) in enumerate(zip(self.crc, self.recorded)):
            if got != want:
                raise DatasetError(
                    f"{self.path}: {self.key} channel {c} does not match its recorded CRC-32 (the file "
                    f"was damaged or changed after it was written); regenerate or restore it"
                )


def file_crc32(path: Path, block: int = 1 << 24) -> int:
    """CRC-32 (zlib) of a file's bytes, read in 16 MiB blocks."""
    import zlib

    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            crc = zlib.crc32(chunk, crc)
    return crc


def _read_record(npy: Path) -> dict:
    path = source_record(npy)
    try:
        record = json.loads(path.read_text()) if path.is_file() else {}
    except (ValueError, OSError):
        record = {}
    return record if isinstance(record, dict) else {}


def write_source_record(npy: Path, source: Path) -> None:
    """Record beside ``npy`` which HDF5 file (path, size, modification time) it was made from, and
    the ``.npy`` file's own size, modification time and CRC-32."""
    from shared_data.core.files import write_atomic

    src, st = source.stat(), npy.stat()
    record = {
        "source": str(source.absolute()),
        "source_bytes": src.st_size,
        "source_mtime_ns": src.st_mtime_ns,
        "bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "crc32": file_crc32(npy),
    }
    write_atomic(source_record(npy), json.dumps(record))
