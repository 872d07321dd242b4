"""Measure the generator's gas: how far it departs from the dark matter, against the literature.

    python experiments/nonlinear_gas/measure.py --volume data/val_128.h5 --out experiments/nonlinear_gas/results

Reads a generated volume (``--volume``; made with ``python -m shared_data.data.generate`` if missing,
``--size`` / ``--seed``) and writes into ``--out``:

* ``properties.json``: per k shell (validate's bins, up to ``--k_max`` h/Mpc) the r(k) of the two
  baselines of :mod:`shared_data.inference.metrics` with the gas density and the temperature (the
  dark matter as gas, and the non-ML baseline: Jeans-filtered dark matter with the mean T-rho
  relation); the scatter (standard deviation) of log10 T in bins of 0.1 dex of gas density above
  ``--overdensity`` (1 + delta > 1 + 3 by default); the gas mass fraction above 1e5 K, in
  1e5-1e7 K and above 1e7 K; the checks of issue #43 (``checks``);
* ``phase_diagram.png``: the mass-weighted histogram of log10 rho_gas/<rho> against log10 T, and
  P(k) of gas density, temperature and velocity beside the dark matter's density and velocity;
* ``table.txt``: the same numbers as a table.

The checks: the dark matter as gas has r < 0.95 with the gas density in every shell from 3 h/Mpc
and r < 0.9 with the temperature in every shell, both up to ``--k_max``; the scatter of log10 T
exceeds 0.2 dex in every density bin above the overdensity (bins with fewer than 100 voxels are
left out of the check and listed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared_data.data import generate, linear_field
from shared_data.inference.metrics import compute_metrics, k_edges
from shared_data.inference.units import DENSITY, TEMPERATURE, linear, read_volume, units_from_files

MIN_VOXELS = 100


def scatter_at_fixed_density(log_rho: np.ndarray, log_t: np.ndarray, lowest: float, width: float = 0.1) -> list[dict]:
    """Standard deviation of ``log_t`` in bins of ``width`` dex of ``log_rho`` from ``lowest`` up."""
    edges = np.arange(lowest, log_rho.max() + width, width)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (log_rho >= lo) & (log_rho < hi)
        if sel.sum() >= 2:
            out.append(
                {"log10_rho": [float(lo), float(hi)], "voxels": int(sel.sum()), "std_log10_T": float(log_t[sel].std())}
            )
    return out


def measure(path: Path, k_max: float, overdensity: float) -> dict:
    """The properties of the module docstring for the volume at ``path``."""
    hydro, attrs = read_volume(path, "Hydro")
    nbody, _ = read_volume(path, "Nbody")
    side = hydro.shape[1]
    units = units_from_files({path: attrs}, side, {})
    m = compute_metrics(hydro, hydro, nbody, units)
    rho = linear(DENSITY, hydro[0], units)
    temp = linear(TEMPERATURE, hydro[1], units)
    mass = rho / rho.sum()
    shells = {}
    for name in (DENSITY, TEMPERATURE):
        s = m["power"][name]
        sel = np.asarray(s["k"]) <= k_max
        shells[name] = {
            "k": np.asarray(s["k"])[sel].tolist(),
            "r_dm_as_gas": np.asarray(s["r_baseline"])[sel].tolist(),
            "r_non_ml": np.asarray(s["r_non_ml"])[sel].tolist() if "r_non_ml" in s else None,
        }
    log_rho, log_t = np.log10(rho / rho.mean()), np.log10(temp)
    scatter = scatter_at_fixed_density(log_rho.ravel(), log_t.ravel(), np.log10(1 + overdensity))
    checked = [b for b in scatter if b["voxels"] >= MIN_VOXELS]
    k_rho = np.asarray(shells[DENSITY]["k"])
    r_rho = np.asarray(shells[DENSITY]["r_dm_as_gas"])
    checks = {
        "density_r_below_0.95_from_k_3": bool((r_rho[k_rho >= 3.0] < 0.95).all()),
        "temperature_r_below_0.9_every_shell": bool((np.asarray(shells[TEMPERATURE]["r_dm_as_gas"]) < 0.9).all()),
        "scatter_above_0.2_dex_above_overdensity": bool(checked) and all(b["std_log10_T"] > 0.2 for b in checked),
        "scatter_bins_left_out": [b["log10_rho"] for b in scatter if b["voxels"] < MIN_VOXELS],
    }
    return {
        "volume": str(path),
        "gas": attrs.get("gas", "filtered (no gas attribute)"),
        "generator": attrs.get("generator"),
        "side": side,
        "box_mpc_h": m["box_mpc_h"],
        "redshift": attrs.get("redshift"),
        "k_max_h_mpc": k_max,
        "shells": shells,
        "overdensity_above": overdensity,
        "scatter_log10_T": scatter,
        "mass_fraction": {
            "T>1e5K": float(mass[temp > 1e5].sum()),
            "1e5K<T<1e7K": float(mass[(temp > 1e5) & (temp < 1e7)].sum()),
            "T>1e7K": float(mass[temp > 1e7].sum()),
        },
        "volume_fraction_T>1e5K": float((temp > 1e5).mean()),
        "checks": checks,
    }


def velocity_power(v: np.ndarray, box: float, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """k and the summed power of the three velocity components ((km/s)^2 (Mpc/h)^3)."""
    parts = [linear_field.measure_power(c - c.mean(), box, edges) for c in v]
    return parts[0][0], sum(p[1] for p in parts)


def figure(path: Path, volume: Path, props: dict) -> None:
    """The phase diagram and the P(k) panels (module docstring), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shared_data.core.files import atomic_path

    hydro, attrs = read_volume(volume, "Hydro")
    nbody, _ = read_volume(volume, "Nbody")
    units = units_from_files({volume: attrs}, hydro.shape[1], {})
    rho = linear(DENSITY, hydro[0], units)
    rho_dm = np.exp(units.density_scale * nbody[0].astype(np.float64))
    temp = linear(TEMPERATURE, hydro[1], units)
    box, edges = props["box_mpc_h"], k_edges(hydro.shape[1], units.voxel_size)
    fig, (ax_phase, ax_rho, ax_t, ax_v) = plt.subplots(1, 4, figsize=(20, 4.6))
    h, xe, ye = np.histogram2d(
        np.log10(rho / rho.mean()).ravel(), np.log10(temp).ravel(), bins=120, weights=(rho / rho.sum()).ravel()
    )
    im = ax_phase.imshow(
        np.log10(np.where(h > 0, h, np.nan)).T,
        origin="lower",
        aspect="auto",
        extent=(xe[0], xe[-1], ye[0], ye[-1]),
        cmap="magma",
    )
    fig.colorbar(im, ax=ax_phase, label="log10 mass fraction per bin")
    x = np.linspace(xe[0], xe[-1], 50)
    ax_phase.plot(
        x, np.log10(units.temperature_T0) + (units.igm_gamma - 1) * x, "c--", lw=1, label="T0 (rho/<rho>)^(gamma-1)"
    )
    ax_phase.axhline(5, color="w", lw=0.6, ls=":", label="1e5 K")
    ax_phase.set_xlabel("log10 rho_gas / <rho>")
    ax_phase.set_ylabel("log10 T [K]")
    ax_phase.set_title(
        f"phase diagram: {100 * props['mass_fraction']['T>1e5K']:.1f}% of the mass above 1e5 K", fontsize=9
    )
    ax_phase.legend(fontsize=7, loc="upper left")
    for ax, (label, fields) in zip(
        (ax_rho, ax_t),
        (
            ("density", {"gas": rho, "dark matter": rho_dm}),
            (
                "temperature",
                {"gas T": temp, "T0 (rho_dm/<rho>)^(gamma-1)": units.temperature_T0 * rho_dm ** (units.igm_gamma - 1)},
            ),
        ),
    ):
        for tag, f in fields.items():
            k, p, _ = linear_field.measure_power(f / f.mean() - 1, box, edges)
            ax.loglog(k, p, label=tag)
        ax.set_xlabel("k [h/Mpc]")
        ax.set_ylabel("P(k) of f/<f> - 1 [(Mpc/h)^3]")
        ax.set_title(f"{label}", fontsize=9)
        ax.legend(fontsize=7)
    for tag, v in (("gas", hydro[2:5]), ("dark matter", nbody[1:4])):
        k, p = velocity_power(units.velocity_scale * v.astype(np.float64), box, edges)
        ax_v.loglog(k, p, label=tag)
    ax_v.set_xlabel("k [h/Mpc]")
    ax_v.set_ylabel("sum of P_vi(k) [(km/s)^2 (Mpc/h)^3]")
    ax_v.set_title("velocity", fontsize=9)
    ax_v.legend(fontsize=7)
    fig.suptitle(
        f"{volume.name}: {props['gas']} gas, {props['side']}^3, {props['box_mpc_h']:g} Mpc/h, z = {props['redshift']}",
        fontsize=10,
    )
    fig.tight_layout()
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


