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
5. **Gas**, two models (``gas`` of :func:`simulate`):

   ``filtered`` (the linear gas): the baryons follow the dark matter smoothed on the Jeans (filtering)
   scale, delta_gas(k) = delta_dm(k) / (1 + k^2 / k_J^2) (Hui & Gnedin 1997, MNRAS 292, 27; Gnedin &
   Hui 1998, MNRAS 296, 44), applied to the density and to the velocity field, and the IGM
   temperature-density relation T = T0 (1 + delta_gas)^(gamma - 1) (Hui & Gnedin 1997), T0 = 10^4 K
   and gamma = 1.6 by default. Every gas mode is a dark-matter mode times a function of |k|.

   ``nonlinear`` (the default): the same ingredients made local and non-linear.

   a. *Where streams cross*: the Zel'dovich deformation tensor d_ij = -dPsi_i/dq_j of each fluid
      element (Lagrangian cell) has eigenvalues lambda_1 >= lambda_2 >= lambda_3; the element's
      density is 1 / prod(1 - lambda_i) and it has collapsed along its first axis (shell crossing,
      the "pancake") where lambda_1 >= 1 (Zel'dovich 1970, A&A 5, 84; Shandarin & Zel'dovich 1989,
      Rev. Mod. Phys. 61, 185). The gas responds to the dark matter smoothed on its own filtering
      scale (Gnedin & Hui 1998), so its tensor is that of the linear displacement times
      1 / (1 + k^2 / k_J^2), without the dark matter's truncation at k_nl. Eigenvalues of the
      symmetric 3x3 tensors in closed form (Smith 1961, Comm. ACM 4, 168).
   b. *Shock heating*: past shell crossing the gas cannot stream through; it meets the gas of the
      other side in a strong shock. In a plane collapse Psi = -A sin(kq)/k the caustic sits where
      lambda = A cos(kq) = 1 and the gas falls onto it at u = a H f sqrt(A^2 - 1) / k; the local
      estimate takes A = lambda_1 and for k the displacement field's characteristic wavenumber
      k_* = sqrt(<|div Psi|^2> / <|Psi|^2>) (the first spectral moment, as R_* of BBKS 1986).
      A strong shock in a gamma = 5/3 gas brings infall at u to rest with
      k_B T_s = mu m_p u^2 / 3 (Rankine-Hugoniot: compression 4, shock speed u/3, so a pre-shock
      speed 4u/3 in the shock frame and k_B T_s = 3/16 mu m_p (4u/3)^2; Zel'dovich & Raizer 1967,
      ch. I sec. 17), mu = 0.59 for ionised primordial gas.
   c. *Two-phase temperature*: every element carries the photo-heated relation
      T_ph = T0 (1 + delta_gas)^(gamma - 1) 10^(beta (s^2 - <s^2>)), whose scatter at fixed density
      follows the element's deformation history: elements of the same density reached it along
      different eigenvalues and so with different compression histories (Hui & Gnedin 1997, sec. 3,
      who integrate the thermal history along Zel'dovich trajectories). Here the history enters
      through the shear invariant s^2 = sum_i (lambda_i - mean lambda)^2, which for a Gaussian field
      is independent of the trace (the linear density) and second order in the amplitude; its
      distribution is chi-square-like, so the scatter of log T is skewed to the hot side.
      The shocked phase adds its heat: T = T_ph + <T_s>, <T_s> the mass-weighted shock temperature
      of the elements the dark matter's deposit brings into a cell (energies add), so T at fixed
      density is bimodal where shocks are (the photo-ionised and shock-heated phases of the IGM:
      Cen & Ostriker 1999, ApJ 514, 1; Valageas, Schaeffer & Silk 2002, A&A 388, 741).
   d. *Pressure smoothing that follows the temperature*: the Jeans (filtering) wavenumber scales as
      k_J(T) = k_J (T / T0)^(-1/2) (the Jeans length is proportional to the sound speed; Gnedin &
      Hui 1998). The dark-matter density and velocity are smoothed with 1 / (1 + k^2 / k_J(T)^2) at
      the local temperature (that of the ``filtered`` density with the offset and the shock heat),
      interpolated linearly in log T between filters at half-dex steps
      (:func:`adaptive_jeans_filter`): hot gas is smoother than cold gas, so density, temperature
      and velocity depart from any one filter of the dark matter.

   e. *Patchy He II reionization*: quasars reionize He II at z ~ 3-4 in bubbles tens of comoving Mpc
      across, and the photo-heating raises T0 inside them by about a factor of two before the rest
      of the volume follows (McQuinn et al. 2009, ApJ 694, 842; Lai et al. 2006, ApJ 644, 61, on the
      temperature fluctuations it leaves): the photo-heated phase's T0 varies on large scales
      independently of the density. Here T_ph carries a factor 10^m(x), m a Gaussian random field of
      its own seed with power exp(-(k R)^2), R = :data:`HE2_RADIUS_MPC_H`, scaled to a standard
      deviation of :data:`HE2_DEX` (:func:`reionization_offset`). The heating is late, so it does
      not enter the Jeans smoothing, which integrates the thermal history (Gnedin & Hui 1998).

   The elements' quantities (a-c) are computed on the Lagrangian lattice and carried to the grid by
   the dark matter's own TSC deposit (mass-weighted). At vanishing amplitude lambda -> 0, no element
   shocks, s^2 -> 0 at second order and k_J(T) -> k_J, so ``nonlinear`` returns ``filtered`` with its
   temperature times 10^m(x).
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


#: The gas models of :func:`simulate` (module docstring, step 5); the first is the default.
GAS_MODELS = ("nonlinear", "filtered")
#: Mean molecular weight of ionised primordial gas (hydrogen mass fraction 0.76, helium doubly ionised).
MU = 0.59
PROTON_MASS_KG = 1.67262192e-27
BOLTZMANN_J_K = 1.380649e-23
#: beta of the photo-heated phase's scatter: dex of log10 T per unit of the shear invariant s^2.
SHEAR_SCATTER_DEX = 0.15
#: log10(T / T0) of the Jeans filters that :func:`adaptive_jeans_filter` interpolates between.
FILTER_LOG_T = np.linspace(-1.0, 2.0, 7)
#: Patchy He II reionization (module docstring, 5e): standard deviation of log10 T0 (dex) and the
#: Gaussian smoothing radius (Mpc/h) of its field.
HE2_DEX = 0.3
HE2_RADIUS_MPC_H = 4.0


def symmetric_eigenvalues(t: np.ndarray) -> np.ndarray:
    """Eigenvalues, largest first, of real symmetric 3x3 matrices given by their components
    ``t`` = (xx, yy, zz, xy, xz, yz), each an array of any shape; returns (3, *shape) float64.

    Closed form of Smith (1961, Comm. ACM 4, 168): with q = tr/3 and p^2 = tr((A - q I)^2) / 6, the
    eigenvalues are q + 2 p cos(phi + 2 pi j / 3), 3 phi = arccos(det((A - q I) / p) / 2). Where two
    eigenvalues coincide the arccos near +-1 limits the accuracy to about sqrt(eps) p.
    """
    xx, yy, zz, xy, xz, yz = (np.asarray(c, np.float64) for c in t)
    q = (xx + yy + zz) / 3
    dx, dy, dz = xx - q, yy - q, zz - q
    p = np.sqrt((dx**2 + dy**2 + dz**2 + 2 * (xy**2 + xz**2 + yz**2)) / 6)
    ps = np.where(p > 0, p, 1.0)
    det = dx * (dy * dz - yz**2) - xy * (xy * dz - yz * xz) + xz * (xy * yz - dy * xz)
    phi = np.arccos(np.clip(det / (2 * ps**3), -1.0, 1.0)) / 3
    first = q + 2 * p * np.cos(phi)
    third = q + 2 * p * np.cos(phi + 2 * np.pi / 3)
    return np.stack([first, 3 * q - first - third, third])


def deformation_eigenvalues(psi_k: np.ndarray, size: int, box: float) -> np.ndarray:
    """Eigenvalues lambda_1 >= lambda_2 >= lambda_3 of the Zel'dovich deformation tensor
    d_ij = -dPsi_i/dq_j (module docstring, 5a) on the Lagrangian grid: (3, L, L, L) float64 of the
    displacement modes ``psi_k`` (3, rfftn layout; Mpc/h) of a ``size``^3 grid over ``box`` Mpc/h.
    lambda_1 >= 1 marks shell crossing along the first axis."""
    kvec = wavenumbers(size, box)
    pairs = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))
    tensor = [irfft3(-1j * kvec[j] * psi_k[i], size) for i, j in pairs]
    return symmetric_eigenvalues(tensor)


