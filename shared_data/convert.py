"""Convert a dataset file to the DHWC ``.npy`` pair DALI's numpy reader crops with ROI.

``python -m shared_data.convert data/train_128.h5`` writes ``data/train_128_Nbody.npy``
(L, L, L, 4) and ``data/train_128_Hydro.npy`` (L, L, L, 5), float32, channels last (the tutorial's
``convert_to_npy``). Slabs along x are copied one at a time, so volumes larger than memory convert.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np

from shared_data import dataset
from shared_data.errors import run_cli

SLAB = 16


def convert_to_npy(path: str | Path, skip_existing: bool = False) -> tuple[Path, Path]:
    """Write the DHWC ``.npy`` files of HDF5 file ``path`` (atomically); return their paths.

    Raises:
        DatasetError: ``path`` is missing or not an HDF5 file with ``Nbody`` and ``Hydro``.
    """
    path = Path(path)
    outs = dataset.npy_paths(path)
    if skip_existing and all(p.exists() for p in outs):
        print(f"{outs[0].name}, {outs[1].name} exist; not reconverted")
        return outs
    with dataset.open_h5(path) as f:
        for key, out in zip(dataset.KEYS, outs):
            if key not in f:
                raise dataset.DatasetError(f"{path}: missing dataset {key!r}")
            ds = f[key]
            c, size = ds.shape[0], ds.shape[1]
            tmp = out.with_name(out.name + ".tmp")
            mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(*ds.shape[1:], c))
            for x0 in range(0, size, SLAB):
                slab = ds[:, x0:x0 + SLAB].astype(np.float32)
                dataset.check_finite(slab, f"{path} {key} (x from {x0})")
                mm[x0:x0 + SLAB] = np.moveaxis(slab, 0, -1)
            mm.flush()
            del mm
            tmp.replace(out)
            print(f"wrote {out}: shape {(*ds.shape[1:], c)} float32 (DHWC)")
    return outs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shared_data.convert", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="HDF5 dataset files")
    args = p.parse_args(argv)
    for path in args.files:
        convert_to_npy(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
