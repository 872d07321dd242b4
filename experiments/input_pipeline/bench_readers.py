"""Crop-reader and generator benchmarks on this machine (one process, no framework):

    PYTHONPATH=. python experiments/input_pipeline/bench_readers.py --out results/readers_cpu.json

Reads 64^3 crops of 4 + 5 channels at random places of a 256^3 volume with the ``lowmem`` and
``inmem`` readers, from the chunked file the generator writes and from a contiguous copy, with and
without the symmetry transform; then times the generator at 128^3 and 256^3.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from shared_data.core import config as config_mod
from shared_data.core.errors import run_cli
from shared_data.data import crop_readers
from shared_data.data.sampler import CropStream, StreamKey


def contiguous_copy(src: Path) -> Path:
    """``<stem>_contiguous.h5``: the same datasets without chunking (made once)."""
    dst = src.with_name(src.stem + "_contiguous.h5")
    if not dst.exists():
        with h5py.File(src) as f, h5py.File(dst, "w") as g:
            for key in ("Nbody", "Hydro"):
                g.create_dataset(key, data=f[key][...], chunks=None)
    return dst


def time_reader(reader, cfg, n: int, transform: bool) -> float:
    """Samples/s of reading ``n`` crops (and applying the symmetry when ``transform``)."""
    draws = CropStream(StreamKey(7, 0), reader.size, cfg.crop_size, "cube48").next_batch(n)
    s = cfg.crop_size
    bi, bt = np.empty((4, s, s, s), np.float32), np.empty((5, s, s, s), np.float32)
    t0 = time.perf_counter()
    for i in range(n):
        reader.read(draws.starts[i], bi, bt)
        if transform:
            crop_readers.make_sample(bi, bt, int(draws.symmetries[i]), cfg)
    return n / (time.perf_counter() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python experiments/input_pipeline/bench_readers.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--volume", default="data/train_256.h5", help="256^3 dataset file (generated if missing)")
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--out", help="JSON file for the results")
    args = p.parse_args(argv)
    cfg = config_mod.load_config("base")
    vol = cfg.resolve_path(args.volume)
    gen = []
    for size, out in ((128, vol.with_name("bench_gen_128.h5")), (256, vol)):
        if size == 256 and vol.exists():
            continue
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "shared_data.data.generate", "--out", str(out), "--size", str(size), "--seed", "1"],
            check=True,
        )
        gen.append({"grid": size, "seconds": time.perf_counter() - t0})
    cont = contiguous_copy(vol)
    rows = []
    for kind, cls in (("lowmem", crop_readers.H5LowMemReader), ("inmem", crop_readers.InMemReader)):
        for layout, path in (("chunked 32^3", vol), ("contiguous", cont)):
            t0 = time.perf_counter()
            reader = cls(path, 4, 5, cfg.crop_size)
            setup = time.perf_counter() - t0
            for transform in (False, True):
                rate = time_reader(reader, cfg, args.samples, transform)
                rows.append(
                    {"reader": kind, "file": layout, "symmetry": transform, "samples_per_sec": rate, "setup_sec": setup}
                )
    print(f"{'reader':<8}{'file':<14}{'symmetry':<10}{'samples/s':>10}{'setup s':>9}")
    for r in rows:
        print(
            f"{r['reader']:<8}{r['file']:<14}{r['symmetry']!s:<10}{r['samples_per_sec']:>10.1f}{r['setup_sec']:>9.1f}"
        )
    for g in gen:
        print(f"generator {g['grid']}^3 (including process start and writing): {g['seconds']:.1f} s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {
                    "readers": rows,
                    "generator": gen,
                    "volume": str(args.volume),
                    "crop": cfg.crop_size,
                    "host": platform.node(),
                    "cpus": __import__("os").cpu_count(),
                    "command": " ".join(sys.argv),
                    "date": datetime.datetime.now().isoformat(timespec="seconds"),
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