def table(props: dict) -> str:
    """The numbers of ``props`` as text."""
    rows = [
        f"{props['volume']}: {props['gas']} gas, {props['generator']}, {props['side']}^3, z = {props['redshift']}",
        "",
    ]
    rows.append(
        "k [h/Mpc] | density r (DM as gas) | density r (non-ML) | temperature r (DM as gas) | temperature r (non-ML)"
    )
    d, t = props["shells"][DENSITY], props["shells"][TEMPERATURE]
    for i, k in enumerate(d["k"]):
        nd = "-" if d["r_non_ml"] is None else f"{d['r_non_ml'][i]:.4f}"
        nt = "-" if t["r_non_ml"] is None else f"{t['r_non_ml'][i]:.4f}"
        rows.append(f"{k:9.3f} | {d['r_dm_as_gas'][i]:.4f} | {nd} | {t['r_dm_as_gas'][i]:.4f} | {nt}")
    rows += ["", f"scatter of log10 T at fixed density, 1 + delta > {1 + props['overdensity_above']:g} (0.1 dex bins):"]
    for b in props["scatter_log10_T"]:
        rows.append(
            f"  log10 rho in [{b['log10_rho'][0]:.2f}, {b['log10_rho'][1]:.2f}): "
            f"{b['std_log10_T']:.3f} dex ({b['voxels']} voxels)"
        )
    rows.append("")
    rows += [f"mass fraction {k}: {100 * v:.2f}%" for k, v in props["mass_fraction"].items()]
    rows += ["", "checks: " + json.dumps(props["checks"])]
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--volume", required=True, help="generated HDF5 volume (made if missing)")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--gas", default="nonlinear", help="gas model if the volume is made here")
    p.add_argument("--out", required=True)
    p.add_argument("--k_max", type=float, default=6.3)
    p.add_argument("--overdensity", type=float, default=3.0, help="delta above which the scatter is measured")
    args = p.parse_args(argv)
    volume, out = Path(args.volume), Path(args.out)
    if not volume.exists():
        generate.main(["--out", str(volume), "--size", str(args.size), "--seed", str(args.seed), "--gas", args.gas])
    props = measure(volume, args.k_max, args.overdensity)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{volume.stem}"
    (out / f"properties_{stem}.json").write_text(json.dumps(props, indent=1))
    (out / f"table_{stem}.txt").write_text(table(props))
    figure(out / f"phase_diagram_{stem}.png", volume, props)
    print(table(props))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
