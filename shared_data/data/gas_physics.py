"""The gas of the dataset generator (step 5 of :mod:`shared_data.data.cosmology`) from its dark matter
(:mod:`shared_data.data.dark_matter`): the ``filtered`` (linear) gas and the ``nonlinear`` one.

Units: comoving lengths in Mpc/h, wavenumbers in h/Mpc, velocities in km/s (peculiar), temperature
in K, densities in units of the cosmic mean (rho / rho_mean = 1 + delta).

5. **Gas**, two models (``gas`` of :func:`shared_data.data.cosmology.simulate`):

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
      and velocity depart from any one filter of the dark matter. This per-voxel mix of smoothed
      fields (the ``zeldovich`` dark matter's gas, generator v4) does not conserve mass: a hot voxel
      takes the smoothed field's value while its own gas goes nowhere (measured on the N-body's
      128^3 volume: the gas's mean density 0.80, its power 0.36 of the dark matter's at k = 0.2 h/Mpc).
      With the N-body's dark matter the gas is spread instead (:func:`spreading_jeans_filter`): each
      voxel's overdensity and momentum are smoothed with the filter of its own Jeans scale, so mass
      and momentum are conserved, and that scale is the local one, k_J(T, Delta) = k_J (T / T0)^(-1/2)
      Delta^(1/2) (the Jeans length c_s / sqrt(G rho) falls with the density: Schaye 2001, ApJ 559,
      507, eq. 3-4), so the gas of a hot, dense halo stays near it (mean density 1.000, power 0.98 of
      the dark matter's at k = 0.2 h/Mpc on the same volume).

   e. *Patchy He II reionization*: quasars reionize He II at z ~ 3-4 in bubbles tens of comoving Mpc
      across, and the photo-heating raises T0 inside them by about a factor of two before the rest
      of the volume follows (McQuinn et al. 2009, ApJ 694, 842; Lai et al. 2006, ApJ 644, 61, on the
      temperature fluctuations it leaves): the photo-heated phase's T0 varies on large scales
      independently of the density. Here T_ph carries a factor 10^m(x), m a Gaussian random field of
      its own seed with power exp(-(k R)^2), R = :data:`HE2_RADIUS_MPC_H`, scaled to a standard
      deviation of :data:`HE2_DEX` (:func:`reionization_offset`). The heating is late, so it does
      not enter the Jeans smoothing, which integrates the thermal history (Gnedin & Hui 1998).

   The elements' quantities (a-c) are computed on the Lagrangian lattice and carried to the grid by
   the dark matter's own TSC deposit (mass-weighted).

   With the N-body's dark matter (:mod:`shared_data.data.nbody`), a-c come from what the particles
   know rather than from linear theory (:func:`particle_heating`): (a) the deformation tensor is that
   of the N-body's own displacement x(q) - q (Jeans-filtered in Lagrangian space as above), so
   lambda_1 >= 1 marks the elements whose smoothed map has folded, and the shear s^2 is the non-linear
   one; (b) the shock temperature is that of the dark matter's velocity dispersion where folded
   elements are: T_s = f_x mu m_p sigma^2 / (3 k_B) (:func:`dispersion_temperature`), sigma^2 the
   mass-weighted 3-D dispersion <|v|^2> - |<v>|^2 of the deposit, f_x the mass fraction of folded
   elements in the cell. Two cold streams meeting at +-u have sigma^2 = u^2, and mu m_p u^2 / 3 is the
   strong-shock temperature of (b) above; a virialised halo with a 1-D dispersion sigma_1 gets
   mu m_p sigma_1^2 / k_B, its virial temperature (the singular isothermal sphere's; Binney &
   Tremaine 2008, sec. 4.3.3b). In single-stream cells f_x = 0 and the velocity gradient across a
   cell does not heat. At vanishing amplitude lambda -> 0, no element
   shocks, s^2 -> 0 at second order and k_J(T) -> k_J, so ``nonlinear`` returns ``filtered`` with its
   temperature times 10^m(x).
"""

from __future__ import annotations

import numpy as np

from shared_data.data.linear_field import gaussian_field_k, irfft3, wavenumbers

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


