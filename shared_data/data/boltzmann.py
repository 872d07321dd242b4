"""The linear matter power spectrum from a Boltzmann code (CAMB; Lewis, Challinor & Lasenby 2000,
ApJ 538, 473), computed once per cosmology and cached as a table.

Units: wavenumbers in h/Mpc, P(k) in (Mpc/h)^3, at z = 0.

CAMB's total-matter P(k) (cold dark matter and baryons, massless neutrinos) is computed at the
parameters of :class:`shared_data.data.linear_field.Cosmology` other than sigma_8 (Omega_m, Omega_b, h,
n_s; A_s = 2e-9, which normalisation removes) and stored as its shape: the table depends on those four
numbers only, and :meth:`~shared_data.data.linear_field.Cosmology.linear_power` scales it to sigma_8.

A table is found, in order, in the package (:data:`PACKAGED`, the default cosmology's, so a fresh
machine needs no CAMB for the default data), in the user's cache (``$DLAS_COSMO_CACHE``, else
``$XDG_CACHE_HOME/dlas_cosmo``, else ``~/.cache/dlas_cosmo``; written atomically), or is computed with
``camb`` (``pip install camb``, a binary wheel) and cached there. Between the table's points P is
interpolated linearly in log k - log P; beyond them it continues as a power law of the end slope.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from shared_data.core.errors import UserError
from shared_data.core.files import atomic_path

#: The folder of the tables that ship with the package.
PACKAGED = Path(__file__).with_name("linear_power")
#: CAMB's table: k from K_MIN to K_MAX h/Mpc, log-spaced.
K_MIN, K_MAX, N_POINTS = 1e-4, 100.0, 500


def table_name(omega_m: float, omega_b: float, h: float, n_s: float) -> str:
    """File name of the table of one cosmology: the parameters, exactly (``repr`` of each float)."""
    return f"camb_Om{omega_m!r}_Ob{omega_b!r}_h{h!r}_ns{n_s!r}.txt"


def cache_dir() -> Path:
    """The user's cache folder for tables (module docstring)."""
    if os.environ.get("DLAS_COSMO_CACHE"):
        return Path(os.environ["DLAS_COSMO_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dlas_cosmo"


def camb_table(omega_m: float, omega_b: float, h: float, n_s: float) -> tuple[np.ndarray, np.ndarray]:
    """CAMB's linear total-matter P(k) at z = 0 for A_s = 2e-9: ``(k, P)`` float64 (N_POINTS,), k in h/Mpc.

    Raises:
        UserError: ``camb`` is not installed.
    """
    try:
        import camb
    except ImportError as e:
        raise UserError(
            f"the CAMB linear spectrum of this cosmology is not cached ({table_name(omega_m, omega_b, h, n_s)}): "
            "install camb (pip install camb) or use --spectrum bbks"
        ) from e
    pars = camb.CAMBparams()
    pars.set_cosmology(H0=100 * h, ombh2=omega_b * h**2, omch2=(omega_m - omega_b) * h**2, mnu=0.0, omk=0.0)
    pars.InitPower.set_params(As=2e-9, ns=n_s)
    pars.set_matter_power(redshifts=[0.0], kmax=1.2 * K_MAX * h, nonlinear=False)
    results = camb.get_results(pars)
    k, _, pk = results.get_matter_power_spectrum(minkh=K_MIN, maxkh=K_MAX, npoints=N_POINTS)
    return np.asarray(k, np.float64), np.asarray(pk[0], np.float64)


@functools.cache
def load_table(omega_m: float, omega_b: float, h: float, n_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The table of one cosmology, from the package, the cache, or CAMB (then cached): ``(k, P)``."""
    name = table_name(omega_m, omega_b, h, n_s)
    for folder in (PACKAGED, cache_dir()):
        if (folder / name).is_file():
            k, p = np.loadtxt(folder / name, unpack=True)
            return k, p
    k, p = camb_table(omega_m, omega_b, h, n_s)
    write_table(cache_dir() / name, k, p)
    return k, p


def write_table(path: Path, k: np.ndarray, p: np.ndarray) -> None:
    """Write a table as two text columns (k h/Mpc, P (Mpc/h)^3), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        np.savetxt(tmp, np.stack([k, p], 1), fmt="%.17e", header="k [h/Mpc]  P(k) [(Mpc/h)^3], CAMB, z=0, A_s=2e-9")


def interpolate(k_table: np.ndarray, p_table: np.ndarray, k: np.ndarray) -> np.ndarray:
    """P at ``k`` (any shape; 0 where k <= 0): log-log linear inside the table, power laws of the end
    slopes outside."""
    k = np.asarray(k, np.float64)
    lk, lp = np.log(k_table), np.log(p_table)
    x = np.log(np.where(k > 0, k, k_table[0]))
    out = np.interp(x, lk, lp)
    lo_slope = (lp[1] - lp[0]) / (lk[1] - lk[0])
    hi_slope = (lp[-1] - lp[-2]) / (lk[-1] - lk[-2])
    out = np.where(x < lk[0], lp[0] + lo_slope * (x - lk[0]), out)
    out = np.where(x > lk[-1], lp[-1] + hi_slope * (x - lk[-1]), out)
    return np.where(k > 0, np.exp(out), 0.0)
