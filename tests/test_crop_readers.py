"""Crop readers: crops equal slices; lowmem == inmem; fork/spawn safety; bad files give clear errors."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import subprocess
import sys

import h5py
import numpy as np
import pytest

from shared_data.core import config as config_mod
from shared_data.core.config import REPO_ROOT
from shared_data.core.errors import DatasetError
from shared_data.data import crop_readers, symmetry
from shared_data.data.sampler import CropStream, StreamKey


def _slices(path, start, s):
    with h5py.File(path) as f:
        x, y, z = start
        return f["Nbody"][:, x : x + s, y : y + s, z : z + s], f["Hydro"][:, x : x + s, y : y + s, z : z + s]


@pytest.mark.parametrize("kind", ["lowmem", "inmem"])
def test_crop_equals_numpy_slice_at_every_corner(tiny_cfg, kind):
    path = tiny_cfg.data_file("train")
    cls = crop_readers.H5LowMemReader if kind == "lowmem" else crop_readers.InMemReader
    r = cls(path, 4, 5, 16)
    bi, bt = np.empty((4, 16, 16, 16), np.float32), np.empty((5, 16, 16, 16), np.float32)
    for start in [(0, 0, 0), (16, 16, 16), (0, 16, 3), (7, 1, 16)]:
        r.read(start, bi, bt)
        want_i, want_t = _slices(path, start, 16)
        np.testing.assert_array_equal(bi, want_i)
        np.testing.assert_array_equal(bt, want_t)


def test_make_batch_applies_symmetry_to_the_sliced_crop(tiny_cfg):
    path = tiny_cfg.data_file("train")
    draws = CropStream(StreamKey(0, 0), 32, 16, "cube48").next_batch(6)
    x, y = crop_readers.make_batch(crop_readers.H5LowMemReader(path, 4, 5, 16), draws, tiny_cfg)
    assert x.shape == (6, 16, 16, 16, 4) and y.shape == (6, 16, 16, 16, 5) and x.dtype == np.float32
    for i in range(6):
        ci, ct = _slices(path, draws.starts[i], 16)
        g = int(draws.symmetries[i])
        np.testing.assert_array_equal(x[i], symmetry.apply(ci, g, [[1, 2, 3]], channel_axis=0).transpose(1, 2, 3, 0))
        np.testing.assert_array_equal(y[i], symmetry.apply(ct, g, [[2, 3, 4]], channel_axis=0).transpose(1, 2, 3, 0))


def test_synthetic_reader_is_deterministic_and_in_range():
    a = crop_readers.SyntheticReader(24, 4, 5, 8, seed=3)
    b = crop_readers.SyntheticReader(24, 4, 5, 8, seed=3)
    ia, ta = np.empty((4, 8, 8, 8), np.float32), np.empty((5, 8, 8, 8), np.float32)
    ib, tb = ia.copy(), ta.copy()
    a.read((1, 2, 3), ia, ta)
    b.read((1, 2, 3), ib, tb)
    np.testing.assert_array_equal(ia, ib)
    assert ta.min() >= -0.5 and ta.max() < 0.5 and ta.std() > 0.2


def _read_in_child(reader, q):
    bi, bt = np.empty((4, 16, 16, 16), np.float32), np.empty((5, 16, 16, 16), np.float32)
    reader.read((3, 4, 5), bi, bt)
    q.put((float(bi.sum()), float(bt.sum()), reader._file is not None))


def _check_worker(path, method):
    """Open the file in this process, then read the same crop in a ``method`` child process."""
    r = crop_readers.H5LowMemReader(path, 4, 5, 16)
    bi, bt = np.empty((4, 16, 16, 16), np.float32), np.empty((5, 16, 16, 16), np.float32)
    r.read((3, 4, 5), bi, bt)  # the parent holds an open handle now
    assert pickle.loads(pickle.dumps(r))._file is None  # what a spawned worker receives
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_read_in_child, args=(r, q))
    p.start()
    s_in, s_tar, opened = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0 and opened
    assert s_in == pytest.approx(float(bi.sum())) and s_tar == pytest.approx(float(bt.sum()))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_lowmem_reader_is_safe_in_fork_and_spawn_workers(tiny_cfg, method):
    """Run in a fresh interpreter that has imported neither JAX nor TF: forking a process that holds
    their threads can deadlock regardless of our reader."""
    code = (
        "import sys; sys.path.insert(0, 'tests'); import test_crop_readers as tests\n"
        "tests._check_worker(sys.argv[1], sys.argv[2])"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(tiny_cfg.data_file("train")), method],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]


# --- bad input ----------------------------------------------------------------------------------


def _h5(path, nbody=(4, 16, 16, 16), hydro=(5, 16, 16, 16), dtype=np.float32, fill=0.1, skip=()):
    with h5py.File(path, "w") as f:
        for key, shape in (("Nbody", nbody), ("Hydro", hydro)):
            if key not in skip:
                f.create_dataset(key, data=np.full(shape, fill, dtype))
    return path


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p, r"dataset file .*absent\.h5 not found"),
        (lambda p: (p.write_text("not hdf5"), p)[1], r"is not a readable HDF5 file"),
        (lambda p: _h5(p, skip=("Hydro",)), r"missing dataset 'Hydro' \(expected Hydro of shape \(5, L, L, L\)"),
        (lambda p: _h5(p, nbody=(3, 16, 16, 16)), r"'Nbody' has 3 channels .*expected 4"),
        (lambda p: _h5(p, hydro=(5, 16, 16, 8)), r"'Hydro' has spatial shape \(16, 16, 8\), expected a cube"),
        (lambda p: _h5(p, nbody=(4, 8, 8, 8), hydro=(5, 8, 8, 8)), r"volume side 8 is smaller than crop_size 16"),
        (lambda p: _h5(p, dtype=np.int32, fill=1), r"'Nbody' has dtype int32, expected float32"),
        (lambda p: _h5(p, nbody=(4, 16, 16)), r"'Nbody' has shape \(4, 16, 16\), expected 4 axes"),
    ],
)
def test_bad_files_give_one_clear_error(tmp_path, make, message):
    path = make(tmp_path / "absent.h5")
    for cls in (crop_readers.H5LowMemReader, crop_readers.InMemReader):
        with pytest.raises(DatasetError, match=message):
            cls(path, 4, 5, 16)


def test_nan_is_found_at_load_and_at_read(tmp_path):
    path = _h5(tmp_path / "nan.h5")
    with h5py.File(path, "a") as f:
        f["Hydro"][2, 3, 4, 5] = np.nan
    with pytest.raises(DatasetError, match=r"nan\.h5 Hydro: non-finite value nan at index \(2, 3, 4, 5\)"):
        crop_readers.InMemReader(path, 4, 5, 8)
    r = crop_readers.H5LowMemReader(path, 4, 5, 8)
    bi, bt = np.empty((4, 8, 8, 8), np.float32), np.empty((5, 8, 8, 8), np.float32)
    r.read((8, 8, 8), bi, bt)  # a clean crop reads fine
    with pytest.raises(DatasetError, match=r"Hydro crop at \(0, 0, 0\): non-finite value nan"):
        r.read((0, 0, 0), bi, bt)


def test_make_reader_follows_config(tiny_cfg):
    assert isinstance(crop_readers.make_reader(tiny_cfg), crop_readers.H5LowMemReader)
    assert isinstance(
        crop_readers.make_reader(config_mod.replace(tiny_cfg, data_loader_config="inmem"), "val"),
        crop_readers.InMemReader,
    )
    syn = crop_readers.make_reader(config_mod.replace(tiny_cfg, data_loader_config="synthetic"))
    assert isinstance(syn, crop_readers.SyntheticReader) and syn.size == tiny_cfg.synthetic_volume_size


def test_recorded_channel_crc32_catches_a_changed_value(data_dir, tmp_path):
    """Generated files record each channel's CRC-32 (zlib over the float32 values in C order); a value
    changed in place after writing, finite and with every attribute intact, is refused at load."""
    import json
    import shutil
    import zlib

    path = tmp_path / "vol.h5"
    shutil.copy(data_dir / "val_24.h5", path)
    with h5py.File(path) as f:
        for key in ("Nbody", "Hydro"):
            want = [zlib.crc32(f[key][c].astype("<f4").tobytes()) for c in range(f[key].shape[0])]
            assert json.loads(f.attrs[f"{key}_crc32"]) == want
    crop_readers.InMemReader(path, 4, 5, 8)  # intact: loads
    with h5py.File(path, "a") as f:
        f["Nbody"][1, 2, 3, 4] += 1e-3
    with pytest.raises(DatasetError, match=r"vol\.h5: Nbody channel 1 does not match its recorded CRC-32"):
        crop_readers.InMemReader(path, 4, 5, 8)
