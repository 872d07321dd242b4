"""The particle-mesh N-body of the dataset generator (the ``nbody`` dark matter of
:mod:`shared_data.data.cosmology`): 2LPT initial conditions at an early redshift, then kick-drift-kick
steps in the scale factor with FastPM's kick and drift factors to the file's redshift.

Units: comoving positions in Mpc/h, wavenumbers in h/Mpc, time the scale factor a, momenta
p = a^2 dx/dt in units of H0 Mpc/h (so the peculiar velocity is 100 p / a km/s), densities in units of
the mean. Particles are a ``size``^3 Lagrangian lattice, q = i box / size (the lattice of
:mod:`shared_data.data.dark_matter`), flattened in C order; arrays (3, n).

Why our own PM in NumPy: ``shared_data`` imports neither JAX nor TensorFlow (the project's layout
contract), which rules out jaxpm (JAX, jax_cosmo, jaxdecomp) for the generator; a PM is a page of FFTs.

* **Growth**: D(a) of flat LambdaCDM without radiation is exact as D ∝ E(a) ∫_0^a da' / (a' E(a'))^3
  (Heath 1977, MNRAS 179, 351), normalised to D(1) = 1; second order D2 = -3/7 D^2 (the
  Einstein-de Sitter value; Bouchet et al. 1995, A&A 296, 575, give the Omega_m(a)^(-1/143) factor,
  below 1e-3 at the starting redshift).
* **2LPT** (Scoccimarro 1998, MNRAS 299, 1097; Crocce, Pueblas & Scoccimarro 2006, MNRAS 373, 369):
  x = q + D Psi1 + D2 Psi2, Psi1 = -grad phi1 with lap phi1 = delta_lin (z = 0 modes),
  Psi2 = grad phi2 with lap phi2 = sum_{i<j} (phi1,ii phi1,jj - phi1,ij^2); momentum
  p = a^3 E(a) (dD/da Psi1 + dD2/da Psi2).
* **Force**: cloud-in-cell (CIC) deposit on a mesh ``mesh_factor`` times finer than the particle
  lattice, delta(k) deconvolved by the CIC window twice (deposit and read-out; Hockney & Eastwood 1988,
  sec. 7-8), F(k) = i k / k^2 delta(k) (Nyquist planes zero), read back with CIC: the same assignment
  both ways and an odd gradient, so total momentum is conserved to round-off (Hockney & Eastwood
  1988, sec. 5-3). F is the force per unit of 3/2 Omega_m / a.
* **Kick-drift-kick** (FastPM: Feng, Chu, Seljak & McDonald 2016, MNRAS 463, 2273, eqs. 17-22):
  with G_p(a) = a^3 E dD/da (a linear particle's momentum per unit Psi1) and D itself, a kick from
  a1 to a2 with the force at ac adds F (G_p(a2) - G_p(a1)) / D(ac) to p, and a drift adds
  p (D(a2) - D(a1)) / G_p(ac) to x (dG_p/da = 3/2 Omega_m D / (a^2 E) from the growth equation). Both
  are exact for the Zel'dovich solution, so large scales grow as D(a) whatever the number of steps.
  Steps are linear in a from ``a_start`` to the output.

Deterministic: the same seed and arguments give the same bytes on one machine, whatever its number of
cores (SciPy's FFT splits its 1-D transforms over the cores, each computed alike; the mesh deposit
sums each cell's particles in order); FFT libraries may differ between builds by round-off (~1e-15
relative per step), which the chaotic growth of close encounters can amplify to ~1e-6 of a
particle's position by the end. The FFTs are SciPy's (pocketfft, on all cores: 6x NumPy's 3-D
``rfftn`` on one core at 256^3 here); the generator's other stages keep NumPy's, so that the
``zeldovich`` files stay those of generator v4, byte for byte.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import scipy.fft

from shared_data.data.linear_field import Cosmology, wavenumbers

#: Starting redshift of the 2LPT initial conditions (2LPT transients decay as D^-2; Crocce et al. 2006).
Z_START = 19.0
#: Kick-drift-kick steps from Z_START to the output (linear in a).
STEPS = 10
#: The force mesh's cells per particle-lattice cell along each axis.
MESH_FACTOR = 1
#: Particles per chunk of the mesh deposit and read-out (keeps the 8-corner temporaries small).
CHUNK = 1 << 18
DECONVOLVE = 4


def growth(cosmo: Cosmology, a: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(D, dD/da)`` of flat LambdaCDM at scale factor ``a`` (exact integral; module docstring),
    D(1) = 1. 64-point Gauss-Legendre in s with a' = a s^2, where the integrand is smooth."""
    a = np.asarray(a, np.float64)
    om, ol = cosmo.Omega_m, cosmo.Omega_L
    e = lambda x: np.sqrt(om / x**3 + ol)
    s, w = np.polynomial.legendre.leggauss(64)
    s, w = 0.5 * (s + 1), 0.5 * w

    def integral(x):
        ap = x[..., None] * s**2
        return (w * 2 * x[..., None] * s / (ap * e(ap)) ** 3).sum(-1)

    def raw(x):
        return 2.5 * om * e(x) * integral(x)

    norm = raw(np.array(1.0))
    dedx = -1.5 * om / a**4 / e(a)
    d_raw = raw(a)
    d_prime = 2.5 * om * (dedx * integral(a) + e(a) / (a * e(a)) ** 3)
    return d_raw / norm, d_prime / norm


