"""Print and check a dataset file: ``python -m shared_data.data.inspect data/train_128.h5``.

Shows shapes, dtypes, chunks and attributes, then per-channel min / max / mean / std, and checks
the contract: both datasets present, channel counts, a cubic volume, float dtype, finite values,
and targets (``Hydro``) strictly inside tanh's (-1, 1). Exit code 0 if the file passes, 2 if not.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_data.core.commands import make_parser
from shared_data.core.errors import DatasetError, run_cli
from shared_data.data import dataset

SLAB = 16


def channel_stats(ds, checksum: dataset.ChannelChecksum | None = None) -> list[dict]:
    """Per-channel min, max, mean, std and count of non-finite values, read slab by slab (float64 sums);
    each slab also goes through ``checksum``."""
    c, size = ds.shape[0], ds.shape[1]
    acc = [dict(min=np.inf, max=-np.inf, s=0.0, s2=0.0, n=0, bad=0) for _ in range(c)]
    for x0 in range(0, size, SLAB):
        with dataset.reading(ds.file.filename, f"{ds.name.lstrip('/')} (x from {x0})"):
            raw = ds[:, x0 : x0 + SLAB]
        if checksum is not None:
            checksum.update(raw)
        slab = raw.astype(np.float64)
        for i in range(c):
            v = slab[i]
            fin = np.isfinite(v)
            a = acc[i]
            a["bad"] += int(v.size - fin.sum())
            v = v[fin]
            if v.size:
                a["min"], a["max"] = min(a["min"], v.min()), max(a["max"], v.max())
                a["s"] += v.sum()
                a["s2"] += (v * v).sum()
                a["n"] += v.size
    out = []
    for a in acc:
        mean = a["s"] / max(a["n"], 1)
        out.append(
            dict(
                min=a["min"],
                max=a["max"],
                mean=mean,
                std=np.sqrt(max(a["s2"] / max(a["n"], 1) - mean**2, 0.0)),
                nonfinite=a["bad"],
            )
        )
    return out


def channel_names(info: dataset.VolumeInfo, key: str, channels: int, problems: list) -> list[str]:
    """The names of ``key``'s channels from the ``<key>_channels`` attribute: one per channel; a list of
    another length or a malformed attribute is a problem (appended to ``problems``), and every channel
    is still checked under a generic name."""
    generic = [f"ch{i}" for i in range(channels)]
    try:
        names = dataset.json_attr(info.attrs, f"{key}_channels", info.path)
    except DatasetError as err:
        problems.append(str(err))
        return generic
    if names is None:
        return generic
    if not isinstance(names, list) or len(names) != channels:
        count = len(names) if isinstance(names, list) else "no"
        problems.append(
            f"{info.path}: attribute {key}_channels = {names!r} names {count} channels, but {key} has {channels}"
        )
        return generic
    return [str(n) for n in names]


def inspect(path: str | Path, n_in: int = 4, n_out: int = 5) -> dataset.VolumeInfo:
    """Print the report for ``path`` and return its :class:`~shared_data.data.dataset.VolumeInfo`.

    Raises:
        DatasetError: the first contract violation found (after printing what was read).
    """
    info = dataset.validate(path, n_in, n_out)
    print(f"{path}: cubic volume L={info.size}, chunks {info.chunks}")
    for k, v in info.attrs.items():
        print(f"  attr {k} = {v}")
    problems = []
    with dataset.open_h5(path) as f:
        for key in dataset.KEYS:
            ds = f[key]
            names = channel_names(info, key, ds.shape[0], problems)
            print(f"{key}: shape {ds.shape} dtype {ds.dtype}")
            print(f"  {'channel':<16}{'min':>10}{'max':>10}{'mean':>10}{'std':>10}")
            checksum = dataset.ChannelChecksum(info.path, info.attrs, key)
            stats = channel_stats(ds, checksum)
            try:
                checksum.verify()
            except DatasetError as err:
                problems.append(str(err))
            for name, st in zip(names, stats, strict=True):
                print(f"  {name:<16}{st['min']:>10.4f}{st['max']:>10.4f}{st['mean']:>10.4f}{st['std']:>10.4f}")
                if st["nonfinite"]:
                    problems.append(
                        f"{path}: {key} channel {name} has {st['nonfinite']} NaN/inf values; expected finite floats"
                    )
                elif key == "Hydro" and not (st["min"] > -1 and st["max"] < 1):
                    problems.append(
                        f"{path}: {key} channel {name} spans [{st['min']:.4f}, {st['max']:.4f}]; "
                        "targets must lie inside tanh's (-1, 1)"
                    )
    if problems:
        raise DatasetError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    print("contract: OK")
    return info


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("shared_data.data.inspect", __doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="HDF5 dataset files")
    p.add_argument("--n_in", type=int, default=4, help="expected Nbody channels")
    p.add_argument("--n_out", type=int, default=5, help="expected Hydro channels")
    args = p.parse_args(argv)
    for path in args.files:
        inspect(path, args.n_in, args.n_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