def jeans_filter(field: np.ndarray, box: float, k_jeans: float) -> np.ndarray:
    """Smooth a real periodic field by 1 / (1 + k^2 / k_J^2) (Hui & Gnedin 1997)."""
    size = field.shape[0]
    kx, ky, kz = wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    return irfft3(np.fft.rfftn(field) / (1 + k2 / k_jeans**2), size)


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


def dispersion_temperature(sigma2: np.ndarray) -> np.ndarray:
    """Temperature (K) of gas that thermalises a 3-D velocity dispersion ``sigma2`` ((km/s)^2):
    k_B T = mu m_p sigma2 / 3 (module docstring, N-body (b))."""
    return MU * PROTON_MASS_KG * 1e6 * np.asarray(sigma2, np.float64) / (3 * BOLTZMANN_J_K)


def particle_heating(displacement: np.ndarray, size: int, box: float, k_jeans: float) -> list[np.ndarray]:
    """What each N-body particle (Lagrangian cell) of the ``nonlinear`` gas carries to the grid (module
    docstring, N-body (a)): ``[folded, log_t_offset]``, each (size^3,) float64: 1 where lambda_1 >= 1
    of the Jeans-filtered deformation tensor of ``displacement`` (3, size^3; Mpc/h, x - q on the
    lattice of a ``size``^3 grid over ``box`` Mpc/h), else 0; and :data:`SHEAR_SCATTER_DEX`
    (s^2 - <s^2>) of the same tensor."""
    kx, ky, kz = wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    psi_gas = np.stack([np.fft.rfftn(d.reshape((size,) * 3)) / (1 + k2 / k_jeans**2) for d in displacement])
    eigen = deformation_eigenvalues(psi_gas, size, box).reshape(3, -1)
    s2 = shear_invariant(eigen)
    return [(eigen[0] >= 1.0).astype(np.float64), SHEAR_SCATTER_DEX * (s2 - s2.mean())]


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


