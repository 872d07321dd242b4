"""The N-body dark matter's P(k) against CAMB's non-linear (HMcode 2020) and linear P(k) at the file's
redshift: ``PYTHONPATH=. python experiments/nbody_dm/power.py --size 128`` prints a table per k bin
and writes ``results/power_<size>_steps<n>_mesh<m>.json``. Needs camb (pip install camb)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from shared_data.data import linear_field, nbody

RESULTS = Path(__file__).with_name("results")


def camb_power(cosmo: linear_field.Cosmology, z: float, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CAMB's linear and HMcode-2020 non-linear total-matter P(k) at ``z``, (Mpc/h)^3 at ``k`` h/Mpc,
    normalised to the cosmology's sigma_8 at z = 0 (A_s rescaled)."""
    import camb

    pars = camb.CAMBparams()
    h = cosmo.h
    pars.set_cosmology(H0=100 * h, ombh2=cosmo.Omega_b * h**2, omch2=(cosmo.Omega_m - cosmo.Omega_b) * h**2, mnu=0.0)
    pars.InitPower.set_params(As=2e-9, ns=cosmo.n_s)
    pars.set_matter_power(redshifts=[z, 0.0], kmax=2 * k.max() * h)
    s8 = camb.get_results(pars).get_sigma8_0()
    pars.InitPower.set_params(As=2e-9 * (cosmo.sigma8 / s8) ** 2, ns=cosmo.n_s)
    pars.NonLinear = camb.model.NonLinear_both
    pars.NonLinearModel.set_params(halofit_version="mead2020")
    res = camb.get_results(pars)
    out = []
    for nonlinear in (False, True):
        interp = res.get_matter_power_interpolator(nonlinear=nonlinear, hubble_units=True, k_hunit=True)
        out.append(interp.P(z, k))
    return out[0], out[1]


def dm_density(size: int, box: float, z: float, seed: int, cosmo, steps: int, mesh_factor: int):
    """(rho (size^3, CIC of the particles, mean 1), seconds of the N-body)."""
    dk = linear_field.gaussian_field_k(size, box, cosmo.linear_power, np.random.default_rng(seed))
    t = time.perf_counter()
    parts = nbody.run(dk, size, box, z, cosmo, steps=steps, mesh_factor=mesh_factor)
    seconds = time.perf_counter() - t
    q = np.indices((size,) * 3, dtype=np.float64).reshape(3, -1) * (box / size)
    rho = nbody.cic_deposit(((q + parts.displacement) % box) / (box / size), size)
    return rho / rho.mean(), seconds


def power_edges(size: int, box: float) -> np.ndarray:
    """The 14 logarithmic k bins of this study, from the fundamental mode to k_Nyquist (h/Mpc)."""
    return np.geomspace(2 * np.pi / box, np.pi * size / box, 15)


def cic_power(rho: np.ndarray, box: float, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(k, P(k), modes) of the CIC-deposited density ``rho`` (mean 1) with the CIC window divided out:
    the measured P over the mean of the window^2 in each bin."""
    size = rho.shape[0]
    k, pk, n = linear_field.measure_power(rho - 1, box, edges)
    kx, ky, kz = linear_field.wavenumbers(size, box)
    cell = box / size
    w2 = (np.sinc(kx * cell / (2 * np.pi)) * np.sinc(ky * cell / (2 * np.pi)) * np.sinc(kz * cell / (2 * np.pi))) ** 4
    kk = np.sqrt(kx**2 + ky**2 + kz**2)
    idx = np.digitize(kk.ravel(), edges) - 1
    win = np.array([w2.ravel()[idx == i].mean() for i in range(len(edges) - 1)])
    return k, pk / win, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--box", type=float, default=None)
    p.add_argument("--z", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=nbody.STEPS)
    p.add_argument("--mesh_factor", type=int, default=nbody.MESH_FACTOR)
    a = p.parse_args()
    box = a.box or 0.25 * a.size
    cosmo = linear_field.Cosmology(spectrum="camb")
    rho, seconds = dm_density(a.size, box, a.z, a.seed, cosmo, a.steps, a.mesh_factor)
    edges = power_edges(a.size, box)
    k, pk_deconv, n = cic_power(rho, box, edges)
    lin, nl = camb_power(cosmo, a.z, k)
    print(f"N-body {a.size}^3, box {box} Mpc/h, z={a.z}, {a.steps} steps, mesh x{a.mesh_factor}: {seconds:.1f} s")
    print("  k h/Mpc   modes   P/P_nl(HMcode)  P/P_lin   (deconvolved CIC)")
    for row in zip(k, n, pk_deconv / nl, pk_deconv / lin):
        print("  %7.3f %7d   %6.3f          %6.3f" % row)
    rows = [
        dict(k=float(a), modes=float(b), p=float(c), p_hmcode=float(d), p_lin=float(e))
        for a, b, c, d, e in zip(k, n, pk_deconv, nl, lin)
    ]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"power_{a.size}_steps{a.steps}_mesh{a.mesh_factor}.json"
    out.write_text(json.dumps(dict(args=vars(a), seconds=seconds, rho_max=float(rho.max()), rows=rows), indent=1))


if __name__ == "__main__":
    main()