def momentum_growth(cosmo: Cosmology, a: float) -> float:
    """G_p(a) = a^3 E(a) dD/da: a linear particle's momentum per unit of Psi1 (FastPM)."""
    _, d_prime = growth(cosmo, a)
    return float(a**3 * cosmo.E(1 / a - 1) * d_prime)


def lpt_displacements(delta_k: np.ndarray, size: int, box: float) -> tuple[np.ndarray, np.ndarray]:
    """``(psi1, psi2)``, each (3, size^3) float64 in Mpc/h on the lattice: the first- and second-order
    displacement fields of the z = 0 linear modes ``delta_k`` (``rfftn`` layout) at D = 1 (module
    docstring, 2LPT; x = q + D psi1 + D2 psi2 with D2 = -3/7 D^2)."""
    kvec = wavenumbers(size, box)
    k2 = sum(kc**2 for kc in kvec)
    k2[0, 0, 0] = 1.0
    phi1_k = -delta_k / k2  # lap phi1 = delta
    psi1 = np.stack([irfft3(-1j * kc * phi1_k, size).ravel() for kc in kvec])
    d = {(i, j): irfft3(-kvec[i] * kvec[j] * phi1_k, size) for i in range(3) for j in range(i, 3)}
    source = d[0, 0] * d[1, 1] + d[0, 0] * d[2, 2] + d[1, 1] * d[2, 2] - d[0, 1] ** 2 - d[0, 2] ** 2 - d[1, 2] ** 2
    del d
    phi2_k = -rfft3(source) / k2
    phi2_k[0, 0, 0] = 0.0
    psi2 = np.stack([irfft3(1j * kc * phi2_k, size).ravel() for kc in kvec])
    return psi1, psi2


