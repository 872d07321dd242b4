"""Physics of the dataset generator: a LambdaCDM-like linear field, Zel'dovich dark matter, and gas.

Units: comoving lengths in Mpc/h, wavenumbers in h/Mpc, velocities in km/s (peculiar), temperature
in K, densities in units of the cosmic mean (rho / rho_mean = 1 + delta).

:func:`simulate` runs the steps in order; each ingredient's module writes out its physics and sources:

1. **Linear power spectrum**: BBKS transfer function with Sugiyama's baryon-corrected shape
   parameter, normalised to sigma_8 (:mod:`shared_data.data.linear_field`).
2. **Gaussian random field** of that spectrum, drawn from the seed (:mod:`shared_data.data.linear_field`).
3. **Growth** D(z) and growth rate f (:mod:`shared_data.data.linear_field`).
4. **Dark matter**, two models (``dm`` of :func:`simulate`, :data:`DM_MODELS`): ``nbody`` (the
   default), a particle-mesh N-body of one particle per cell from 2LPT initial conditions
   (:mod:`shared_data.data.nbody`), its displacement and velocity on the Lagrangian lattice carried to
   the grid as the Zel'dovich ones are; or ``zeldovich``, displacements truncated at the non-linear
   scale (:mod:`shared_data.data.dark_matter`), the dark matter of generator v4 and before. Either
   way 2^3 particles per cell at Fourier-shifted sub-lattice offsets give density and mass-weighted
   velocity by a TSC deposit. The linear spectrum is CAMB's for ``nbody``, BBKS's for ``zeldovich``
   (``Cosmology.spectrum``; :func:`cosmology_for`).
5. **Gas**, two models (``gas`` of :func:`simulate`, :data:`GAS_MODELS`;
   :mod:`shared_data.data.gas_physics`): ``filtered``, the linear gas (the dark matter
   Jeans-smoothed, T = T0 (1 + delta_gas)^(gamma - 1)), and ``nonlinear`` (the default): (a) shell
   crossing from the Zel'dovich deformation tensor, (b) shock heating where streams cross, (c) a
   two-phase temperature with scatter at fixed density, (d) Jeans smoothing that follows the local
   temperature, (e) patchy He II reionization; with ``nbody``, (a) and (b) come from the particles'
   own deformation and velocity dispersion.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from shared_data.data.dark_matter import PARTICLES_PER_SIDE, deposit_particles, zeldovich_displacement
from shared_data.data.gas_physics import (
    dispersion_temperature,
    element_heating,
    filtered_gas,
    nonlinear_gas,
    particle_heating,
    reionization_offset,
)
from shared_data.data.linear_field import Cosmology, gaussian_field_k, irfft3, nonlinear_wavenumber

#: The gas models of :func:`simulate` (:mod:`shared_data.data.gas_physics`); the first is the default.
GAS_MODELS = ("nonlinear", "filtered")
#: The dark matter of :func:`simulate`: the particle-mesh N-body (:mod:`shared_data.data.nbody`) or
#: the truncated Zel'dovich approximation (:mod:`shared_data.data.dark_matter`); the first is the default.
DM_MODELS = ("nbody", "zeldovich")


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
    dm: str = DM_MODELS[0],
) -> Fields:
    """Run the generator physics (module docstring, steps 1-5) on a ``size``^3 grid; deterministic by seed.
    ``gas`` is one of :data:`GAS_MODELS`; the dark matter does not depend on it. ``dm`` is one of
    :data:`DM_MODELS`; ``cosmo`` carries the linear spectrum (:func:`cosmology_for` picks the one
    that goes with ``dm``).
    ``on_stage(name)`` is called as each step starts (a 256^3 grid takes minutes). ``workers`` > 1
    deposits the particle sub-lattices in that many forked processes (each holds about
    12 x size^3 float64); the parts are summed in a fixed order, so the result does not depend on it.

    Raises:
        ValueError: ``gas`` is not one of :data:`GAS_MODELS` or ``dm`` not one of :data:`DM_MODELS`.
    """
    if gas not in GAS_MODELS:
        raise ValueError(f"gas {gas!r}: expected one of {GAS_MODELS}")
    if dm not in DM_MODELS:
        raise ValueError(f"dm {dm!r}: expected one of {DM_MODELS}")
    on_stage("Gaussian random field")
    rng = np.random.default_rng(seed)
    delta_k = gaussian_field_k(size, box, cosmo.linear_power, rng)
    delta_linear = irfft3(delta_k, size)

    growth = cosmo.growth_factor(z)
    k_nyq = np.pi * size / box
    k_nl = nonlinear_wavenumber(cosmo, z, k_max=np.sqrt(3) * k_nyq)
    if dm == "nbody":
        return _nbody_fields(
            delta_k, delta_linear, size, box, z, seed, cosmo, k_jeans, t0, gamma, on_stage, workers, gas
        )
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


def cosmology_for(dm: str, **params) -> Cosmology:
    """The :class:`Cosmology` of ``params`` with the linear spectrum that goes with ``dm``: CAMB's for
    the N-body, BBKS's for the Zel'dovich dark matter (whose files it reproduces)."""
    return Cosmology(**params, spectrum="camb" if dm == "nbody" else "bbks")


def _nbody_fields(delta_k, delta_linear, size, box, z, seed, cosmo, k_jeans, t0, gamma, on_stage, workers, gas):
    """Steps 4-5 of :func:`simulate` with the N-body's dark matter (module docstring)."""
    # Imported here, not at the top: the N-body brings SciPy's FFT (tens of MiB of shared objects), and
    # this module is also read for its constants by processes that never simulate, some of them under
    # a tight address-space limit (``ulimit -v``) they must meet to refuse cleanly.
    from shared_data.data import nbody

    particles = nbody.run(delta_k, size, box, z, cosmo, on_stage=on_stage)
    psi_k = np.stack([np.fft.rfftn(d.reshape((size,) * 3)) for d in particles.displacement])
    vel_k = np.stack([np.fft.rfftn(v.reshape((size,) * 3)) for v in particles.velocity])
    if size % 2 == 0:  # as for the Zel'dovich field: a sub-cell shift of a Nyquist-plane mode is not real
        for modes in (psi_k, vel_k):
            modes[:, size // 2] = modes[:, :, size // 2] = modes[..., -1] = 0.0
    carried = []
    if gas == "nonlinear":
        on_stage("particle deformation: folded elements, shear")
        carried = particle_heating(particles.displacement, size, box, k_jeans)
    del particles
    on_stage(f"dark matter on the grid ({PARTICLES_PER_SIDE}^3 particles per cell, TSC)")
    mass, v_dm, per_mass = deposit_particles(psi_k, size, box, 0.0, carried, on_stage, workers, vel_k=vel_k)
    k_nl = float("inf")  # no truncation: the N-body follows the non-linear scales itself
    if gas == "filtered":
        on_stage("gas: Jeans smoothing, temperature-density relation")
        rho_gas, temperature, v_gas = filtered_gas(mass, v_dm, box, k_jeans, t0, gamma)
        return Fields(delta_linear, mass, v_dm, rho_gas, temperature, v_gas, k_nl)
    folded, log_t_offset, sigma2 = per_mass
    on_stage("gas: shock heating, two-phase temperature, temperature-dependent Jeans smoothing")
    t_shock = folded * dispersion_temperature(sigma2)
    he2 = reionization_offset(size, box, seed)
    rho_gas, temperature, v_gas = nonlinear_gas(
        mass, v_dm, t_shock, log_t_offset, he2, box, k_jeans, t0, gamma, spread=True
    )
    return Fields(delta_linear, mass, v_dm, rho_gas, temperature, v_gas, k_nl)
