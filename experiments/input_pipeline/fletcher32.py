"""Crop reads of the ``lowmem`` reader from one volume written twice: plain chunks, and the same
chunks with HDF5's Fletcher-32 filter (a checksum per chunk, checked on every read).

    python experiments/input_pipeline/fletcher32.py data/train_128.h5 --crop 32 --crops 400 --out r.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from shared_data.data import crop_readers, dataset


def copy(src: Path, dst: Path, fletcher32: bool) -> None:
    with h5py.File(src) as f, h5py.File(dst, "w") as g:
        for key in dataset.KEYS:
            ds = f[key]
            g.create_dataset(key, data=ds[...], chunks=ds.chunks, fletcher32=fletcher32)
        for k, v in f.attrs.items():
            g.attrs[k] = v


def crops_per_sec(path: Path, crop: int, crops: int, seed: int) -> float:
    r = crop_readers.H5LowMemReader(path, 4, 5, crop)
    bi, bt = np.empty((4, crop, crop, crop), np.float32), np.empty((5, crop, crop, crop), np.float32)
    starts = np.random.default_rng(seed).integers(0, r.size - crop + 1, (crops, 3))
    r.read(tuple(starts[0]), bi, bt)  # open the file, warm the page cache
    t0 = time.perf_counter()
    for s in starts:
        r.read(tuple(s), bi, bt)
    return crops / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("volume")
    p.add_argument("--crop", type=int, default=32)
    p.add_argument("--crops", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, f32 in (("plain", False), ("fletcher32", True)):
            files[name] = Path(tmp) / f"{name}.h5"
            copy(Path(args.volume), files[name], f32)
        rates = {name: [] for name in files}
        for rep in range(args.repeats):  # interleaved, so that load on the machine hits both alike
            for name, path in files.items():
                rates[name].append(crops_per_sec(path, args.crop, args.crops, rep))
    with h5py.File(args.volume) as f:
        chunks = f["Nbody"].chunks
    record = {
        "volume": args.volume,
        "chunks": chunks,
        "crop": args.crop,
        "crops": args.crops,
        "crops_per_sec": rates,
        "median_ratio_plain_over_fletcher32": float(np.median(rates["plain"]) / np.median(rates["fletcher32"])),
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "host": platform.node(),
        "cpu_count": __import__("os").cpu_count(),
        "command": "python experiments/input_pipeline/fletcher32.py " + " ".join(__import__("sys").argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(record, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
