"""Physics of the dataset generator: a LambdaCDM-like linear field, Zel'dovich dark matter, and gas.

Units: comoving lengths in Mpc/h, wavenumbers in h/Mpc, velocities in km/s (peculiar), temperature
in K, densities in units of the cosmic mean (rho / rho_mean = 1 + delta).

1. **Linear power spectrum** P(k) = A k^n_s T(k)^2 with the BBKS transfer function (Bardeen, Bond,
   Kaiser & Szalay 1986, ApJ 304, 15, eq. G3) and Sugiyama's (1995, ApJS 100, 281) baryon-corrected
   shape parameter Gamma = Omega_m h exp(-Omega_b - sqrt(2h) Omega_b / Omega_m); A is fixed by
   sigma_8 (top-hat of 8 Mpc/h).
2. **Gaussian random field**: unit white noise, Fourier-transformed and scaled so that the field's
   power spectrum is P(k) for the discrete estimator P_hat(k) = V / N^6 |FFT(delta)(k)|^2.
3. **Growth**: D(z) from the Carroll, Press & Turner (1992, ARA&A 30, 499, eq. 29) fit;
   growth rate f = Omega_m(z)^0.55 (Linder 2005, PRD 72, 043529).
4. **Zel'dovich approximation** (Zel'dovich 1970): particles on the grid move by
   Psi = D(z) grad(-nabla^-2 delta), i.e. Psi(k) = i k / k^2 delta(k) D(z), truncated by a Gaussian at the
   non-linear scale k_nl where the linear variance reaches one (Coles, Melott & Shandarin 1993,
   MNRAS 260, 765); velocity v = a H(z) f Psi. Each cell carries 2^3 particles of mass 1/8 at
   sub-lattice offsets of +-1/4 cell (the displacement there is the Fourier-shifted field); density
   and mass-weighted velocity come from a triangular-shaped-cloud (TSC) deposit (Hockney & Eastwood
   1988, sec. 5-2-3). One particle per cell with a cloud-in-cell deposit leaves the lattice visible
   in voids, where particles are more than a cell apart (a plaid pattern and empty cells);
   ``experiments/generator_lattice`` measures the schemes. Cells no particle reaches take the linear
   velocity.
5. **Gas**: the baryons follow the dark matter smoothed on the Jeans (filtering) scale,
   delta_gas(k) = delta_dm(k) / (1 + k^2 / k_J^2) (Hui & Gnedin 1997, MNRAS 292, 27; Gnedin & Hui
   1998), applied to the density and to the velocity field.
6. **Temperature**: the IGM temperature-density relation T = T0 (1 + delta_gas)^(gamma - 1)
   (Hui & Gnedin 1997), T0 = 10^4 K and gamma = 1.6 by default.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import multiprocessing
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Cosmology:
    """Flat LambdaCDM parameters (Planck-2018-like defaults)."""

    Omega_m: float = 0.31
    Omega_b: float = 0.049
    h: float = 0.68
    n_s: float = 0.965
    sigma8: float = 0.81

    @property
    def Omega_L(self) -> float:
        return 1.0 - self.Omega_m

    def E(self, z: float) -> float:
        """H(z) / H0 for flat LambdaCDM (radiation neglected)."""
        return float(np.sqrt(self.Omega_m * (1 + z) ** 3 + self.Omega_L))

    def hubble(self, z: float) -> float:
        """H(z) in km/s per Mpc/h (= 100 E(z))."""
        return 100.0 * self.E(z)

    def omega_m_z(self, z: float) -> float:
        return self.Omega_m * (1 + z) ** 3 / self.E(z) ** 2

    def _cpt_g(self, z: float) -> float:
        om = self.omega_m_z(z)
        ol = self.Omega_L / self.E(z) ** 2
        return 2.5 * om / (om ** (4.0 / 7.0) - ol + (1 + om / 2) * (1 + ol / 70))

    def growth_factor(self, z: float) -> float:
        """Linear growth D(z), normalised to D(0) = 1 (Carroll, Press & Turner 1992)."""
        return self._cpt_g(z) / self._cpt_g(0.0) / (1 + z)

    def growth_rate(self, z: float) -> float:
        """f = dlnD/dlna ~= Omega_m(z)^0.55 (Linder 2005)."""
        return self.omega_m_z(z) ** 0.55

    def shape_parameter(self) -> float:
        """Gamma of Sugiyama (1995)."""
        h, om, ob = self.h, self.Omega_m, self.Omega_b
        return om * h * np.exp(-ob - np.sqrt(2 * h) * ob / om)

    def transfer(self, k: np.ndarray) -> np.ndarray:
        """BBKS transfer function T(k), k in h/Mpc (BBKS 1986 eq. G3)."""
        q = np.asarray(k, np.float64) / self.shape_parameter()
        q = np.where(q > 0, q, 1e-30)
        return (np.log1p(2.34 * q) / (2.34 * q)) * (
            1 + 3.89 * q + (16.1 * q) ** 2 + (5.46 * q) ** 3 + (6.71 * q) ** 4
        ) ** -0.25

    def _unnormalised_power(self, k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, np.float64)
        return np.where(k > 0, k**self.n_s * self.transfer(k) ** 2, 0.0)

    def sigma_r(self, radius: float, power=None) -> float:
        """RMS of the linear field in top-hat spheres of ``radius`` Mpc/h at z = 0."""
        power = self.linear_power if power is None else power
        k = np.logspace(-5, 3, 20000)
        x = k * radius
        w = 3 * (np.sin(x) - x * np.cos(x)) / x**3
        integrand = k**3 * power(k) * w**2 / (2 * np.pi**2)
        return float(np.sqrt(np.trapezoid(integrand, np.log(k))))

    def linear_power(self, k: np.ndarray) -> np.ndarray:
        """Linear matter power spectrum P(k) at z = 0 in (Mpc/h)^3, normalised to ``sigma8``."""
        amp = (self.sigma8 / self.sigma_r(8.0, self._unnormalised_power)) ** 2
        return amp * self._unnormalised_power(k)


def irfft3(fk: np.ndarray, size: int) -> np.ndarray:
    """Real ``size``^3 field of the ``rfftn``-layout modes ``fk``."""
    return np.fft.irfftn(fk, s=(size,) * 3, axes=(0, 1, 2))


def wavenumbers(size: int, box: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Angular wavenumbers (h/Mpc) of an ``rfftn`` grid of ``size``^3 cells over ``box`` Mpc/h,
    broadcastable to shape (size, size, size // 2 + 1)."""
    d = box / size
    kx = 2 * np.pi * np.fft.fftfreq(size, d)
    kz = 2 * np.pi * np.fft.rfftfreq(size, d)
    return kx[:, None, None], kx[None, :, None], kz[None, None, :]