def characteristic_wavenumber(psi_k: np.ndarray, size: int, box: float) -> float:
    """k_* = sqrt(<|div Psi|^2> / <|Psi|^2>) in h/Mpc of the displacement modes ``psi_k`` (3, rfftn
    layout) of a ``size``^3 grid over ``box`` Mpc/h: the wavenumber of a plane wave, and for a field
    the first spectral moment of its divergence (the 1/R_* of BBKS 1986, sec. 4)."""
    kx, ky, kz = wavenumbers(size, box)
    weight = np.full(kz.shape, 2.0)  # modes with 0 < kz < Nyquist stand for their conjugates too
    weight[..., 0] = 1.0
    if size % 2 == 0:
        weight[..., -1] = 1.0
    div = np.abs(kx * psi_k[0] + ky * psi_k[1] + kz * psi_k[2]) ** 2
    norm = (np.abs(psi_k) ** 2).sum(0)
    return float(np.sqrt((weight * div).sum() / (weight * norm).sum()))


def shock_temperature(lambda_1: np.ndarray, vel_factor: float, k_star: float) -> np.ndarray:
    """Post-shock temperature (K) of fluid elements with first deformation eigenvalue ``lambda_1``:
    0 before shell crossing (lambda_1 < 1), else k_B T_s = mu m_p u^2 / 3 for the infall speed
    u = ``vel_factor`` sqrt(lambda_1^2 - 1) / ``k_star`` (km/s; ``vel_factor`` = a H f in km/s per
    Mpc/h, ``k_star`` in h/Mpc), the strong-shock (Rankine-Hugoniot) temperature of gas brought to
    rest (module docstring, 5b)."""
    u = vel_factor * np.sqrt(np.maximum(np.asarray(lambda_1, np.float64) ** 2 - 1.0, 0.0)) / k_star
    return MU * PROTON_MASS_KG * (1e3 * u) ** 2 / (3 * BOLTZMANN_J_K)


