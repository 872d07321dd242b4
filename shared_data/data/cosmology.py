"""Physics of the dataset generator: a LambdaCDM-like linear field, Zel'dovich dark matter, and gas.

Units: comoving lengths in Mpc/h, wavenumbers in h/Mpc, velocities in km/s (peculiar), temperature
in K, densities in units of the cosmic mean (rho / rho_mean = 1 + delta).

:func:`simulate` runs the steps in order; each ingredient's module writes out its physics and sources:

1. **Linear power spectrum**: BBKS transfer function with Sugiyama's baryon-corrected shape
   parameter, normalised to sigma_8 (:mod:`shared_data.data.linear_field`).
2. **Gaussian random field** of that spectrum, drawn from the seed (:mod:`shared_data.data.linear_field`).
3. **Growth** D(z) and growth rate f (:mod:`shared_data.data.linear_field`).
4. **Zel'dovich approximation**: displacements truncated at the non-linear scale move 2^3
   particles per cell; density and mass-weighted velocity from their TSC deposit
   (:mod:`shared_data.data.dark_matter`).
5. **Gas**, two models (``gas`` of :func:`simulate`, :data:`GAS_MODELS`;
   :mod:`shared_data.data.gas_physics`): ``filtered``, the linear gas (the dark matter
   Jeans-smoothed, T = T0 (1 + delta_gas)^(gamma - 1)), and ``nonlinear`` (the default): (a) shell
   crossing from the Zel'dovich deformation tensor, (b) shock heating where streams cross, (c) a
   two-phase temperature with scatter at fixed density, (d) Jeans smoothing that follows the local
   temperature, (e) patchy He II reionization.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from shared_data.data.dark_matter import PARTICLES_PER_SIDE, deposit_particles, zeldovich_displacement
from shared_data.data.gas_physics import element_heating, filtered_gas, nonlinear_gas, reionization_offset
from shared_data.data.linear_field import Cosmology, gaussian_field_k, irfft3, nonlinear_wavenumber

#: The gas models of :func:`simulate` (:mod:`shared_data.data.gas_physics`); the first is the default.
GAS_MODELS = ("nonlinear", "filtered")


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
    on_stage("Zel'dovich displacements")
    psi_k = zeldovich_displacement(delta_k, size, box, growth, k_nl)
    vel_factor = cosmo.hubble(z) / (1 + z) * cosmo.growth_rate(z)  # a H f, km/s per Mpc/h
    carried = []  # per fluid element: shock temperature (K), log10 T offset of the photo-heated phase
    if gas == "nonlinear":
        on_stage("deformation tensor: shell crossing, shock temperature, shear")
        carried = element_heating(delta_k, size, box, growth, k_jeans, vel_factor)

    on_stage(f"dark matter on the grid ({PARTICLES_PER_SIDE}^3 particles per cell, TSC)")
    mass, v_dm, per_mass = deposit_particles(psi_k, size, box, vel_factor, carried, on_stage, workers)
    if gas == "filtered":
        on_stage("gas: Jeans smoothing, temperature-density relation")
        rho_gas, temperature, v_gas = filtered_gas(mass, v_dm, box, k_jeans, t0, gamma)
    else:
        on_stage("gas: shock heating, two-phase temperature, temperature-dependent Jeans smoothing")
        he2 = reionization_offset(size, box, seed)
        rho_gas, temperature, v_gas = nonlinear_gas(mass, v_dm, *per_mass, he2, box, k_jeans, t0, gamma)
    return Fields(delta_linear, mass, v_dm, rho_gas, temperature, v_gas, k_nl)
