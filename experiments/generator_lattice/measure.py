"""The particle-lattice artefact of the generated dark matter, per deposit scheme, and the generator's time.

``python experiments/generator_lattice/measure.py --out experiments/generator_lattice/results``

For one realisation (128^3, 0.25 Mpc/h voxels, z = 2, seed 1: the default dataset) the Zel'dovich
displacement field of :mod:`shared_data.data.dark_matter` moves particles that are deposited on the grid
by each scheme below; every scheme sees the same displacement field (Fourier-shifted to sub-lattice
positions), so the schemes differ only in how mass reaches the grid (a lattice of spacing d cells
ripples by 2 |W(2 pi / d)| of its mean, W = sinc^2 for CIC, sinc^3 for TSC):

* ``cic_n1``: one particle per cell, cloud-in-cell (generator v1);
* ``tsc_n1``: one particle per cell, triangular-shaped cloud;
* ``cic_n2``: 2^3 particles per cell, cloud-in-cell;
* ``tsc_n2``: 2^3 particles per cell, triangular-shaped cloud;
* ``tsc_n4``: 4^3 particles per cell, TSC: the converged reference (its ripple in a void stretched
  1.5x per axis is 0.2% of the mean, against 34% for ``cic_n1``).

Metrics per scheme, for the dark matter (and the gas, Jeans-smoothed from it):

* ``floor_fraction``: voxels with rho / rho_mean below the stored floor 1e-3;
* ``void_log_rms``: rms of ln(rho) - ln(rho_ref) over the voxels where the reference is below 0.5
  (the voids, where the lattice shows), with rho floored at 1e-3 as the files store it;
* ``axis_excess``: the lattice's plaid is a set of ripples along the grid axes, so its power sits in
  modes along the axes; the physical field is isotropic. Over 0.25 <= k / k_Nyquist < 1, the power of
  ln(rho) in modes within 10 degrees of an axis divided by that of the reference in the same modes,
  over the same ratio for all other modes (1 = no axis-aligned excess over the reference);
* ``pk_ratio``: P(k) of rho / D(z)^2 P_lin(k) of the realisation's own linear field (cosmic variance
  cancels), per bin up to k = 2 h/Mpc, and r(k) of the two fields.

It also times ``python -m shared_data.data.generate`` (a fresh process, writing the file; wall and CPU) at 64^3 and
128^3 for the working tree and for ``--before`` (a commit, unpacked with ``git archive``), the best
of ``--repeats``, and writes slices of ln(rho) of dark matter and gas for ``cic_n1`` and the generator's
current output (the slice z = L/2) to ``slices.png``. Writes ``metrics.json`` and prints a table last. CPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from shared_data.data import cosmology, gas_physics, linear_field  # noqa: E402

FLOOR = 1e-3
SIZE, SEED, Z = 128, 1, 2.0
K_JEANS = 6.0


def deposit(pos: np.ndarray, size: int, values: list[np.ndarray], order: int) -> list[np.ndarray]:
    """Deposit per-particle ``values`` at ``pos`` (3, n), cell units, cell i centred at i, periodic:
    ``order`` 1 is cloud-in-cell, 2 is triangular-shaped cloud (Hockney & Eastwood 1988, 5-2)."""
    axes = []
    for x in pos:
        if order == 1:
            i0 = np.floor(x).astype(np.int64)
            f = x - i0
            axes.append([(i0 % size, 1 - f), ((i0 + 1) % size, f)])
        else:
            c = np.floor(x + 0.5).astype(np.int64)
            d = x - c
            axes.append(
                [
                    ((c - 1) % size, 0.5 * (0.5 - d) ** 2),
                    (c % size, 0.75 - d**2),
                    ((c + 1) % size, 0.5 * (0.5 + d) ** 2),
                ]
            )
    out = [np.zeros(size**3) for _ in values]
    for ix, wx in axes[0]:
        for iy, wy in axes[1]:
            ixy, wxy = ix * size + iy, wx * wy
            for iz, wz in axes[2]:
                idx, w = ixy * size + iz, wxy * wz
                for grid, v in zip(out, values):
                    grid += np.bincount(idx, weights=w * v, minlength=size**3)
    return [g.reshape((size,) * 3) for g in out]


def displacement_k(size: int, box: float, seed: int):
    """Fourier modes of the truncated Zel'dovich displacement (3, rfft layout) and the linear field, as
    :func:`shared_data.data.cosmology.simulate` makes them."""
    cosmo = linear_field.Cosmology()
    rng = np.random.default_rng(seed)
    delta_k = linear_field.gaussian_field_k(size, box, cosmo.linear_power, rng)
    growth = cosmo.growth_factor(Z)
    k_nl = linear_field.nonlinear_wavenumber(cosmo, Z, k_max=np.sqrt(3) * np.pi * size / box)
    kx, ky, kz = linear_field.wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    k2[0, 0, 0] = 1.0
    trunc = np.exp(-0.5 * k2 / k_nl**2)
    psi_k = np.stack([1j * kc / k2 * delta_k * growth * trunc for kc in (kx, ky, kz)])
    return psi_k, linear_field.irfft3(delta_k, size), growth


def density(psi_k: np.ndarray, size: int, box: float, order: int, n: int) -> np.ndarray:
    """rho / rho_mean from n^3 particles per cell at offsets ((j + 1/2) / n - 1/2) cells, displaced by
    the Fourier-shifted displacement field, deposited with ``order``."""
    cell = box / size
    kx, ky, kz = linear_field.wavenumbers(size, box)
    grid = np.indices((size,) * 3, dtype=np.float64).reshape(3, -1)
    offsets = (np.arange(n) + 0.5) / n - 0.5
    rho = np.zeros((size,) * 3)
    for ox in offsets:
        for oy in offsets:
            for oz in offsets:
                shift = np.exp(1j * (kx * ox + ky * oy + kz * oz) * cell)
                psi = np.stack([linear_field.irfft3(p * shift, size) for p in psi_k])
                o = np.array([ox, oy, oz])[:, None]
                pos = (grid + o + psi.reshape(3, -1) / cell) % size
                (m,) = deposit(pos, size, [np.full(size**3, 1.0 / n**3)], order)
                rho += m
    return rho


def axis_modes(size: int, box: float):
    kx, ky, kz = linear_field.wavenumbers(size, box)
    k = np.sqrt(kx**2 + ky**2 + kz**2)
    k_nyq = np.pi * size / box
    shell = (k >= 0.25 * k_nyq) & (k < k_nyq)
    kmax = np.maximum(np.maximum(np.abs(kx), np.abs(ky)), np.abs(kz))
    along = shell & (kmax >= np.cos(np.radians(10.0)) * np.where(k > 0, k, 1))
    return along, shell & ~along


def metrics(rho: np.ndarray, ref: np.ndarray, delta_lin: np.ndarray, growth: float, box: float) -> dict:
    size = rho.shape[0]
    lr, lref = np.log(np.maximum(rho, FLOOR)), np.log(np.maximum(ref, FLOOR))
    void = ref < 0.5
    along, other = axis_modes(size, box)
    p, pref = np.abs(np.fft.rfftn(lr - lr.mean())) ** 2, np.abs(np.fft.rfftn(lref - lref.mean())) ** 2
    excess = (p[along].sum() / pref[along].sum()) / (p[other].sum() / pref[other].sum())
    k_f = 2 * np.pi / box
    edges = np.arange(0.5 * k_f, 2.0 + 0.5 * k_f, k_f)
    k, p_rho, n = linear_field.measure_power(rho - 1, box, edges)
    _, p_lin, _ = linear_field.measure_power(delta_lin * growth, box, edges)
    _, p_x, _ = linear_field.measure_cross_power(rho - 1, delta_lin, box, edges)
    ok = n > 0
    return {
        "floor_fraction": float((rho < FLOOR).mean()),
        "min": float(rho.min()),
        "void_log_rms": float(np.sqrt(np.mean((lr - lref)[void] ** 2))),
        "axis_excess": float(excess),
        "k": k[ok].round(4).tolist(),
        "pk_ratio": (p_rho / p_lin)[ok].round(5).tolist(),
        "r": (p_x / np.sqrt(p_rho * p_lin / growth**2))[ok].round(5).tolist(),
    }


def time_generator(roots: dict[str, Path], sizes: tuple[int, ...], repeats: int) -> dict:
    """Best wall and CPU (user + system) seconds of ``python -m shared_data.data.generate`` at each size
    for each code root (label -> folder holding ``shared_data``), the roots interleaved in every repeat
    so that a busy machine slows them alike; CPU time is the steadier of the two on a shared machine."""
    best = {label: {str(s): {"wall_sec": np.inf, "cpu_sec": np.inf} for s in sizes} for label in roots}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for label, root in roots.items():
                for size in sizes:
                    cmd = [
                        sys.executable,
                        "-m",
                        "shared_data.data.generate",
                        "--out",
                        f"{tmp}/t.h5",
                        "--size",
                        str(size),
                    ]
                    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                    subprocess.run(
                        cmd, check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True
                    )
                    wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                    rec = best[label][str(size)]
                    rec["wall_sec"], rec["cpu_sec"] = (
                        min(rec["wall_sec"], round(wall, 2)),
                        min(rec["cpu_sec"], round(cpu, 2)),
                    )
    return best


def slices(path: Path, panels: list[tuple[str, np.ndarray, tuple[float, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(2, len(panels) // 2, figsize=(4.2 * len(panels) // 2, 8), constrained_layout=True)
    for ax, (title, img, (lo, hi)) in zip(axs.ravel(), panels):
        im = ax.imshow(img.T, origin="lower", cmap="magma", vmin=lo, vmax=hi)
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(im, ax=ax, shrink=0.8)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--before", default="c4d499f", help="commit of the generator to compare against")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", type=int, default=SIZE)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    box = 0.25 * args.size
    psi_k, delta_lin, growth = displacement_k(args.size, box, SEED)
    schemes = {"cic_n1": (1, 1), "tsc_n1": (2, 1), "cic_n2": (1, 2), "tsc_n2": (2, 2)}
    ref = density(psi_k, args.size, box, 2, 4)
    result = {"size": args.size, "box_mpc_h": box, "seed": SEED, "redshift": Z, "schemes": {}}
    fields = {}
    for name, (order, n) in schemes.items():
        t = time.perf_counter()
        rho = density(psi_k, args.size, box, order, n)
        seconds = time.perf_counter() - t
        gas, gas_ref = (np.maximum(gas_physics.jeans_filter(r, box, K_JEANS), 0.0) for r in (rho, ref))
        fields[name] = (rho, gas)
        result["schemes"][name] = {
            "deposit_sec": round(seconds, 2),
            "dm": metrics(rho, ref, delta_lin, growth, box),
            "gas": {k: v for k, v in metrics(gas, gas_ref, delta_lin, growth, box).items() if k not in ("k", "r")},
        }
    # the generator as it stands (working tree) against the one at --before
    from shared_data.data import generate

    ns = generate.build_parser().parse_args(["--out", "x.h5", "--size", str(args.size)])
    cosmo = linear_field.Cosmology()  # the study measures the Zel'dovich dark matter's deposit
    now = cosmology.simulate(args.size, box, Z, SEED, cosmo, ns.k_jeans, ns.t0, ns.gamma, dm="zeldovich")
    result["generator_now"] = {
        "version": generate.GENERATOR_VERSION,
        "dm": metrics(now.rho_dm, ref, delta_lin, growth, box),
        "gas": metrics(
            now.rho_gas, np.maximum(gas_physics.jeans_filter(ref, box, K_JEANS), 0.0), delta_lin, growth, box
        ),
    }
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(
            ["git", "archive", args.before, "shared_data"], cwd=REPO, check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        timing = time_generator({"before": Path(old), "now": REPO}, (64, 128), args.repeats)
    result["generator_time"] = timing
    result["before_commit"] = args.before
    half, v = args.size // 2, generate.GENERATOR_VERSION
    logs = [np.log(np.maximum(r[:, :, half], FLOOR)) for r in (*fields["cic_n1"], now.rho_dm, now.rho_gas)]
    dm_range, gas_range = (tuple(np.percentile(f, [0.5, 99.5])) for f in logs[2:])
    slices(
        args.out / "slices.png",
        [
            ("dark matter ln(rho): v1 (1 particle/cell, CIC)", logs[0], dm_range),
            (f"dark matter ln(rho): v{v} (2^3 particles/cell, TSC)", logs[2], dm_range),
            ("gas ln(rho): v1", logs[1], gas_range),
            (f"gas ln(rho): v{v}", logs[3], gas_range),
        ],
    )
    tmp = args.out / "metrics.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out / "metrics.json")
    print(
        f"{'scheme':>14} {'deposit s':>9} {'floor dm':>9} {'void rms dm':>11} {'axis dm':>8} {'axis gas':>8} "
        f"{'P/Plin k<1':>10} {'r k<1':>7}"
    )
    rows = [(k, v) for k, v in result["schemes"].items()] + [
        (f"generator v{generate.GENERATOR_VERSION}", result["generator_now"])
    ]
    for name, v in rows:
        dm, k = v["dm"], np.array(v["dm"]["k"])
        low = k <= max(1.0, k[min(1, len(k) - 1)])  # the largest scales (at least two bins)
        print(
            f"{name:>14} {v.get('deposit_sec', float('nan')):9.2f} {dm['floor_fraction']:9.2e} "
            f"{dm['void_log_rms']:11.4f} "
            f"{dm['axis_excess']:8.3f} {v['gas']['axis_excess']:8.3f} "
            f"{np.mean(np.array(dm['pk_ratio'])[low]):10.4f} {np.min(np.array(dm['r'])[low]):7.4f}"
        )
    for label, per_size in timing.items():
        cells = ", ".join(f"{size}^3 {t['wall_sec']} s wall / {t['cpu_sec']} s CPU" for size, t in per_size.items())
        print(f"generator {label:>6} ({args.before if label == 'before' else 'working tree'}): {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
