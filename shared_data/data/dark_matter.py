"""The dark matter of the dataset generator (step 4 of :mod:`shared_data.data.cosmology`): Zel'dovich
displacements of the linear field, particles on a lattice moved by them, and the density and velocity
of their triangular-shaped-cloud deposit.

Units: comoving lengths in Mpc/h (positions in cells where said), wavenumbers in h/Mpc, velocities in
km/s (peculiar), densities in units of the cosmic mean.

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
"""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from shared_data.data.linear_field import irfft3, wavenumbers

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


def zeldovich_displacement(delta_k: np.ndarray, size: int, box: float, growth: float, k_nl: float) -> np.ndarray:
    """Modes (3, ``rfftn`` layout, complex128; Mpc/h) of the Zel'dovich displacement
    Psi(k) = i k / k^2 delta(k) D(z) of the z = 0 linear modes ``delta_k`` of a ``size``^3 grid over
    ``box`` Mpc/h, with ``growth`` = D(z), truncated by exp(-k^2 / (2 k_nl^2)) (none where ``k_nl`` is
    inf; module docstring, step 4)."""
    kx, ky, kz = wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    k2[0, 0, 0] = 1.0
    trunc = np.exp(-0.5 * k2 / k_nl**2) if np.isfinite(k_nl) else 1.0
    psi_k = np.stack([1j * kc / k2 * delta_k * growth * trunc for kc in (kx, ky, kz)])
    if size % 2 == 0:  # a sub-cell shift of a Nyquist-plane mode is not a real field: those modes go
        psi_k[:, size // 2] = psi_k[:, :, size // 2] = psi_k[..., -1] = 0.0
    return psi_k


#: The sub-lattice deposit's inputs, set by :func:`deposit_particles` for the calls (and forked workers) it makes.
_SUBLATTICE: tuple | None = None


def _deposit_sublattice(o: tuple[float, float, float]) -> list[np.ndarray]:
    """TSC deposit of mass, momentum and the carried per-element values of the particles at
    sub-lattice offset ``o`` (cells): their displacement (and velocity, where its modes are given) is
    the Fourier-shifted field; each carries the values of its Lagrangian cell. Returns
    4 + len(carried) (L, L, L) float64 grids, and with velocity modes one more: mass times |v|^2."""
    psi_k, (kx, ky, kz), cell, grid, mass_each, vel_factor, carried, vel_k = _SUBLATTICE
    size = kx.shape[0]
    shift = np.exp(1j * (kx * o[0] + ky * o[1] + kz * o[2]) * cell)
    psi = np.stack([irfft3(p * shift, size) for p in psi_k]).reshape(3, -1)
    pos = (grid + np.array(o)[:, None] + psi / cell) % size
    if vel_k is None:
        return tsc_deposit(pos, size, [mass_each, *(mass_each * psi * vel_factor), *(mass_each * c for c in carried)])
    vel = np.stack([irfft3(v * shift, size) for v in vel_k]).reshape(3, -1)
    values = [mass_each, *(mass_each * vel), *(mass_each * c for c in carried), mass_each * (vel**2).sum(0)]
    return tsc_deposit(pos, size, values)


def _reported(parts, n: int, on_stage) -> Iterator:
    """``parts`` (``n`` sub-lattices' grids) as they come; after each quarter of them ``on_stage`` hears
    how many are deposited, so the longest stage of a large volume shows progress."""
    for k, part in enumerate(parts, 1):
        yield part
        if k < n and k % max(n // 4, 1) == 0:
            on_stage(f"dark matter on the grid: {k} of {n} sub-lattices deposited")


def _sum_in_order(parts, totals: tuple) -> None:
    """Adds each sub-lattice's grids to ``totals`` in the order of ``parts`` (deterministic bytes)."""
    for part in parts:
        for total, p in zip(totals, part):
            total += p


def deposit_particles(
    psi_k: np.ndarray,
    size: int,
    box: float,
    vel_factor: float,
    carried: Sequence[np.ndarray] = (),
    on_stage: Callable[[str], None] = lambda stage: None,
    workers: int = 1,
    vel_k: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The dark matter on a ``size``^3 grid over ``box`` Mpc/h (module docstring, step 4): the
    :data:`PARTICLES_PER_SIDE`^3 particles of each cell (mass 1 / PARTICLES_PER_SIDE^3 each) moved by
    the displacement modes ``psi_k`` (3, ``rfftn`` layout; Mpc/h: :func:`zeldovich_displacement`), with
    velocity ``vel_factor`` Psi (``vel_factor`` = a H f in km/s per Mpc/h), each carrying the values
    ``carried`` of its Lagrangian cell (each (size^3,)), deposited with TSC.

    ``on_stage`` hears after each quarter of the sub-lattices how many are deposited. ``workers`` > 1
    deposits the sub-lattices in that many forked processes (each holds about 12 x size^3 float64);
    the parts are summed in a fixed order, so the result does not depend on it.

    ``vel_k`` (3, ``rfftn`` layout; km/s), the modes of the particles' velocities on the lattice (the
    N-body's: :mod:`shared_data.data.nbody`), replaces ``vel_factor`` Psi; then the carried values end
    with one more, the mass-weighted velocity dispersion sigma^2 = <|v|^2> - |<v>|^2 ((km/s)^2).

    Returns ``(rho_dm, v_dm, carried_per_mass)``: the density (L, L, L; mean 1), the mass-weighted
    velocity (3, L, L, L) km/s, the lattice velocity where no particle reaches, and each carried value
    per unit mass (L, L, L; 0 where no particle reaches), all float64.
    """
    kx, ky, kz = wavenumbers(size, box)
    cell = box / size
    grid = np.indices((size,) * 3, dtype=np.float64).reshape(3, -1)
    offsets = (np.arange(PARTICLES_PER_SIDE) + 0.5) / PARTICLES_PER_SIDE - 0.5  # cells, symmetric about 0
    mass_each = np.full(size**3, 1.0 / PARTICLES_PER_SIDE**3)
    global _SUBLATTICE
    _SUBLATTICE = (psi_k, (kx, ky, kz), cell, grid, mass_each, vel_factor, carried, vel_k)
    totals = tuple(np.zeros((size,) * 3) for _ in range(4 + len(carried) + (vel_k is not None)))
    mass, px, py, pz = totals[:4]
    subs = list(itertools.product(offsets, repeat=3))
    try:
        if workers > 1:  # fork: the children read the module's _SUBLATTICE without a copy
            ctx = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(min(workers, len(subs)), mp_context=ctx) as pool:
                results = pool.map(_deposit_sublattice, subs)
                _sum_in_order(_reported(results, len(subs), on_stage), totals)
        else:
            _sum_in_order(_reported(map(_deposit_sublattice, subs), len(subs), on_stage), totals)
    finally:
        _SUBLATTICE = None
    filled = mass > 1e-6
    if vel_k is None:
        v_lagr = np.stack([irfft3(p, size) for p in psi_k]) * vel_factor
    else:
        v_lagr = np.stack([irfft3(v, size) for v in vel_k])
    v_dm = np.where(filled, np.stack([px, py, pz]) / np.where(filled, mass, 1.0), v_lagr)
    per_mass = [np.where(filled, c / np.where(filled, mass, 1.0), 0.0) for c in totals[4:]]
    if vel_k is not None:  # <|v|^2> - |<v>|^2, rounding kept from going below 0
        per_mass[-1] = np.where(filled, np.maximum(per_mass[-1] - (v_dm**2).sum(0), 0.0), 0.0)
    return mass, v_dm, per_mass