def cic_weights(pos: np.ndarray, mesh: int) -> tuple[np.ndarray, np.ndarray]:
    """The 8 mesh cells and cloud-in-cell weights of each particle at ``pos`` (3, n) in mesh-cell units
    (periodic, cell centres at integers): ``(index (8, n) int64 into the flattened mesh, weight (8, n))``,
    corners in the order (dx, dy, dz) = (0, 0, 0), (0, 0, 1), ..., (1, 1, 1). Each axis's two cells
    and weights are computed once and combined per corner (the weights' products in the order x, y, z)."""
    base = np.floor(pos)
    frac = pos - base
    cells = base.astype(np.int64) % mesh
    strides = (mesh * mesh, mesh, 1)
    # per axis: the lower and upper cell, each times its stride, and their weights
    offsets = [(c * stride, np.where(c == mesh - 1, 0, c + 1) * stride) for c, stride in zip(cells, strides)]
    weights = [(1 - f, f) for f in frac]
    n = pos.shape[1]
    idx, w = np.empty((8, n), np.int64), np.empty((8, n))
    corner = 0
    for dx in (0, 1):
        for dy in (0, 1):
            ixy, wxy = offsets[0][dx] + offsets[1][dy], weights[0][dx] * weights[1][dy]
            for dz in (0, 1):
                np.add(ixy, offsets[2][dz], out=idx[corner])
                np.multiply(wxy, weights[2][dz], out=w[corner])
                corner += 1
    return idx, w


def cic_deposit(pos: np.ndarray, mesh: int) -> np.ndarray:
    """Particle count per mesh cell (mesh^3 float64) of CIC clouds at ``pos`` (3, n), mesh-cell units.
    Each cell's sum runs over the particles in order, so the result does not depend on :data:`CHUNK`."""
    out = np.zeros(mesh**3)
    for start in range(0, pos.shape[1], CHUNK):
        idx, w = cic_weights(pos[:, start : start + CHUNK], mesh)
        np.add.at(out, idx.ravel(), w.ravel())
    return out.reshape((mesh,) * 3)


def cic_readout(fields: list[np.ndarray], pos: np.ndarray) -> np.ndarray:
    """Each mesh field (mesh^3) interpolated to ``pos`` (3, n) with CIC: (len(fields), n) float64."""
    mesh = fields[0].shape[0]
    flat = [f.ravel() for f in fields]
    out = np.empty((len(fields), pos.shape[1]))
    for start in range(0, pos.shape[1], CHUNK):
        idx, w = cic_weights(pos[:, start : start + CHUNK], mesh)
        for c, f in enumerate(flat):
            out[c, start : start + CHUNK] = (f[idx] * w).sum(0)
    return out


def rfft3(field: np.ndarray) -> np.ndarray:
    """``rfftn``-layout modes (complex128) of a real cubic field: SciPy's FFT on all cores."""
    return scipy.fft.rfftn(field, workers=-1)


def irfft3(fk: np.ndarray, size: int) -> np.ndarray:
    """Real ``size``^3 field (float64) of the ``rfftn``-layout modes ``fk``: SciPy's FFT on all cores."""
    return scipy.fft.irfftn(fk, s=(size,) * 3, axes=(0, 1, 2), workers=-1)


def potential_kernel(mesh: int, box: float) -> np.ndarray:
    """1 / (k^2 W(k)^2) on the ``rfftn`` grid of a ``mesh``^3 mesh over ``box`` Mpc/h ((Mpc/h)^2), 0 at
    k = 0: the modes of -phi (lap phi = delta) per density mode, with the CIC window W = prod sinc^2
    (one factor per axis) divided out for the deposit and the read-out (module docstring, force)."""
    cell = box / mesh
    kvec = wavenumbers(mesh, box)
    k2 = sum(kc**2 for kc in kvec)
    k2[0, 0, 0] = 1.0
    window = 1.0
    for kc in kvec:  # CIC window sinc^2 per axis, for deposit and read-out: sinc^4
        window = window * np.sinc(kc * cell / (2 * np.pi)) ** DECONVOLVE
    kernel = 1.0 / (k2 * window)
    kernel[0, 0, 0] = 0.0
    return kernel


