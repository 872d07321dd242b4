"""The N-body dark matter of a generated volume and the gas made from it, measured (issue #56):

    PYTHONPATH=. python experiments/nbody_dm/measure.py --volume data/train_128.h5

Reads a generated volume (``--volume``; made with ``python -m shared_data.data.generate --size --seed``,
the default dark matter, if missing) and runs its N-body again (deterministic by seed: the file holds
the particles' grid fields, not the particles), then measures:

* the dark matter's P(k) (the particles' CIC density, window divided out) against CAMB's linear and
  HMcode-2020 P(k) at the file's redshift, and against the same seed's linear field times HMcode's
  boost P_HMcode / P_lin (the realisation-matched ratio: the seed's large-scale modes cancel);
* the one-point PDF of log10 rho of the file's dark matter and gas density;
* friends-of-friends halos of the particles (linking length ``--link`` times the mean spacing) and
  their mass function beside Sheth & Tormen (1999) of the cosmology's own sigma(M) (CAMB's linear
  spectrum), once over all k and once over the modes the box holds (the grid's modes, fundamental to
  its corner), and, where ``colossus`` imports, colossus's Watson et al. (2013) FoF function;
* the gas: the mass-weighted phase diagram (log10 rho_gas against log10 T), the scatter of log10 T at
  fixed density (0.1 dex bins), the mass fraction above 1e5 K, and P(k) of gas density, temperature and
  velocity over the dark matter's density, T0 rho_dm^(gamma - 1) and velocity;

and writes ``measure_<size>_seed<seed>.json`` (every number), ``table_<size>_seed<seed>.txt`` and
``figure_<size>_seed<seed>.png`` (slices of dark matter and gas, P(k) ratios, the PDFs, the mass
function, the phase diagram) into ``--out``. Needs camb; matplotlib for the figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from power import camb_power, cic_power, power_edges

from shared_data.data import cosmology, generate, linear_field, nbody

RESULTS = Path(__file__).with_name("results")
#: Critical density today in h^2 M_sun / Mpc^3: rho_m = Omega_m RHO_CRIT in M_sun/h per (Mpc/h)^3.
RHO_CRIT = 2.775e11
#: Halos of fewer particles are not counted (FoF's usual floor: smaller groups are mostly noise).
MIN_PARTICLES = 20
DELTA_C = 1.686


def read_fields(path: Path) -> tuple[dict, dict]:
    """The file's attributes and its fields in physical units: ``rho_dm``, ``rho_gas`` (mean-density
    units), ``T`` (K), ``v_dm``, ``v_gas`` (3, L, L, L; km/s), float64."""
    with h5py.File(path, "r") as f:
        attrs = dict(f.attrs)
        nb, hy = f["Nbody"][...].astype(np.float64), f["Hydro"][...].astype(np.float64)
    ds, ts, vs = attrs["density_scale"], attrs["temperature_scale"], attrs["velocity_scale_km_s"]
    fields = {
        "rho_dm": np.exp(ds * nb[0]),
        "v_dm": vs * nb[1:4],
        "rho_gas": np.exp(ds * hy[0]),
        "T": attrs["igm_T0_K"] * np.exp(ts * hy[1]),
        "v_gas": vs * hy[2:5],
    }
    return attrs, fields


def run_particles(size: int, box: float, z: float, seed: int, cosmo) -> tuple[np.ndarray, np.ndarray, float]:
    """The volume's N-body again, as :func:`shared_data.data.cosmology.simulate` runs it: (positions
    (3, size^3) in [0, box) Mpc/h, the z = 0 linear modes (``rfftn`` layout), seconds)."""
    delta_k = linear_field.gaussian_field_k(size, box, cosmo.linear_power, np.random.default_rng(seed))
    t = time.perf_counter()
    parts = nbody.run(delta_k, size, box, z, cosmo)
    seconds = time.perf_counter() - t
    q = np.indices((size,) * 3, dtype=np.float64).reshape(3, -1) * (box / size)
    pos = np.mod(q + parts.displacement, box)
    pos[pos >= box] = 0.0  # np.mod of a tiny negative can round to box itself
    return pos, delta_k, seconds


def dm_power(pos, delta_k, size, box, z, cosmo) -> tuple[dict, np.ndarray]:
    """P(k) of the particles against CAMB's linear and HMcode P(k) and against the seed's own linear
    field times HMcode's boost (module docstring); and the particles' CIC density (mean 1)."""
    rho = nbody.cic_deposit(pos / (box / size), size)
    rho /= rho.mean()
    edges = power_edges(size, box)
    k, pk, n = cic_power(rho, box, edges)
    lin, hm = camb_power(cosmo, z, k)
    growth = cosmo.growth_factor(z)
    _, p_seed, _ = linear_field.measure_power(growth * linear_field.irfft3(delta_k, size), box, edges)
    return {
        "k": k,
        "modes": n,
        "p": pk,
        "p_lin": lin,
        "p_hmcode": hm,
        "ratio_hmcode": pk / hm,
        "ratio_lin": pk / lin,
        "ratio_matched": (pk / p_seed) / (hm / lin),
    }, rho


def rerun_check(rho_cic: np.ndarray, rho_file: np.ndarray, box: float) -> float:
    """That the rerun is the file's N-body: the smallest cross-correlation r(k) of the particles' CIC
    density with the file's (TSC of 2^3 particles per cell) over the bins up to k_Nyquist / 4, where
    the two deposits agree (1 for the same particles; about 0 for another seed's)."""
    edges = power_edges(rho_cic.shape[0], box)
    edges = edges[edges <= edges[-1] / 4]
    _, cross, _ = linear_field.measure_cross_power(rho_cic - 1, rho_file - 1, box, edges)
    _, p_cic, _ = linear_field.measure_power(rho_cic - 1, box, edges)
    _, p_file, _ = linear_field.measure_power(rho_file - 1, box, edges)
    return float((cross / np.sqrt(p_cic * p_file)).min())


def resolved(k: np.ndarray, ratio: np.ndarray, tol: float = 0.1) -> dict:
    """Where the PM stops resolving: the last k before the ratio falls below 1 - ``tol`` for good (every
    bin above it is short by more than ``tol``), and the bins within ``tol`` of 1."""
    short = ratio < 1 - tol
    kept = np.flatnonzero(~short)
    first_short = kept[-1] + 1 if kept.size else 0
    return {
        "k_resolved": float(k[first_short - 1]) if first_short > 0 else 0.0,
        "k_within": [float(x) for x, ok in zip(k, np.abs(ratio - 1) <= tol) if ok],
    }


def density_pdf(rho: np.ndarray, edges: np.ndarray) -> dict:
    """Volume-weighted PDF of log10 rho (per dex) and its summary numbers."""
    log_rho = np.log10(np.maximum(rho, 1e-30)).ravel()
    hist, _ = np.histogram(log_rho, edges, density=True)
    return {
        "pdf": hist,
        "std_log10": float(log_rho.std()),
        "percentiles_1_50_99": np.percentile(rho, [1, 50, 99]).tolist(),
        "min": float(rho.min()),
        "max": float(rho.max()),
        "volume_above_10": float((rho > 10).mean()),
        "volume_above_100": float((rho > 100).mean()),
    }


def friends_of_friends(pos: np.ndarray, box: float, link: float) -> np.ndarray:
    """Particle counts of the friends-of-friends groups of ``pos`` (3, n) in a periodic ``box`` with
    linking length ``link`` (Mpc/h), largest first (Davis et al. 1985)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    n = pos.shape[1]
    pairs = cKDTree(pos.T, boxsize=box).query_pairs(link, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return np.sort(np.bincount(labels))[::-1]


def sigma_of_mass(masses: np.ndarray, cosmo, z: float, modes: tuple | None = None) -> np.ndarray:
    """sigma(M) of the linear field at ``z`` in top-hat spheres of mass ``masses`` (M_sun/h): over all k,
    or over the ``modes`` (size, box) of a periodic grid: the mean of P W^2 over its non-zero modes."""
    radius = (3 * masses / (4 * np.pi * cosmo.Omega_m * RHO_CRIT)) ** (1 / 3)
    growth = cosmo.growth_factor(z)
    if modes is None:
        return growth * np.array([cosmo.sigma_r(r) for r in radius])
    size, box = modes
    kx, ky, kz = linear_field.wavenumbers(size, box)
    k = np.sqrt(kx**2 + ky**2 + kz**2)
    # the rfftn half-space stands for its mirror too, but for the kz = 0 and Nyquist planes
    twice = np.broadcast_to(np.where((kz > 0) & (kz < kz.max()), 2.0, 1.0), k.shape)
    k, twice = k[k > 0], twice[k > 0]
    pk = cosmo.linear_power(k)
    out = []
    for r in radius:
        x = k * r
        w = 3 * (np.sin(x) - x * np.cos(x)) / x**3
        out.append(np.sqrt((twice * pk * w**2).sum() / box**3))
    return growth * np.array(out)


def sheth_tormen_f(nu: np.ndarray) -> np.ndarray:
    """Sheth & Tormen's (1999) multiplicity function f(nu) = dF / d ln nu, nu = delta_c / sigma: the
    mass fraction in halos per ln nu, normalised so that it integrates to 1."""
    a, p, amp = 0.707, 0.3, 0.3222
    return amp * np.sqrt(2 * a / np.pi) * (1 + (a * nu**2) ** -p) * nu * np.exp(-a * nu**2 / 2)


def sheth_tormen(masses: np.ndarray, cosmo, z: float, modes: tuple | None = None) -> np.ndarray:
    """Sheth & Tormen (1999) dn/dlog10 M in (Mpc/h)^-3 of the cosmology's sigma(M)
    (:func:`sigma_of_mass`): rho_m / M f(nu) |d ln sigma / d ln M| ln 10."""
    sigma = sigma_of_mass(masses, cosmo, z, modes)
    slope = np.abs(np.gradient(np.log(sigma), np.log(masses)))
    return cosmo.Omega_m * RHO_CRIT / masses * sheth_tormen_f(DELTA_C / sigma) * slope * np.log(10)


def colossus_fof(masses: np.ndarray, cosmo, z: float) -> np.ndarray | None:
    """colossus's Watson et al. (2013) FoF mass function, dn/dlog10 M in (Mpc/h)^-3, or None without
    colossus (its own Eisenstein & Hu spectrum at the same sigma_8)."""
    try:
        from colossus.cosmology import cosmology as ccosmo
        from colossus.lss import mass_function
    except ImportError:
        return None
    params = {"flat": True, "H0": 100 * cosmo.h, "Om0": cosmo.Omega_m, "Ob0": cosmo.Omega_b}
    ccosmo.setCosmology("dlas", {**params, "sigma8": cosmo.sigma8, "ns": cosmo.n_s})
    return mass_function.massFunction(masses, z, mdef="fof", model="watson13", q_out="dndlnM") * np.log(10)


def halo_mass_function(counts: np.ndarray, size: int, box: float, cosmo, z: float) -> dict:
    """The FoF mass function in 0.25 dex bins from :data:`MIN_PARTICLES` particles, with Poisson errors,
    beside the references of :func:`sheth_tormen` and :func:`colossus_fof`."""
    m_particle = cosmo.Omega_m * RHO_CRIT * (box / size) ** 3
    masses = counts[counts >= MIN_PARTICLES] * m_particle
    edges = 10 ** np.arange(np.log10(MIN_PARTICLES * m_particle), np.log10(max(masses.max(), 1.0)) + 0.25, 0.25)
    n, _ = np.histogram(masses, edges)
    centres = np.sqrt(edges[1:] * edges[:-1])
    per = 1 / (box**3 * 0.25)
    fine = np.geomspace(edges[0], edges[-1], 60)
    out = {
        "particle_mass": m_particle,
        "halos": int(masses.size),
        "largest_particles": int(counts[0]),
        "largest_mass": float(counts[0] * m_particle),
        "m": centres,
        "count": n,
        "dn_dlog10m": n * per,
        "error": np.sqrt(n) * per,
        "st": sheth_tormen(centres, cosmo, z),
        "st_box": sheth_tormen(centres, cosmo, z, (size, box)),
        "fine_m": fine,
        "fine_st": sheth_tormen(fine, cosmo, z),
        "fine_st_box": sheth_tormen(fine, cosmo, z, (size, box)),
    }
    watson = colossus_fof(centres, cosmo, z)
    if watson is not None:
        out["watson13"] = watson
        out["fine_watson13"] = colossus_fof(fine, cosmo, z)
    return out


def scatter_at_fixed_density(rho: np.ndarray, t: np.ndarray, width: float = 0.1) -> list[dict]:
    """Standard deviation of log10 T in bins of ``width`` dex of log10 rho, bins of at least 100 voxels."""
    log_rho, log_t = np.log10(rho).ravel(), np.log10(t).ravel()
    edges = np.arange(np.floor(log_rho.min() / width) * width, log_rho.max() + width, width)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (log_rho >= lo) & (log_rho < hi)
        if sel.sum() >= 100:
            out.append({"log10_rho": [round(lo, 2), round(hi, 2)], "voxels": int(sel.sum()), "std": log_t[sel].std()})
    return out


def gas_power(f: dict, box: float, t0: float, gamma: float) -> dict:
    """P(k) of each gas field over the dark matter's counterpart, in the study's k bins: density
    (rho - 1), temperature (T / <T> - 1 against T0 rho_dm^(gamma - 1), likewise), velocity (summed
    over components)."""
    size = f["rho_dm"].shape[0]
    edges = power_edges(size, box)

    def power(x):
        return linear_field.measure_power(x, box, edges)

    k, p_dm, n = power(f["rho_dm"] - 1)
    t_dm = t0 * f["rho_dm"] ** (gamma - 1)
    out = {"k": k, "modes": n}
    out["density"] = power(f["rho_gas"] - 1)[1] / p_dm
    out["temperature"] = power(f["T"] / f["T"].mean() - 1)[1] / power(t_dm / t_dm.mean() - 1)[1]
    out["velocity"] = sum(power(v)[1] for v in f["v_gas"]) / sum(power(v)[1] for v in f["v_dm"])
    return out


def phase_diagram(rho: np.ndarray, t: np.ndarray) -> dict:
    """The mass-weighted 2-D histogram of log10 rho_gas against log10 T, and the hot gas's share."""
    rho_edges, t_edges = np.linspace(-1.5, 2.0, 71), np.linspace(3.0, 8.0, 101)
    hist, _, _ = np.histogram2d(np.log10(rho).ravel(), np.log10(t).ravel(), (rho_edges, t_edges), weights=rho.ravel())
    mass = rho.sum()
    return {
        "rho_edges": rho_edges,
        "t_edges": t_edges,
        "mass": hist / mass,
        "mass_above_1e5K": float(rho[t > 1e5].sum() / mass),
        "mass_above_1e7K": float(rho[t > 1e7].sum() / mass),
        "volume_above_1e5K": float((t > 1e5).mean()),
        "t_max": float(t.max()),
    }


def figure(path: Path, f: dict, box: float, power: dict, gas: dict, pdfs: dict, hmf: dict, phase: dict, title: str):
    """The study's figure (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 4, figsize=(20, 9.5))
    mid, extent = f["rho_dm"].shape[0] // 2, (0, box, 0, box)
    for a, (name, x, cmap, lim) in zip(
        ax[0, :3],
        (
            ("dark matter log10 rho", np.log10(f["rho_dm"][:, :, mid]), "magma", (-1, 2.5)),
            ("gas log10 rho", np.log10(f["rho_gas"][:, :, mid]), "viridis", (-1, 1.3)),
            ("gas log10 T [K]", np.log10(f["T"][:, :, mid]), "inferno", (3.5, 7)),
        ),
    ):
        im = a.imshow(x.T, origin="lower", extent=extent, cmap=cmap, vmin=lim[0], vmax=lim[1])
        a.set(title=f"{name}, z slice {mid}", xlabel="x [Mpc/h]", ylabel="y [Mpc/h]")
        fig.colorbar(im, ax=a, shrink=0.8)
    a = ax[0, 3]
    curves = (("ratio_hmcode", "P / P_HMcode"), ("ratio_matched", "realisation-matched"), ("ratio_lin", "P / P_lin"))
    for key, label in curves:
        a.semilogx(power["k"], power[key], "o-", ms=3, label=label)
    a.axhspan(0.9, 1.1, color="0.85")
    a.axhline(1, color="k", lw=0.5)
    a.set(title="dark matter P(k) against CAMB", xlabel="k [h/Mpc]", ylim=(0, 3))
    a.legend()
    a = ax[1, 0]
    curves = (("density", "gas density / DM"), ("temperature", "T / T0 rho_dm^(g-1)"), ("velocity", "v_gas / v_dm"))
    for key, label in curves:
        a.loglog(gas["k"], gas[key], "o-", ms=3, label=label)
    a.axhline(1, color="k", lw=0.5)
    a.set(title="gas P(k) over the dark matter's", xlabel="k [h/Mpc]")
    a.legend()
    a = ax[1, 1]
    centres = 0.5 * (pdfs["edges"][1:] + pdfs["edges"][:-1])
    for key in ("dark_matter", "gas"):
        a.semilogy(centres, pdfs[key]["pdf"], label=key.replace("_", " "))
    a.set(title="one-point PDF", xlabel="log10 rho / <rho>", ylabel="PDF per dex", ylim=(1e-6, 10))
    a.legend()
    a = ax[1, 2]
    ok = hmf["count"] > 0
    label = f"FoF b=0.2 ({hmf['halos']} halos)"
    a.errorbar(hmf["m"][ok], hmf["dn_dlog10m"][ok], hmf["error"][ok], fmt="o", label=label)
    a.loglog(hmf["fine_m"], hmf["fine_st"], label="Sheth-Tormen, CAMB sigma(M)")
    a.loglog(hmf["fine_m"], hmf["fine_st_box"], "--", label="Sheth-Tormen, the box's modes")
    if "fine_watson13" in hmf:
        a.loglog(hmf["fine_m"], hmf["fine_watson13"], ":", label="Watson+13 FoF (colossus)")
    a.set(title="halo mass function", xlabel="M [M_sun/h]", ylabel="dn/dlog10 M [(Mpc/h)^-3]")
    a.legend(fontsize=8)
    a = ax[1, 3]
    im = a.pcolormesh(
        phase["rho_edges"], phase["t_edges"], np.log10(np.maximum(phase["mass"], 1e-7)).T, cmap="cividis", vmin=-6
    )
    a.set(title="gas phase diagram (log10 mass fraction)", xlabel="log10 rho_gas / <rho>", ylabel="log10 T [K]")
    fig.colorbar(im, ax=a, shrink=0.8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def jsonable(x):
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, float | np.floating):
        return float(f"{float(x):.5g}")
    if isinstance(x, np.integer):
        return int(x)
    return x


def table(r: dict) -> str:
    """The numbers of the README as text."""
    p, g, h, ph = r["dm_power"], r["gas_power"], r["halos"], r["phase"]
    lines = [r["title"], "", "k h/Mpc | modes | P/P_HMcode | matched | P/P_lin | gas rho | gas T | gas v"]
    for i, k in enumerate(p["k"]):
        row = (k, p["modes"][i], p["ratio_hmcode"][i], p["ratio_matched"][i], p["ratio_lin"][i])
        row += (g["density"][i], g["temperature"][i], g["velocity"][i])
        lines.append("%7.2f | %6d | %.3f | %.3f | %.2f | %.3g | %.3g | %.3g" % row)
    w = r["within_10pct"]
    lines += [
        f"below 0.9 of HMcode from the bin after k = {w['hmcode']['k_resolved']} h/Mpc on (realisation-matched: "
        f"after {w['matched']['k_resolved']}); within 10% at k = {w['hmcode']['k_within']} "
        f"(matched: {w['matched']['k_within']})",
        "",
        "PDF: " + "; ".join(f"{n}: {d}" for n, d in r["pdf_summary"].items()),
        "",
        f"FoF halos (>= {MIN_PARTICLES} particles of {h['particle_mass']:.3g} M_sun/h): {h['halos']}, the largest "
        f"{h['largest_particles']} particles ({h['largest_mass']:.3g} M_sun/h); {r['fof_seconds']} s",
        "M M_sun/h | halos | dn/dlog10M | ST | ST (box modes) | Watson13 (colossus)",
    ]
    for i, m in enumerate(h["m"]):
        w = h["watson13"][i] if "watson13" in h else float("nan")
        row = (m, h["count"][i], h["dn_dlog10m"][i], h["st"][i], h["st_box"][i], w)
        lines.append("%.3g | %d | %.3g | %.3g | %.3g | %.3g" % row)
    hot = f"gas mass above 1e5 K {ph['mass_above_1e5K']}, above 1e7 K {ph['mass_above_1e7K']}, T max {ph['t_max']}"
    lines += ["", hot]
    lines += ["scatter of log10 T at fixed gas density (0.1 dex bins, >= 100 voxels):"]
    lines += [f"  {s['log10_rho']}: {s['std']} dex ({s['voxels']} voxels)" for s in r["t_scatter"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--volume", default="data/train_128.h5")
    p.add_argument("--size", type=int, default=128, help="grid side if --volume must be generated")
    p.add_argument("--seed", type=int, default=1, help="seed if --volume must be generated")
    p.add_argument("--link", type=float, default=0.2, help="FoF linking length in mean particle spacings")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args()
    path = Path(a.volume)
    if not path.exists():
        generate.main(["--out", str(path), "--size", str(a.size), "--seed", str(a.seed)])
    attrs, f = read_fields(path)
    if attrs.get("dm") != "nbody":
        raise SystemExit(f"{path}: dm {attrs.get('dm')!r}, not the N-body's: nothing to rerun")
    size, box, seed = int(attrs["grid_size"]), float(attrs["box_size_mpc_h"]), int(attrs["seed"])
    z = float(attrs["redshift"])
    cosmo = cosmology.cosmology_for("nbody", sigma8=json.loads(attrs["cosmology"])["sigma8"])
    title = f"{path.name}: {attrs['generator']}, dm {attrs['dm']}, gas {attrs['gas']}, {size}^3, {box:g} Mpc/h"
    title += f", z={z:g}, seed {seed}"
    print(title, flush=True)
    pos, delta_k, nbody_seconds = run_particles(size, box, z, seed, cosmo)
    power, rho_cic = dm_power(pos, delta_k, size, box, z, cosmo)
    rerun_r = rerun_check(rho_cic, f["rho_dm"], box)
    t = time.perf_counter()
    counts = friends_of_friends(pos, box, a.link * box / size)
    fof_seconds = round(time.perf_counter() - t, 1)
    del pos
    hmf = halo_mass_function(counts, size, box, cosmo, z)
    pdf_edges = np.linspace(-2.5, 3.0, 56)
    pdfs = {"edges": pdf_edges, "dark_matter": density_pdf(f["rho_dm"], pdf_edges)}
    pdfs["gas"] = density_pdf(f["rho_gas"], pdf_edges)
    gas = gas_power(f, box, attrs["igm_T0_K"], attrs["igm_gamma"])
    phase = phase_diagram(f["rho_gas"], f["T"])
    result = {
        "title": title,
        "volume": str(path),
        "attrs": {k: attrs[k] for k in ("generator", "dm", "gas", "spectrum", "grid_size", "box_size_mpc_h", "seed")},
        "nbody_seconds": round(nbody_seconds, 1),
        "rerun_r_min": rerun_r,
        "fof_seconds": fof_seconds,
        "dm_power": power,
        "within_10pct": {key: resolved(power["k"], power[f"ratio_{key}"]) for key in ("hmcode", "matched")},
        "pdf": pdfs,
        "pdf_summary": {n: {k: v for k, v in pdfs[n].items() if k != "pdf"} for n in ("dark_matter", "gas")},
        "halos": hmf,
        "gas_power": gas,
        "phase": phase,
        "t_scatter": scatter_at_fixed_density(f["rho_gas"], f["T"]),
    }
    result = jsonable(result)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{size}_seed{seed}"
    (out / f"measure_{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"table_{stem}.txt").write_text(table(result))
    figure(out / f"figure_{stem}.png", f, box, power, gas, pdfs, hmf, phase, title)
    print(table(result))


if __name__ == "__main__":
    main()