def reionization_offset(size: int, box: float, seed: int) -> np.ndarray:
    """m(x) of the module docstring (5e): the log10 T0 offset (dex) of patchy He II reionization on a
    ``size``^3 grid over ``box`` Mpc/h, float64 (L, L, L), mean 0 and standard deviation
    :data:`HE2_DEX`: a Gaussian random field with power exp(-(k R)^2), R = :data:`HE2_RADIUS_MPC_H`,
    drawn from its own generator (seeds ``(seed, 2)``), so the dark matter of ``seed`` is unchanged."""
    rng = np.random.default_rng((seed, 2))
    g = irfft3(gaussian_field_k(size, box, lambda k: np.exp(-((k * HE2_RADIUS_MPC_H) ** 2)), rng), size)
    g = g - g.mean()
    return HE2_DEX * g / g.std()


def shear_invariant(eigenvalues: np.ndarray) -> np.ndarray:
    """s^2 = sum_i (lambda_i - mean lambda)^2 of eigenvalues (3, ...): the squared traceless part."""
    return ((eigenvalues - eigenvalues.mean(0)) ** 2).sum(0)


def adaptive_jeans_filter(fields: list[np.ndarray], box: float, k_jeans: float, log_t: np.ndarray) -> list[np.ndarray]:
    """Smooth each real periodic field (L, L, L) by 1 / (1 + k^2 / k_J(T)^2) with the local
    k_J(T) = ``k_jeans`` 10^(-log_t / 2), ``log_t`` = log10(T / T0) per voxel (module docstring, 5d):
    the fields filtered at the wavenumbers of :data:`FILTER_LOG_T`, mixed per voxel with weights
    linear in log T (hat functions, summing to 1; ``log_t`` clipped to the range). Where ``log_t`` is
    0 the result is :func:`jeans_filter`'s. Returns float64 arrays in the order of ``fields``."""
    size = fields[0].shape[0]
    kx, ky, kz = wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    spectra = [np.fft.rfftn(f) for f in fields]
    u = np.clip(log_t, FILTER_LOG_T[0], FILTER_LOG_T[-1])
    step = FILTER_LOG_T[1] - FILTER_LOG_T[0]
    out = [np.zeros(f.shape) for f in fields]
    for level in FILTER_LOG_T:
        w = np.maximum(0.0, 1.0 - np.abs(u - level) / step)
        if not w.any():
            continue
        window = 1.0 / (1 + k2 / (k_jeans * 10 ** (-level / 2)) ** 2)
        for total, fk in zip(out, spectra):
            total += w * irfft3(fk * window, size)
    return out


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
    """TSC deposit of mass, momentum and the carried per-element values of the particles at
    sub-lattice offset ``o`` (cells): their displacement is the Fourier-shifted Zel'dovich field; each
    carries the values of its Lagrangian cell. Returns 4 + len(carried) (L, L, L) float64 grids."""
    psi_k, (kx, ky, kz), cell, grid, mass_each, vel_factor, carried = _SUBLATTICE
    size = kx.shape[0]
    shift = np.exp(1j * (kx * o[0] + ky * o[1] + kz * o[2]) * cell)
    psi = np.stack([irfft3(p * shift, size) for p in psi_k]).reshape(3, -1)
    pos = (grid + np.array(o)[:, None] + psi / cell) % size
    return tsc_deposit(pos, size, [mass_each, *(mass_each * psi * vel_factor), *(mass_each * c for c in carried)])


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
    gas: str = GAS_MODELS[0],
) -> Fields:
    """Run the generator physics (module docstring, steps 1-5) on a ``size``^3 grid; deterministic by seed.
    ``gas`` is one of :data:`GAS_MODELS`; the dark matter does not depend on it.
    ``on_stage(name)`` is called as each step starts (a 256^3 grid takes minutes). ``workers`` > 1
    deposits the particle sub-lattices in that many forked processes (each holds about
    12 x size^3 float64); the parts are summed in a fixed order, so the result does not depend on it.

    Raises:
        ValueError: ``gas`` is not one of :data:`GAS_MODELS`.
    """
    if gas not in GAS_MODELS:
        raise ValueError(f"gas {gas!r}: expected one of {GAS_MODELS}")
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
    carried = []  # per fluid element: shock temperature (K), log10 T offset of the photo-heated phase
    if gas == "nonlinear":
        on_stage("deformation tensor: shell crossing, shock temperature, shear")
        # the gas responds to the dark matter smoothed on its filtering scale (Gnedin & Hui 1998), not
        # to the truncation that keeps the dark matter's streams from crossing too far
        psi_gas = np.stack([1j * kc / k2 * delta_k * growth / (1 + k2 / k_jeans**2) for kc in (kx, ky, kz)])
        eigen = deformation_eigenvalues(psi_gas, size, box).reshape(3, -1)
        t_shock = shock_temperature(eigen[0], vel_factor, characteristic_wavenumber(psi_gas, size, box))
        del psi_gas
        s2 = shear_invariant(eigen)
        carried = [t_shock, SHEAR_SCATTER_DEX * (s2 - s2.mean())]
        del eigen, s2

    on_stage(f"dark matter on the grid ({PARTICLES_PER_SIDE}^3 particles per cell, TSC)")
    cell = box / size
    grid = np.indices((size,) * 3, dtype=np.float64).reshape(3, -1)
    offsets = (np.arange(PARTICLES_PER_SIDE) + 0.5) / PARTICLES_PER_SIDE - 0.5  # cells, symmetric about 0
    mass_each = np.full(size**3, 1.0 / PARTICLES_PER_SIDE**3)
    global _SUBLATTICE
    _SUBLATTICE = (psi_k, (kx, ky, kz), cell, grid, mass_each, vel_factor, carried)
    totals = tuple(np.zeros((size,) * 3) for _ in range(4 + len(carried)))
    mass, px, py, pz = totals[:4]
    subs = list(itertools.product(offsets, repeat=3))
    try:
        if workers > 1:  # fork: the children read the module's _SUBLATTICE without a copy
            ctx = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(min(workers, len(subs)), mp_context=ctx) as pool:
                results = pool.map(_deposit_sublattice, subs)
                _sum_in_order(results, totals)
        else:
            _sum_in_order(map(_deposit_sublattice, subs), totals)
    finally:
        _SUBLATTICE = None
    filled = mass > 1e-6
    v_lagr = np.stack([irfft3(p, size) for p in psi_k]) * vel_factor
    v_dm = np.where(filled, np.stack([px, py, pz]) / np.where(filled, mass, 1.0), v_lagr)

    if gas == "filtered":
        on_stage("gas: Jeans smoothing, temperature-density relation")
        rho_gas = np.maximum(jeans_filter(mass, box, k_jeans), 0.0)
        v_gas = np.stack([jeans_filter(v, box, k_jeans) for v in v_dm])
        temperature = t0 * np.maximum(rho_gas, 1e-12) ** (gamma - 1)
    else:
        on_stage("gas: shock heating, two-phase temperature, temperature-dependent Jeans smoothing")
        per_mass = [np.where(filled, c / np.where(filled, mass, 1.0), 0.0) for c in totals[4:]]
        he2 = reionization_offset(size, box, seed)
        rho_gas, temperature, v_gas = nonlinear_gas(mass, v_dm, *per_mass, he2, box, k_jeans, t0, gamma)
    return Fields(delta_linear, mass, v_dm, rho_gas, temperature, v_gas, k_nl)