def gaussian_field_k(size: int, box: float, power, rng: np.random.Generator) -> np.ndarray:
    """Fourier modes (``rfftn`` layout, complex128) of a Gaussian field with power spectrum ``power``.

    delta(k) = W(k) sqrt(P(k) N^3 / V) with W the FFT of unit white noise, so that
    <|delta(k)|^2> V / N^6 = P(k). The k = 0 mode is zero (mean density of the box).
    """
    noise = rng.standard_normal((size, size, size))
    wk = np.fft.rfftn(noise)
    kx, ky, kz = wavenumbers(size, box)
    k = np.sqrt(kx**2 + ky**2 + kz**2)
    amp = np.sqrt(power(k) * size**3 / box**3)
    amp[0, 0, 0] = 0.0
    return wk * amp


def measure_power(field: np.ndarray, box: float, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spherically averaged power spectrum of a real ``field`` (N^3) in a periodic ``box`` Mpc/h.

    Returns ``(k_mean, P, n_modes)`` per bin of ``bins`` (edges in h/Mpc), counting both halves
    of the ``rfftn`` plane correctly (modes with 0 < kz < Nyquist count twice). P in (Mpc/h)^3
    for the estimator P_hat(k) = V / N^6 |FFT(field)(k)|^2 (the normalisation of
    :func:`gaussian_field_k`).
    """
    return measure_cross_power(field, field, box, bins)


def measure_cross_power(
    a: np.ndarray, b: np.ndarray, box: float, bins: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spherically averaged cross power spectrum P_ab(k) = V / N^6 Re(FFT(a) conj(FFT(b))) of two
    real fields (N^3) in a periodic ``box`` Mpc/h; ``(k_mean, P_ab, n_modes)`` per bin as
    :func:`measure_power` (which is ``a = b``)."""
    size = a.shape[0]
    fa = np.fft.rfftn(a)
    fb = fa if b is a else np.fft.rfftn(b)
    p = (fa * np.conj(fb)).real * box**3 / size**6
    kx, ky, kz = wavenumbers(size, box)
    k = np.sqrt(kx**2 + ky**2 + kz**2)
    weight = np.full(k.shape, 2.0)
    weight[..., 0] = 1.0
    if size % 2 == 0:
        weight[..., -1] = 1.0
    idx = np.digitize(k.ravel(), bins) - 1
    ok = (idx >= 0) & (idx < len(bins) - 1)
    w = weight.ravel()[ok]
    n = np.bincount(idx[ok], weights=w, minlength=len(bins) - 1)
    ps = np.bincount(idx[ok], weights=w * p.ravel()[ok], minlength=len(bins) - 1)
    ks = np.bincount(idx[ok], weights=w * k.ravel()[ok], minlength=len(bins) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return ks / n, ps / n, n


def nonlinear_wavenumber(cosmo: Cosmology, z: float, k_max: float) -> float:
    """k_nl (h/Mpc) where the linear variance at z, integrated from k -> 0 up to k, reaches 1;
    ``inf`` if it stays below 1 up to ``k_max``."""
    k = np.logspace(-4, np.log10(k_max), 4000)
    delta2 = k**3 * cosmo.linear_power(k) * cosmo.growth_factor(z) ** 2 / (2 * np.pi**2)
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (delta2[1:] + delta2[:-1]) * np.diff(np.log(k)))])
    above = np.nonzero(cum >= 1.0)[0]
    return float(k[above[0]]) if len(above) else float("inf")


