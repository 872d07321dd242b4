"""The best r(k) any model of the dark matter can reach on the nonlinear gas, and what the P ratio of
the best (conditional-mean) prediction is.

    python experiments/nonlinear_gas/ceiling.py --out /tmp/ceiling [--size 128 --seed 2 --draws 3]

The generator's patchy He II reionization (:func:`shared_data.data.gas_physics.reionization_offset`)
multiplies the photo-heated temperature by 10^m(x), m drawn from a generator of its own, independent of
the dark matter. No network given the dark matter can know m, so the temperature has a part that no
prediction reproduces. This script generates the held-out volume (``--size``, ``--seed``: the GPU
recipes' ``val_128.h5``) and ``--draws`` more with the same dark matter and other draws of m (the
module function patched here, in this process only), and scores them as ``validate`` scores a model
(:func:`shared_data.inference.metrics.compute_metrics`, physical units, the same k bins):

* r_12(k) of another draw against the held-out volume. With the gas = D + N (D fixed by the dark
  matter, N independent of it, same power in every draw), r_12 = P_D / (P_D + P_N), and the best
  prediction, D itself, has r = sqrt(r_12) with the truth: the ceiling of r(k).
* The mean of the draws (in physical units, stored back as the generator stores it) as a prediction:
  close to D for many draws; its r(k) and P ratio show what a prediction of the conditional mean
  reaches (its P ratio is below 1 by the power of N, which no such prediction holds).

The gas density does not depend on m (the smoothing follows the temperature before the late He II
heating: the module docstring of gas_physics, 5e), so its r_12 is 1 and its ceiling 1: a check.
Writes ``ceiling.json`` and ``table.txt`` (per k bin up to ``--k_max``, and the worst bins) into
``--out``; the generated volumes stay in ``--out`` too (``draw_<size>_<seed>_<j>.h5``, reused by a
later call with the same size and seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from shared_data.core.files import write_atomic
from shared_data.data import cosmology, generate
from shared_data.inference.metrics import compute_metrics, to_json
from shared_data.inference.units import DENSITY, TEMPERATURE, Units, linear, read_volume, units_from_files

CHANNELS = (DENSITY, TEMPERATURE)


def make_volume(path: Path, size: int, seed: int, draw: int) -> None:
    """Generate ``path`` as ``generate --size size --seed seed`` would, with the He II offset of draw
    ``draw`` (0: the generator's own; j > 0: the offset of seed ``seed + 1000 j``, the same dark matter)."""
    original = cosmology.reionization_offset
    if draw:
        cosmology.reionization_offset = lambda n, box, s: original(n, box, s + 1000 * draw)
    try:
        generate.main(["--out", str(path), "--size", str(size), "--seed", str(seed), "--if-missing"])
    finally:
        cosmology.reionization_offset = original


def mean_prediction(hydro: list[np.ndarray], units: Units) -> np.ndarray:
    """The draws' mean gas, channel by channel in physical units (density, temperature), stored back
    as the generator stores them (x = ln(rho) / density_scale, ln(T / T0) / temperature_scale); the
    other channels (velocities, linear in storage) averaged as stored. (C, L, L, L) float32."""
    stack = np.stack([h.astype(np.float64) for h in hydro])
    out = stack.mean(0)
    names = units.hydro_channels
    d, t = names.index(DENSITY), names.index(TEMPERATURE)
    out[d] = np.log(linear(DENSITY, stack[:, d], units).mean(0)) / units.density_scale
    temperature = linear(TEMPERATURE, stack[:, t], units)
    out[t] = np.log(temperature.mean(0) / units.temperature_T0) / units.temperature_scale
    return out.astype(np.float32)


def scored(pred: np.ndarray, truth: np.ndarray, nbody: np.ndarray, units, k_max: float) -> dict:
    """Per channel, the k bins up to ``k_max`` (at least one mode) with r(k) and P ratio of ``pred``."""
    power = compute_metrics(pred, truth, nbody, units)["power"]
    out = {}
    for name in CHANNELS:
        s = power[name]
        k, n = np.asarray(s["k"], np.float64), np.asarray(s["n_modes"])
        sel = (k <= k_max) & (n > 0)
        out[name] = {
            "k": k[sel],
            "r": np.asarray(s["r_pred"], np.float64)[sel],
            "ratio": np.asarray(s["ratio_pred"], np.float64)[sel],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the volumes, ceiling.json and table.txt")
    p.add_argument("--size", type=int, default=128, help="grid side (the GPU recipes' held-out volume: 128)")
    p.add_argument("--seed", type=int, default=2, help="the held-out volume's seed (the GPU recipes': 2)")
    p.add_argument("--draws", type=int, default=3, help="other draws of the He II offset")
    p.add_argument("--k_max", type=float, default=6.3, help="the bins scored, h/Mpc (the target's k_max)")
    args = p.parse_args(argv)
    if args.draws < 1:
        p.error(f"--draws {args.draws}: expected at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [args.out / f"draw_{args.size}_{args.seed}_{j}.h5" for j in range(args.draws + 1)]
    for j, path in enumerate(paths):
        make_volume(path, args.size, args.seed, j)
    truth, attrs = read_volume(paths[0], "Hydro")
    nbody, _ = read_volume(paths[0], "Nbody")
    units = units_from_files({paths[0]: attrs}, truth.shape[1], {}, flags_given=False)
    others = [read_volume(path, "Hydro")[0] for path in paths[1:]]

    pairs = [scored(h, truth, nbody, units, args.k_max) for h in others]
    mean = scored(mean_prediction(others, units), truth, nbody, units, args.k_max)
    result, lines = {}, []
    for name in CHANNELS:
        k = pairs[0][name]["k"]
        r12 = np.mean([pair[name]["r"] for pair in pairs], axis=0)
        ceiling = np.sqrt(np.clip(r12, 0.0, None))
        result[name] = {
            "k": k,
            "r_12": r12,
            "ceiling": ceiling,
            "r_of_mean": mean[name]["r"],
            "ratio_of_mean": mean[name]["ratio"],
            "worst_ceiling": float(ceiling.min()),
            "worst_ceiling_k": float(k[np.argmin(ceiling)]),
            "worst_r_of_mean": float(mean[name]["r"].min()),
            "worst_ratio_dev_of_mean": float(np.max(np.abs(mean[name]["ratio"] - 1))),
        }
        lines += [
            f"{name}: ceiling of r(k) (sqrt of r between draws of the He II offset, mean of {args.draws}); "
            f"the mean of the {args.draws} draws as a prediction",
            "| k h/Mpc | r_12 | ceiling | r of the mean | P ratio of the mean |",
            "|---|---|---|---|---|",
        ]
        rows = zip(k, r12, ceiling, mean[name]["r"], mean[name]["ratio"])
        lines += [f"| {a:.2f} | {b:.4f} | {c:.4f} | {d:.4f} | {e:.4f} |" for a, b, c, d, e in rows]
        lines += [
            f"worst: ceiling {result[name]['worst_ceiling']:.4f} at k = {result[name]['worst_ceiling_k']:.2f}; "
            f"the mean's r {result[name]['worst_r_of_mean']:.4f}, |P ratio - 1| "
            f"{result[name]['worst_ratio_dev_of_mean']:.4f}",
            "",
        ]
    record = {"size": args.size, "seed": args.seed, "draws": args.draws, "k_max": args.k_max, "channels": result}
    write_atomic(args.out / "ceiling.json", json.dumps(to_json(record), indent=1))
    write_atomic(args.out / "table.txt", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
