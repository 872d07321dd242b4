"""The linear field of the dataset generator (steps 1-3 of :mod:`shared_data.data.cosmology`): the
cosmological parameters, the linear power spectrum, a Gaussian random field of it, and linear growth;
with the Fourier helpers the later steps share and the power spectrum estimators of the same
normalisation.

Units: comoving lengths in Mpc/h, wavenumbers in h/Mpc; fields are real (L, L, L) arrays or their
``rfftn`` modes (L, L, L // 2 + 1), axes (x, y, z).

1. **Linear power spectrum**, one of :data:`SPECTRA` (``Cosmology.spectrum``), normalised to sigma_8
   (top-hat of 8 Mpc/h): ``camb``, the Boltzmann code's total-matter spectrum
   (:mod:`shared_data.data.boltzmann`, cached per cosmology), or ``bbks``, P(k) = A k^n_s T(k)^2 with
   the BBKS transfer function (Bardeen, Bond, Kaiser & Szalay 1986, ApJ 304, 15, eq. G3) and
   Sugiyama's (1995, ApJS 100, 281) baryon-corrected shape parameter
   Gamma = Omega_m h exp(-Omega_b - sqrt(2h) Omega_b / Omega_m), the spectrum of the Zel'dovich
   files (generator v4 and before).
2. **Gaussian random field**: unit white noise, Fourier-transformed and scaled so that the field's
   power spectrum is P(k) for the discrete estimator P_hat(k) = V / N^6 |FFT(delta)(k)|^2.
3. **Growth**: D(z) from the Carroll, Press & Turner (1992, ARA&A 30, 499, eq. 29) fit;
   growth rate f = Omega_m(z)^0.55 (Linder 2005, PRD 72, 043529).

The non-linear wavenumber k_nl (:func:`nonlinear_wavenumber`), where the linear variance reaches one,
sets the dark matter's truncation (:mod:`shared_data.data.dark_matter`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

#: The linear spectra of :class:`Cosmology` (module docstring, step 1).
SPECTRA = ("bbks", "camb")


@dataclasses.dataclass(frozen=True)
class Cosmology:
    """Flat LambdaCDM parameters (Planck-2018-like defaults) and the linear spectrum's source."""

    Omega_m: float = 0.31
    Omega_b: float = 0.049
    h: float = 0.68
    n_s: float = 0.965
    sigma8: float = 0.81
    spectrum: str = "bbks"

    def __post_init__(self):
        if self.spectrum not in SPECTRA:
            raise ValueError(f"spectrum {self.spectrum!r}: expected one of {SPECTRA}")

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
        if self.spectrum == "camb":
            from shared_data.data import boltzmann

            return boltzmann.interpolate(*boltzmann.load_table(self.Omega_m, self.Omega_b, self.h, self.n_s), k)
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
