"""Why the trained models' temperature has more power than the truth: the conditional median against
the conditional mean, on the nonlinear gas, without a network.

    python experiments/nonlinear_gas/median_vs_mean.py --volume data/val_128.h5 --out /tmp/mvm [--bins 40]

An L1 loss is minimised by the conditional median of the target given the input, an L2 loss by its
conditional mean; the median commutes with a monotone map, so the L1 loss in log space
(``loss_space: log``) and in physical units (``physical``) share their optimum, and L2 in log space
gives the conditional geometric mean. This script stands in for "given the input" with two features of
the dark matter of ``--volume`` (its log density and its velocity divergence, each smoothed with a
Gaussian of ``--sigma`` voxels), cuts them into ``--bins`` x ``--bins`` equal-count bins, and predicts
each voxel's temperature by the bin's median, mean and geometric mean of T (K). Each prediction is
scored as ``validate`` scores a model (:func:`shared_data.inference.metrics.compute_metrics`, the
temperature in physical units, the same k bins): its P ratio and r(k). A two-phase temperature (warm
and shock-heated gas at the same dark-matter features) has a conditional median that jumps between
the phases where their odds cross 1:1, which a mean does not.

Writes ``median_vs_mean.json`` and ``table.txt`` (k bins up to ``--k_max``) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from shared_data.core.files import write_atomic
from shared_data.data import linear_field
from shared_data.inference.metrics import compute_metrics
from shared_data.inference.units import TEMPERATURE, linear, read_volume, units_from_files

PREDICTORS = ("median", "mean", "geometric mean")


def smooth(field: np.ndarray, sigma: float) -> np.ndarray:
    """``field`` (L, L, L) convolved with a periodic Gaussian of ``sigma`` voxels (float64)."""
    n = field.shape[0]
    kx, ky, kz = linear_field.wavenumbers(n, n)  # a box of n voxels: k in radians per voxel
    return linear_field.irfft3(np.fft.rfftn(field) * np.exp(-0.5 * sigma**2 * (kx**2 + ky**2 + kz**2)), n)


def divergence(v: np.ndarray) -> np.ndarray:
    """The spectral divergence of ``v`` (3, L, L, L) in units of v per voxel (float64)."""
    n = v.shape[1]
    return linear_field.irfft3(sum(1j * k * np.fft.rfftn(c) for k, c in zip(linear_field.wavenumbers(n, n), v)), n)


def binned_predictions(features: list[np.ndarray], t: np.ndarray, bins: int) -> dict[str, np.ndarray]:
    """Per voxel, the median, mean and geometric mean of ``t`` over the voxels of its bin, the bins
    being the product of ``bins`` equal-count intervals of each feature. Each (L, L, L) float64."""
    index = np.zeros(t.size, np.int64)
    for f in features:
        edges = np.quantile(f, np.linspace(0, 1, bins + 1)[1:-1])
        index = index * bins + np.searchsorted(edges, f.ravel())
    order = np.argsort(index, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(index[order]) != 0])
    groups = np.split(t.ravel()[order], starts[1:])
    stats = {
        "median": [np.median(g) for g in groups],
        "mean": [np.mean(g) for g in groups],
        "geometric mean": [np.exp(np.mean(np.log(g))) for g in groups],
    }
    out = {}
    for name, values in stats.items():
        per_voxel = np.empty(t.size)
        per_voxel[order] = np.repeat(values, np.diff(np.r_[starts, t.size]))
        out[name] = per_voxel.reshape(t.shape)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--volume", type=Path, required=True, help="a generated volume (nonlinear gas)")
    parser.add_argument("--out", type=Path, required=True, help="folder for median_vs_mean.json and table.txt")
    parser.add_argument("--bins", type=int, default=40, help="equal-count bins per feature")
    parser.add_argument("--sigma", type=float, default=1.0, help="the features' Gaussian smoothing, voxels")
    parser.add_argument("--k_max", type=float, default=6.3, help="the last k bin centre in the table, h/Mpc")
    args = parser.parse_args(argv)
    if not args.volume.is_file():
        print(f"error: {args.volume}: no such file", file=sys.stderr)
        return 2
    truth, attrs = read_volume(args.volume, "Hydro")
    nbody, _ = read_volume(args.volume, "Nbody")
    units = units_from_files({args.volume: attrs}, truth.shape[1], {}, flags_given=False)
    t_idx = units.hydro_channels.index(TEMPERATURE)
    temperature = linear(TEMPERATURE, truth[t_idx].astype(np.float64), units)
    log_rho = smooth(nbody[0].astype(np.float64), args.sigma)
    div = smooth(divergence(nbody[1:4].astype(np.float64)), args.sigma)
    predictions = binned_predictions([log_rho, div], temperature, args.bins)

    rows, record = [], {"volume": str(args.volume), "bins": args.bins, "sigma_voxels": args.sigma, "predictors": {}}
    for name in PREDICTORS:
        pred = truth.copy()
        stored = np.log(predictions[name] / units.temperature_T0) / units.temperature_scale  # the generator's transform
        pred[t_idx] = stored.astype(np.float32)
        s = compute_metrics(pred, truth, nbody, units)["power"][TEMPERATURE]
        k = np.asarray(s["k"], np.float64)
        sel = (k <= args.k_max) & (np.asarray(s["n_modes"]) > 0)
        r, ratio = np.asarray(s["r_pred"], np.float64)[sel], np.asarray(s["ratio_pred"], np.float64)[sel]
        record["predictors"][name] = {"k": k[sel].tolist(), "r": r.tolist(), "ratio": ratio.tolist()}
        rows.append((name, k[sel], r, ratio))
    lines = ["| predictor | " + " | ".join(f"k {k:.2f}" for k in rows[0][1][::4]) + " |"]
    lines.append("|---|" + "---|" * len(rows[0][1][::4]))
    for name, _, r, ratio in rows:
        lines.append(f"| {name}: P ratio | " + " | ".join(f"{v:.3f}" for v in ratio[::4]) + " |")
        lines.append(f"| {name}: r | " + " | ".join(f"{v:.3f}" for v in r[::4]) + " |")
    text = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "median_vs_mean.json", json.dumps(record, indent=1))
    write_atomic(args.out / "table.txt", text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