def spreading_jeans_filter(
    rho: np.ndarray, velocity: np.ndarray, box: float, k_jeans: float, log_jeans: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The gas of density ``rho`` (L, L, L; mean density units) and ``velocity`` (3, L, L, L; km/s)
    spread by pressure (module docstring, 5d): each voxel's overdensity and momentum smoothed by
    1 / (1 + k^2 / k_J(x)^2) with its own k_J(x) = ``k_jeans`` 10^(-``log_jeans`` / 2), ``log_jeans``
    = log10((T / T0) / Delta) per voxel, between the filters of :data:`FILTER_LOG_T` with weights
    linear in ``log_jeans`` (hat functions summing to 1; clipped to the range).

    Each filter keeps the k = 0 mode, so the mean density is the input's, and so is the total momentum
    of the spread mass (the velocity times it is the spread momentum). The
    overdensity rho - <rho> is what is spread (pressure moves the perturbations, not the uniform
    background), so where the Jeans level varies only at first order in the overdensity (the
    photo-heated relation, T / T0 = Delta^(gamma - 1)) the density departs from :func:`jeans_filter`'s
    at second order; the velocity is the spread momentum over the spread mass (positive kernels: a
    weighted mean of the input's). Where ``log_jeans`` is 0 everywhere the result is
    :func:`jeans_filter`'s. Returns ``(rho_gas, v_gas)``, float64; the density is clipped at 0."""
    size = rho.shape[0]
    kx, ky, kz = wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    u = np.clip(log_jeans, FILTER_LOG_T[0], FILTER_LOG_T[-1])
    step = FILTER_LOG_T[1] - FILTER_LOG_T[0]
    mean = rho.mean()
    fields = [rho - mean, rho, *(rho * v for v in velocity)]  # overdensity, mass and momentum
    out = [np.zeros(rho.shape) for _ in fields]
    for level in FILTER_LOG_T:
        w = np.maximum(0.0, 1.0 - np.abs(u - level) / step)
        if not w.any():
            continue
        window = 1.0 / (1 + k2 / (k_jeans * 10 ** (-level / 2)) ** 2)
        for total, field in zip(out, fields):
            total += irfft3(np.fft.rfftn(w * field) * window, size)
    # the kernels are positive: the spread mass vanishes only where the momentum does, up to round-off
    return np.maximum(mean + out[0], 0.0), np.stack(out[2:]) / np.maximum(out[1], 1e-9)


def element_heating(
    delta_k: np.ndarray, size: int, box: float, growth: float, k_jeans: float, vel_factor: float
) -> list[np.ndarray]:
    """What each fluid element (Lagrangian cell) of the ``nonlinear`` gas carries to the grid (module
    docstring, 5a-c), from the z = 0 linear modes ``delta_k`` (``rfftn`` layout) of a ``size``^3 grid
    over ``box`` Mpc/h at ``growth`` = D(z): ``[t_shock, log_t_offset]``, each (size^3,) float64, the
    shock temperature (K; :func:`shock_temperature` with ``vel_factor`` = a H f in km/s per Mpc/h) and
    the log10 T offset (dex) of the photo-heated phase, :data:`SHEAR_SCATTER_DEX` (s^2 - <s^2>)."""
    kx, ky, kz = wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    k2[0, 0, 0] = 1.0
    # the gas responds to the dark matter smoothed on its filtering scale (Gnedin & Hui 1998), not
    # to the truncation that keeps the dark matter's streams from crossing too far
    psi_gas = np.stack([1j * kc / k2 * delta_k * growth / (1 + k2 / k_jeans**2) for kc in (kx, ky, kz)])
    eigen = deformation_eigenvalues(psi_gas, size, box).reshape(3, -1)
    t_shock = shock_temperature(eigen[0], vel_factor, characteristic_wavenumber(psi_gas, size, box))
    del psi_gas
    s2 = shear_invariant(eigen)
    return [t_shock, SHEAR_SCATTER_DEX * (s2 - s2.mean())]


def filtered_gas(
    rho_dm: np.ndarray, v_dm: np.ndarray, box: float, k_jeans: float, t0: float, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``filtered`` gas (module docstring, step 5) of the dark matter on the grid: ``rho_dm``
    (L, L, L, mean density units) and ``v_dm`` (3, L, L, L) km/s smoothed by :func:`jeans_filter` at
    ``k_jeans`` h/Mpc, and T = ``t0`` (1 + delta_gas)^(``gamma`` - 1).
    Returns ``(rho_gas, temperature (K), v_gas (3, L, L, L) km/s)``, float64."""
    rho_gas = np.maximum(jeans_filter(rho_dm, box, k_jeans), 0.0)
    v_gas = np.stack([jeans_filter(v, box, k_jeans) for v in v_dm])
    temperature = t0 * np.maximum(rho_gas, 1e-12) ** (gamma - 1)
    return rho_gas, temperature, v_gas


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
    spread: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``nonlinear`` gas (module docstring, 5c-e) of the dark matter on the grid: ``rho_dm``
    (L, L, L, mean density units), ``v_dm`` (3, L, L, L) km/s, the mass-weighted element values
    ``t_shock`` (K) and ``log_t_offset`` (dex of the photo-heated phase), as the deposit puts them,
    and ``log_t_reionization`` (dex, (L, L, L): :func:`reionization_offset`).
    Returns ``(rho_gas, temperature (K), v_gas (3, L, L, L) km/s)``, float64.

    The temperature that sets the smoothing is that of the ``filtered`` gas density with the offset
    and the shock heat; the smoothed density then gives the photo-heated phase, raised by the
    reionization offset, and the shock heat adds to it where the deposit put it. ``spread`` (the
    N-body's gas): the gas is spread on its local Jeans scale, conserving mass and momentum
    (:func:`spreading_jeans_filter`); else each voxel mixes the fields smoothed at its temperature
    (:func:`adaptive_jeans_filter`, generator v4's gas).
    """
    rho_filtered = np.maximum(jeans_filter(rho_dm, box, k_jeans), 1e-12)
    first = t0 * rho_filtered ** (gamma - 1) * 10**log_t_offset + t_shock
    if spread:
        rho_gas, v_gas = spreading_jeans_filter(rho_dm, v_dm, box, k_jeans, np.log10(first / t0 / rho_filtered))
    else:
        smooth = adaptive_jeans_filter([rho_dm, *v_dm], box, k_jeans, np.log10(first / t0))
        rho_gas, v_gas = np.maximum(smooth[0], 0.0), np.stack(smooth[1:])
    photo = t0 * np.maximum(rho_gas, 1e-12) ** (gamma - 1) * 10 ** (log_t_offset + log_t_reionization)
    temperature = photo + t_shock
    return rho_gas, temperature, v_gas