def nonlinear_gas(
    rho_dm: np.ndarray,
    v_dm: np.ndarray,
    t_shock: np.ndarray,
    log_t_offset: np.ndarray,
    log_t_reionization: np.ndarray,
    box: float,
    k_jeans: float,
    t0: float,
    gamma: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``nonlinear`` gas (module docstring, 5c-e) of the dark matter on the grid: ``rho_dm``
    (L, L, L, mean density units), ``v_dm`` (3, L, L, L) km/s, the mass-weighted element values
    ``t_shock`` (K) and ``log_t_offset`` (dex of the photo-heated phase), as the deposit puts them,
    and ``log_t_reionization`` (dex, (L, L, L): :func:`reionization_offset`).
    Returns ``(rho_gas, temperature (K), v_gas (3, L, L, L) km/s)``, float64.

    The temperature that sets the smoothing is that of the ``filtered`` gas density with the offset
    and the shock heat; the smoothed density then gives the photo-heated phase, raised by the
    reionization offset, and the shock heat adds to it where the deposit put it.
    """
    rho_filtered = np.maximum(jeans_filter(rho_dm, box, k_jeans), 1e-12)
    first = t0 * rho_filtered ** (gamma - 1) * 10**log_t_offset + t_shock
    smooth = adaptive_jeans_filter([rho_dm, *v_dm], box, k_jeans, np.log10(first / t0))
    rho_gas = np.maximum(smooth[0], 0.0)
    photo = t0 * np.maximum(rho_gas, 1e-12) ** (gamma - 1) * 10 ** (log_t_offset + log_t_reionization)
    temperature = photo + t_shock
    return rho_gas, temperature, np.stack(smooth[1:])