def pm_force(pos: np.ndarray, n_particles: int, mesh: int, box: float, kernel: np.ndarray | None = None) -> np.ndarray:
    """F = -grad lap^-1 delta at the particles (3, n), Mpc/h, for particles at ``pos`` (3, n) Mpc/h
    (module docstring, force): the gravitational acceleration per unit 3/2 Omega_m / a. ``kernel``:
    :func:`potential_kernel` of this mesh and box, computed here where not given."""
    cell = box / mesh
    # the mesh sits half a cell off the lattice: CIC's response to a displacement is linear between
    # mesh points and has a kink at them, where the unperturbed lattice would sit
    x = pos / cell + 0.5
    rho = cic_deposit(x, mesh) * (mesh**3 / n_particles)
    pot_k = rfft3(rho - 1.0)
    del rho
    pot_k *= potential_kernel(mesh, box) if kernel is None else kernel
    forces = []
    for axis, kc in enumerate(wavenumbers(mesh, box)):
        fk = 1j * kc * pot_k
        if mesh % 2 == 0:  # the Nyquist plane's derivative is not a real field
            sl = [slice(None)] * 3
            sl[axis] = mesh // 2
            fk[tuple(sl)] = 0.0
        forces.append(irfft3(fk, mesh))
    return cic_readout(forces, x)


@dataclasses.dataclass(frozen=True)
class Particles:
    """The N-body's particles at the output, in lattice order (size^3 of them), float64."""

    displacement: np.ndarray  # (3, n) x - q in Mpc/h, the periodic image nearest to q
    velocity: np.ndarray  # (3, n) peculiar velocity in km/s


def run(
    delta_k: np.ndarray,
    size: int,
    box: float,
    z: float,
    cosmo: Cosmology,
    steps: int = STEPS,
    z_start: float = Z_START,
    mesh_factor: int = MESH_FACTOR,
    on_stage: Callable[[str], None] = lambda stage: None,
) -> Particles:
    """Evolve the ``size``^3 particles of the z = 0 linear modes ``delta_k`` (``rfftn`` layout; box
    ``box`` Mpc/h) from 2LPT at ``z_start`` to ``z`` in ``steps`` kick-drift-kick steps on a
    (``mesh_factor`` size)^3 force mesh (module docstring). ``on_stage`` hears each step."""
    if not z_start > z:
        raise ValueError(f"z_start {z_start}: expected above the output redshift {z}")
    a_out, a_start = 1 / (1 + z), 1 / (1 + z_start)
    mesh = mesh_factor * size
    q = np.indices((size,) * 3, dtype=np.float64).reshape(3, -1) * (box / size)
    psi1, psi2 = lpt_displacements(delta_k, size, box)
    d1, d1_prime = growth(cosmo, a_start)
    e_start = cosmo.E(z_start)
    pos = q + d1 * psi1 - 3 / 7 * d1**2 * psi2
    p = a_start**3 * e_start * (d1_prime * psi1 - 6 / 7 * d1 * d1_prime * psi2)
    del psi1, psi2
    n = size**3
    a_steps = np.linspace(a_start, a_out, steps + 1)
    d_of = lambda a: float(growth(cosmo, a)[0])
    kernel = potential_kernel(mesh, box)
    force = pm_force(pos % box, n, mesh, box, kernel)
    for i, (a0, a1) in enumerate(zip(a_steps[:-1], a_steps[1:])):
        on_stage(f"N-body step {i + 1} of {steps} (a = {a0:.3f} -> {a1:.3f}, {mesh}^3 force mesh)")
        a_half = 0.5 * (a0 + a1)
        p += force * ((momentum_growth(cosmo, a_half) - momentum_growth(cosmo, a0)) / d_of(a0))
        pos += p * ((d_of(a1) - d_of(a0)) / momentum_growth(cosmo, a_half))
        pos %= box
        force = pm_force(pos, n, mesh, box, kernel)
        p += force * ((momentum_growth(cosmo, a1) - momentum_growth(cosmo, a_half)) / d_of(a1))
    disp = (pos - q + box / 2) % box - box / 2
    return Particles(disp, 100.0 * p / a_out)