#: Particles per cell along each axis. A lattice of spacing d cells deposited with TSC ripples by
#: 2 |sinc(pi / d)|^3 of its mean: 1.8% in a void stretched 1.5x per axis with 2 particles per cell
#: (d = 0.75), against 34% with one particle per cell and CIC (2 sinc(pi / 1.5)^2).
PARTICLES_PER_SIDE = 2


#: Particles deposited at a time: the temporaries of a chunk stay in the processor's cache, which
#: makes the deposit about 2x faster than on whole arrays.
DEPOSIT_CHUNK = 1 << 18


def tsc_deposit(pos: np.ndarray, size: int, values: list[np.ndarray]) -> list[np.ndarray]:
    """Triangular-shaped-cloud deposit of per-particle ``values`` (each (n,)) at positions ``pos``
    (3, n) in cell units (periodic, cell i covers [i - 1/2, i + 1/2) with its centre at i) onto
    ``size``^3 grids (float64). A particle at distance d from the nearest cell centre gives that cell
    3/4 - d^2 and its two neighbours (1/2 -+ d)^2 / 2 along each axis (Hockney & Eastwood 1988,
    sec. 5-2-3); the weights sum to 1, so the deposit conserves each value's total."""
    out = [np.zeros(size**3) for _ in values]
    for start in range(0, pos.shape[1], DEPOSIT_CHUNK):
        chunk = slice(start, start + DEPOSIT_CHUNK)
        axes = []
        for x in pos[:, chunk]:
            c = np.floor(x + 0.5).astype(np.int64)
            d = x - c
            axes.append(
                (
                    ((c - 1) % size, 0.5 * (0.5 - d) ** 2),
                    (c % size, 0.75 - d**2),
                    ((c + 1) % size, 0.5 * (0.5 + d) ** 2),
                )
            )
        idx, w = [], []  # the 27 cells of each particle, in a fixed order
        for ix, wx in axes[0]:
            for iy, wy in axes[1]:
                ixy, wxy = ix * size + iy, wx * wy
                for iz, wz in axes[2]:
                    idx.append(ixy * size + iz)
                    w.append(wxy * wz)
        idx, w = np.concatenate(idx), np.concatenate(w)
        for grid, v in zip(out, values):
            # bincount sums in input order, deterministically, and ~10x faster than np.add.at
            grid += np.bincount(idx, weights=w * np.tile(v[chunk], 27), minlength=size**3)
    return [g.reshape(size, size, size) for g in out]


def jeans_filter(field: np.ndarray, box: float, k_jeans: float) -> np.ndarray:
    """Smooth a real periodic field by 1 / (1 + k^2 / k_J^2) (Hui & Gnedin 1997)."""
    size = field.shape[0]
    kx, ky, kz = wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    return irfft3(np.fft.rfftn(field) / (1 + k2 / k_jeans**2), size)


@dataclasses.dataclass(frozen=True)
class Fields:
    """Generator output before value transforms; arrays (L, L, L) float64, axes (x, y, z)."""

    delta_linear: np.ndarray  # z = 0 linear field
    rho_dm: np.ndarray  # 1 + delta_dm
    v_dm: np.ndarray  # (3, L, L, L) km/s
    rho_gas: np.ndarray  # 1 + delta_gas
    temperature: np.ndarray  # K
    v_gas: np.ndarray  # (3, L, L, L) km/s
    k_nl: float


#: The sub-lattice deposit's inputs, set by :func:`simulate` for the calls (and forked workers) it makes.
_SUBLATTICE: tuple | None = None


def _deposit_sublattice(o: tuple[float, float, float]) -> list[np.ndarray]:
    """TSC deposit of mass and momentum of the particles at sub-lattice offset ``o`` (cells): their
    displacement is the Fourier-shifted Zel'dovich field. Returns 4 (L, L, L) float64 grids."""
    psi_k, (kx, ky, kz), cell, grid, mass_each, vel_factor = _SUBLATTICE
    size = kx.shape[0]
    shift = np.exp(1j * (kx * o[0] + ky * o[1] + kz * o[2]) * cell)
    psi = np.stack([irfft3(p * shift, size) for p in psi_k]).reshape(3, -1)
    pos = (grid + np.array(o)[:, None] + psi / cell) % size
    return tsc_deposit(pos, size, [mass_each, *(mass_each * psi * vel_factor)])


def _sum_in_order(parts, totals: tuple) -> None:
    """Adds each sub-lattice's grids to ``totals`` in the order of ``parts`` (deterministic bytes)."""
    for part in parts:
        for total, p in zip(totals, part):
            total += p


def simulate(
    size: int,
    box: float,
    z: float,
    seed: int,
    cosmo: Cosmology,
    k_jeans: float,
    t0: float,
    gamma: float,
    on_stage: Callable[[str], None] = lambda stage: None,
    workers: int = 1,
) -> Fields:
    """Run the generator physics (module docstring, steps 1-6) on a ``size``^3 grid; deterministic by seed.
    ``on_stage(name)`` is called as each step starts (a 256^3 grid takes minutes). ``workers`` > 1
    deposits the particle sub-lattices in that many forked processes (each holds about
    12 x size^3 float64); the parts are summed in a fixed order, so the result does not depend on it."""
    on_stage("Gaussian random field")
    rng = np.random.default_rng(seed)
    delta_k = gaussian_field_k(size, box, cosmo.linear_power, rng)
    delta_linear = irfft3(delta_k, size)

    growth = cosmo.growth_factor(z)
    k_nyq = np.pi * size / box
    k_nl = nonlinear_wavenumber(cosmo, z, k_max=np.sqrt(3) * k_nyq)
    kx, ky, kz = wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    k2[0, 0, 0] = 1.0
    trunc = np.exp(-0.5 * k2 / k_nl**2) if np.isfinite(k_nl) else 1.0
    on_stage("Zel'dovich displacements")
    psi_k = np.stack([1j * kc / k2 * delta_k * growth * trunc for kc in (kx, ky, kz)])
    if size % 2 == 0:  # a sub-cell shift of a Nyquist-plane mode is not a real field: those modes go
        psi_k[:, size // 2] = psi_k[:, :, size // 2] = psi_k[..., -1] = 0.0
    vel_factor = cosmo.hubble(z) / (1 + z) * cosmo.growth_rate(z)  # a H f, km/s per Mpc/h

    on_stage(f"dark matter on the grid ({PARTICLES_PER_SIDE}^3 particles per cell, TSC)")
    cell = box / size
    grid = np.indices((size,) * 3, dtype=np.float64).reshape(3, -1)
    offsets = (np.arange(PARTICLES_PER_SIDE) + 0.5) / PARTICLES_PER_SIDE - 0.5  # cells, symmetric about 0
    mass_each = np.full(size**3, 1.0 / PARTICLES_PER_SIDE**3)
    global _SUBLATTICE
    _SUBLATTICE = (psi_k, (kx, ky, kz), cell, grid, mass_each, vel_factor)
    mass, px, py, pz = (np.zeros((size,) * 3) for _ in range(4))
    subs = list(itertools.product(offsets, repeat=3))
    try:
        if workers > 1:  # fork: the children read the module's _SUBLATTICE without a copy
            ctx = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(min(workers, len(subs)), mp_context=ctx) as pool:
                results = pool.map(_deposit_sublattice, subs)
                _sum_in_order(results, (mass, px, py, pz))
        else:
            _sum_in_order(map(_deposit_sublattice, subs), (mass, px, py, pz))
    finally:
        _SUBLATTICE = None
    filled = mass > 1e-6
    v_lagr = np.stack([irfft3(p, size) for p in psi_k]) * vel_factor
    v_dm = np.where(filled, np.stack([px, py, pz]) / np.where(filled, mass, 1.0), v_lagr)

    on_stage("gas: Jeans smoothing, temperature-density relation")
    rho_gas = np.maximum(jeans_filter(mass, box, k_jeans), 0.0)
    v_gas = np.stack([jeans_filter(v, box, k_jeans) for v in v_dm])
    temperature = t0 * np.maximum(rho_gas, 1e-12) ** (gamma - 1)
    return Fields(delta_linear, mass, v_dm, rho_gas, temperature, v_gas, k_nl)
