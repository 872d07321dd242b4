"""The generator: deterministic, physically consistent (P(k), T-rho relation), contract-abiding."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from conftest import run_in_process, run_module

from shared_data.data import cosmology, gas_physics, generate, inspect, linear_field
from shared_data.data.dataset import npy_paths


def test_deterministic_by_seed(tmp_path, data_dir):
    again = tmp_path / "again.h5"
    generate.main(["--out", str(again), "--size", "32", "--seed", "1", "--chunk", "16"])
    other = tmp_path / "other.h5"
    generate.main(["--out", str(other), "--size", "32", "--seed", "5", "--chunk", "16"])
    with h5py.File(data_dir / "train_32.h5") as a, h5py.File(again) as b, h5py.File(other) as c:
        for key in ("Nbody", "Hydro"):
            np.testing.assert_array_equal(a[key][...], b[key][...])
            assert not np.allclose(a[key][...], c[key][...])
        assert a.attrs["seed"] == 1 and a.attrs["box_size_mpc_h"] == 8.0


def test_deposit_workers_do_not_change_the_bytes(tmp_path, data_dir):
    """The particle deposit split over 2 forked processes (a fresh interpreter, as a user runs it)
    gives the volumes of the 1-process run bit for bit: the parts are summed in a fixed order."""
    out = tmp_path / "two.h5"
    res = run_module(
        "shared_data.data.generate", "--out", str(out), "--size", "32", "--seed", "1", "--chunk", "16", "--workers", "2"
    )
    assert res.returncode == 0, res.stderr
    with h5py.File(data_dir / "train_32.h5") as a, h5py.File(out) as b:
        for key in ("Nbody", "Hydro"):
            np.testing.assert_array_equal(a[key][...], b[key][...])


def test_linear_field_power_matches_input_spectrum():
    """Measured P(k) of the 64^3 linear field / input P(k): each bin within 5 sigma of 1 (sigma =
    sqrt(2 / N_modes), the Gaussian-field sampling error), and the mode-weighted mean within 3%,
    over 2 k_fundamental <= k <= 0.5 k_Nyquist."""
    size, box = 64, 64.0
    cosmo = linear_field.Cosmology()
    rng = np.random.default_rng(11)
    field = linear_field.irfft3(linear_field.gaussian_field_k(size, box, cosmo.linear_power, rng), size)
    k_f, k_nyq = 2 * np.pi / box, np.pi * size / box
    edges = np.arange(2 * k_f, 0.5 * k_nyq, k_f)
    k, p, n = linear_field.measure_power(field, box, edges)
    # compare with the input P averaged over the same modes
    kx, ky, kz = linear_field.wavenumbers(size, box)
    kk = np.sqrt(kx**2 + ky**2 + kz**2)
    ref = np.array([cosmo.linear_power(kk[(kk >= lo) & (kk < hi)]).mean() for lo, hi in zip(edges[:-1], edges[1:])])
    ratio = p / ref
    sigma = np.sqrt(2 / n)
    assert np.all(np.abs(ratio - 1) < 5 * sigma), (ratio, sigma)
    assert abs(np.average(ratio, weights=n) - 1) < 0.03


def test_sigma8_and_growth():
    cosmo = linear_field.Cosmology(sigma8=0.8)
    assert cosmo.sigma_r(8.0) == pytest.approx(0.8, rel=1e-6)
    assert cosmo.growth_factor(0.0) == pytest.approx(1.0)
    # matter domination: D ~ a at high z, so D(9)/D(19) ~ 2 within a few percent
    assert cosmo.growth_factor(9.0) / cosmo.growth_factor(19.0) == pytest.approx(2.0, rel=0.02)
    assert cosmo.growth_rate(50.0) == pytest.approx(1.0, abs=1e-3)


def test_fields_obey_physics(data_dir, tmp_path):
    """The session's file holds the default (nonlinear) gas: shapes, tanh range, mass conservation, a
    gas smoother than the dark matter, velocities that follow it, and a temperature that departs from
    the relation T = T0 (1 + delta)^(gamma - 1) (shock-heated cells above it); the ``filtered`` gas of
    the same seed obeys that relation exactly and has the same dark matter."""
    with h5py.File(data_dir / "train_32.h5") as f:
        nbody, hydro, attrs = f["Nbody"][...], f["Hydro"][...], dict(f.attrs)
    assert (
        attrs["gas"] == "nonlinear" and attrs["generator"] == f"shared_data.data.generate v{generate.GENERATOR_VERSION}"
    )
    assert nbody.shape == (4, 32, 32, 32) and hydro.shape == (5, 32, 32, 32) and hydro.dtype == np.float32
    assert np.abs(hydro).max() < 1
    # mass conservation: the deposit keeps the mean density at 1
    rho_dm = np.exp(14 * nbody[0].astype(np.float64))
    assert rho_dm[rho_dm > 1.5e-3].sum() / rho_dm.size == pytest.approx(1.0, abs=0.02)
    gamma = attrs["igm_gamma"]
    excess = 8 * hydro[1].astype(np.float64) - (gamma - 1) * 14 * hydro[0].astype(np.float64)  # ln(T / relation)
    assert np.log(5.0) < excess.max() and (excess > np.log(2.0)).mean() > 0.01  # shock-heated: > 5x, > 2x
    assert hydro[0].std() < nbody[0].std()
    assert np.corrcoef(hydro[2].ravel(), nbody[1].ravel())[0, 1] > 0.9
    filtered = tmp_path / "filtered.h5"
    generate.main(["--out", str(filtered), "--size", "32", "--seed", "1", "--chunk", "16", "--gas", "filtered"])
    with h5py.File(filtered) as f:
        np.testing.assert_array_equal(f["Nbody"][...], nbody)
        hydro_f, gas = f["Hydro"][...].astype(np.float64), f.attrs["gas"]
    assert gas == "filtered"
    rho_gas_log = 14 * hydro_f[0]
    ok = rho_gas_log > np.log(1e-3) + 1e-3
    np.testing.assert_allclose(8 * hydro_f[1][ok], (gamma - 1) * rho_gas_log[ok], atol=1e-5)


#: SHA-256 of the Nbody and Hydro bytes written by generator v2 (commit 37d57ef, before the nonlinear gas)
#: for the arguments beside them: ``--gas filtered --dm zeldovich`` must reproduce them bit for bit.
V2_FILES = (
    (
        ["--size", "16", "--seed", "3", "--chunk", "16"],
        "853e8e415f62ffc52240cb819ccde525fe898d805816de634781c685c4864050",
        "70c4c0ded9927732becac4e70ca921bbb1eb835bf8e09da1f58722a9d4ae9a3b",
    ),
    (
        ["--size", "20", "--seed", "7", "--box", "6", "--redshift", "3", "--chunk", "0"],
        "32232518b9e14556caacc99cab64c5bbfcde7f916c2adffd88638a77a71bf127",
        "e6bb3bf2b469bcb5908c69f3e927fe1520e78757dac1ab8685cd03ee051260b1",
    ),
)


@pytest.mark.parametrize("argv, nbody_sha, hydro_sha", V2_FILES)
def test_filtered_gas_is_generator_v2_bit_for_bit(tmp_path, argv, nbody_sha, hydro_sha):
    import hashlib

    out = tmp_path / "v2.h5"
    generate.main(["--out", str(out), *argv, "--gas", "filtered", "--dm", "zeldovich"])
    with h5py.File(out) as f:
        assert hashlib.sha256(f["Nbody"][...].tobytes()).hexdigest() == nbody_sha
        assert hashlib.sha256(f["Hydro"][...].tobytes()).hexdigest() == hydro_sha
        assert f.attrs["gas"] == "filtered" and json.loads(f.attrs["gas_model"])["name"] == "filtered"


def test_symmetric_eigenvalues_match_lapack():
    """The closed form against numpy's eigvalsh (float64) on random symmetric matrices, and on
    degenerate ones (a multiple of the identity, two equal eigenvalues), largest first."""
    rng = np.random.default_rng(4)
    a = rng.normal(size=(500, 3, 3))
    a = a + np.swapaxes(a, 1, 2)
    a[0] = 2.5 * np.eye(3)
    a[1] = np.diag([1.0, 1.0, -3.0])
    comps = [a[:, 0, 0], a[:, 1, 1], a[:, 2, 2], a[:, 0, 1], a[:, 0, 2], a[:, 1, 2]]
    got = gas_physics.symmetric_eigenvalues(comps)
    np.testing.assert_allclose(got.T, np.linalg.eigvalsh(a)[:, ::-1], atol=1e-9)


def plane_wave_psi(size: int, box: float, amplitude: float, n: int = 1) -> np.ndarray:
    """rfftn modes of the plane-wave displacement Psi_x = -A sin(k q_x) / k, k = 2 pi n / box."""
    q = np.arange(size) * box / size
    k = 2 * np.pi * n / box
    psi = np.zeros((3, size, size, size))
    psi[0] = (-amplitude * np.sin(k * q) / k)[:, None, None]
    return np.stack([np.fft.rfftn(p) for p in psi])


def test_plane_wave_collapse_deformation_and_shock_temperature():
    """Psi_x = -A sin(kq)/k: deformation eigenvalues (A cos kq, 0, 0) sorted, k_* = k, and the shock
    temperature mu m_p u^2 / (3 k_B) with u = a H f sqrt(A^2 cos^2 - 1) / k where A cos kq > 1, 0 elsewhere."""
    size, box, amp = 16, 4.0, 2.0
    psi_k = plane_wave_psi(size, box, amp)
    k = 2 * np.pi / box
    lam = amp * np.cos(k * np.arange(size) * box / size)
    eig = gas_physics.deformation_eigenvalues(psi_k, size, box)
    want = np.sort(np.stack([lam, 0 * lam, 0 * lam]), axis=0)[::-1]
    np.testing.assert_allclose(eig[:, :, 3, 5], want, atol=1e-7)  # two equal eigenvalues: sqrt(eps) accuracy
    assert gas_physics.characteristic_wavenumber(psi_k, size, box) == pytest.approx(k, rel=1e-12)
    vel_factor = 96.0
    t = gas_physics.shock_temperature(eig[0][:, 0, 0], vel_factor, k)
    u = vel_factor * np.sqrt(np.maximum(lam**2 - 1, 0) * (lam > 0)) / k * 1e3  # m/s
    np.testing.assert_allclose(t, 0.59 * 1.67262192e-27 * u**2 / (3 * 1.380649e-23), rtol=1e-12)
    assert t[0] == pytest.approx(0.59 * 1.67262192e-27 * (96e3 * np.sqrt(3) / k) ** 2 / (3 * 1.380649e-23))
    assert (t[np.abs(lam) < 1] == 0).all() and (t[lam > 1] > 1e4).all()


def test_spreading_the_gas_conserves_mass_and_momentum():
    """The N-body's gas (spreading_jeans_filter): on a random clumpy field with Jeans levels beyond the
    filters' range, the mean density is the input's to 1e-12 (each filter keeps k = 0); the velocity
    is a weighted mean of the input's (inside its range per axis, to the FFT's round-off; a uniform
    flow stays that flow); with log_jeans 0 everywhere, the density is jeans_filter's and the velocity
    the filtered momentum over the filtered density. The per-voxel mix of v4's gas
    (adaptive_jeans_filter) loses mass where a dense blob is hot: its mean density falls by more than
    5% on the same field, which is what the spreading form is for."""
    size, box, k_jeans = 16, 16.0, 3.0
    rng = np.random.default_rng(4)
    rho = np.exp(rng.normal(0.0, 1.0, (size,) * 3))
    v = rng.normal(0.0, 100.0, (3, size, size, size))
    level = rng.uniform(-1.5, 2.5, (size,) * 3)
    rho_gas, v_gas = gas_physics.spreading_jeans_filter(rho, v, box, k_jeans, level)
    assert rho_gas.mean() == pytest.approx(rho.mean(), rel=1e-12)
    _, uniform = gas_physics.spreading_jeans_filter(rho, np.full((3, size, size, size), 7.0), box, k_jeans, level)
    np.testing.assert_allclose(uniform, 7.0, rtol=1e-12)  # a uniform flow stays that flow
    span = v.max(axis=(1, 2, 3)) - v.min(axis=(1, 2, 3))
    assert (v_gas.min(axis=(1, 2, 3)) >= v.min(axis=(1, 2, 3)) - 1e-9 * span).all()
    assert (v_gas.max(axis=(1, 2, 3)) <= v.max(axis=(1, 2, 3)) + 1e-9 * span).all()
    rho0, v0 = gas_physics.spreading_jeans_filter(rho, v, box, k_jeans, np.zeros((size,) * 3))
    np.testing.assert_allclose(rho0, gas_physics.jeans_filter(rho, box, k_jeans), rtol=1e-12)
    momentum = np.stack([gas_physics.jeans_filter(rho * c, box, k_jeans) for c in v])
    np.testing.assert_allclose(v0, momentum / gas_physics.jeans_filter(rho, box, k_jeans), rtol=1e-9)
    blob = np.ones((size,) * 3)
    blob[6:10, 6:10, 6:10] = 50.0
    hot = np.where(blob > 1, 2.0, 0.0)  # 100 T0 in the blob
    mixed = gas_physics.adaptive_jeans_filter([blob], box, k_jeans, hot)[0]
    spread, _ = gas_physics.spreading_jeans_filter(blob, np.zeros((3, size, size, size)), box, k_jeans, hot)
    assert mixed.mean() < 0.95 * blob.mean() and spread.mean() == pytest.approx(blob.mean(), rel=1e-12)


def test_the_nbody_gas_holds_the_dark_matters_mass():
    """Generator v6 on a 32^3 volume (the N-body, the nonlinear gas): the gas's mean density is the dark
    matter's to 1e-9 and its power over the dark matter's in the largest-scale bin (0.15-0.4 h/Mpc of a
    32 Mpc/h box) is within 20% of 1 (pressure acts below the Jeans length, not on the box's scale);
    the gas density peaks above 10x the mean (the halos keep their gas)."""
    cosmo = cosmology.cosmology_for("nbody")
    f = cosmology.simulate(32, 32.0, 2.0, 3, cosmo, 6.0, 1e4, 1.6, gas="nonlinear", dm="nbody")
    assert f.rho_gas.mean() == pytest.approx(f.rho_dm.mean(), rel=1e-9)
    edges = np.array([0.15, 0.4])
    _, p_gas, _ = linear_field.measure_power(f.rho_gas - 1.0, 32.0, edges)
    _, p_dm, _ = linear_field.measure_power(f.rho_dm - 1.0, 32.0, edges)
    assert p_gas[0] / p_dm[0] == pytest.approx(1.0, abs=0.2)
    assert f.rho_gas.max() > 10.0


def test_uniform_field_gives_the_photo_heated_gas_at_rest():
    """No perturbation: density 1, velocity 0, T = T0 everywhere (no shock, no scatter); with the He II
    offset m, T = T0 10^m exactly and the same density and velocity (the offset does not smooth)."""
    size = 8
    for m in (np.zeros((size,) * 3), gas_physics.reionization_offset(size, 16.0, 3)):
        rho, temp, v = gas_physics.nonlinear_gas(
            np.ones((size,) * 3), np.zeros((3, size, size, size)), np.zeros((size,) * 3), np.zeros((size,) * 3), m,
            16.0, 6.0, 1e4, 1.6,
        )  # fmt: skip
        np.testing.assert_allclose(rho, 1.0, atol=1e-12)
        np.testing.assert_allclose(temp, 1e4 * 10**m, rtol=1e-12)
        np.testing.assert_allclose(v, 0.0, atol=1e-12)
    assert m.std() > 0.1  # the second case has an offset to follow


def test_reionization_offset_is_a_smooth_field_independent_of_the_density():
    """m(x): mean 0, standard deviation HE2_DEX, deterministic by seed and other for another seed; its
    power falls as exp(-(k R)^2) (the ratio of two shells' mean power within 30% of the form's on a
    64 Mpc/h box); uncorrelated with the same seed's linear density (|r| < 0.15)."""
    size, box = 32, 64.0
    m = gas_physics.reionization_offset(size, box, 5)
    assert abs(m.mean()) < 1e-12 and m.std() == pytest.approx(gas_physics.HE2_DEX, rel=1e-12)
    np.testing.assert_array_equal(m, gas_physics.reionization_offset(size, box, 5))
    assert not np.allclose(m, gas_physics.reionization_offset(size, box, 6))
    edges = np.array([0.09, 0.2, 0.3])
    k, p, _ = linear_field.measure_power(m, box, edges)
    shape = np.exp(-((k * gas_physics.HE2_RADIUS_MPC_H) ** 2))
    assert p[1] / p[0] == pytest.approx(shape[1] / shape[0], rel=0.3)
    cosmo = linear_field.Cosmology()
    delta = cosmology.simulate(size, box, 2.0, 5, cosmo, 6.0, 1e4, 1.6, gas="filtered", dm="zeldovich").delta_linear
    assert abs(np.corrcoef(m.ravel(), delta.ravel())[0, 1]) < 0.15


@pytest.mark.parametrize("dm", cosmology.DM_MODELS)
def test_linear_limit_of_the_nonlinear_gas_is_the_filtered_gas(dm):
    """At sigma_8 = 1e-4 nothing shocks and T -> T0 10^m (m: the He II offset, independent of the
    amplitude): the nonlinear gas is the filtered one with its temperature times 10^m, its overdensity,
    temperature excess and velocity within 1e-3 of their rms (the departures vanish with the
    amplitude), while at sigma_8 = 0.81 they differ: by over 10% in density, over 50% in the
    temperature excess and over 2% in velocity on this 4 Mpc/h box."""
    args = (16, 4.0, 2.0, 5)
    devs = {}
    he2 = 10 ** gas_physics.reionization_offset(16, 4.0, 5)
    for sigma8 in (1e-4, 0.81):
        cosmo = linear_field.Cosmology(sigma8=sigma8)
        nl = cosmology.simulate(*args, cosmo, 6.0, 1e4, 1.6, gas="nonlinear", dm=dm)
        lin = cosmology.simulate(*args, cosmo, 6.0, 1e4, 1.6, gas="filtered", dm=dm)
        pairs = (
            (nl.rho_gas - 1, lin.rho_gas - 1),
            (nl.temperature / he2 - 1e4, lin.temperature - 1e4),
            (nl.v_gas, lin.v_gas),
        )
        devs[sigma8] = np.array([np.sqrt(np.mean((a - b) ** 2) / np.mean(b**2)) for a, b in pairs])
    assert (devs[1e-4] < 1e-3).all(), devs
    assert (devs[0.81] > [0.1, 0.5, 0.02]).all(), devs


def test_npy_conversion_is_dhwc_of_the_h5(data_dir):
    nb, hy = npy_paths(data_dir / "train_32.h5")
    with h5py.File(data_dir / "train_32.h5") as f:
        np.testing.assert_array_equal(np.load(nb), np.moveaxis(f["Nbody"][...], 0, -1))
        np.testing.assert_array_equal(np.load(hy), np.moveaxis(f["Hydro"][...], 0, -1))


def test_inspect_cli_passes_good_and_fails_bad_files(data_dir, tmp_path):
    good = run_in_process(inspect.main, [str(data_dir / "train_32.h5")])
    assert good.returncode == 0 and "contract: OK" in good.stdout and "gas_temperature" in good.stdout
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f["Nbody"] = np.zeros((4, 8, 8, 8), np.float32)
        h = np.zeros((5, 8, 8, 8), np.float32)
        h[1, 0, 0, 0] = np.inf
        f["Hydro"] = h
    res = run_in_process(inspect.main, [str(bad)])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "bad.h5: Hydro channel ch1 has 1 NaN/inf values" in res.stderr
    with h5py.File(bad, "w") as f:
        f["Nbody"] = np.zeros((4, 8, 8, 8), np.float32)
        f["Hydro"] = np.full((5, 8, 8, 8), 1.5, np.float32)
    res = run_in_process(inspect.main, [str(bad)])
    assert res.returncode == 2 and "targets must lie inside tanh's (-1, 1)" in res.stderr
    missing = run_in_process(inspect.main, [str(tmp_path / "none.h5")])
    assert (
        missing.returncode == 2
        and missing.stderr.startswith("error: dataset file")
        and "Traceback" not in missing.stderr
    )


def test_tutorial_layout_file_without_attributes_loads(tmp_path):
    """A file with only the two datasets (the tutorial's downsamp_*.h5 layout) reads unchanged."""
    from shared_data.data import crop_readers

    path = tmp_path / "downsamp_like.h5"
    rng = np.random.default_rng(0)
    nbody, hydro = rng.random((4, 32, 32, 32), np.float32), rng.random((5, 32, 32, 32), np.float32) - 0.5
    with h5py.File(path, "w") as f:
        f["Nbody"], f["Hydro"] = nbody, hydro
    r = crop_readers.InMemReader(path, 4, 5, 16)
    bi, bt = np.empty((4, 16, 16, 16), np.float32), np.empty((5, 16, 16, 16), np.float32)
    r.read((1, 2, 3), bi, bt)
    np.testing.assert_array_equal(bt, hydro[:, 1:17, 2:18, 3:19])
    assert run_in_process(inspect.main, [str(path)]).returncode == 0


def reference_dm_density(size: int, box: float, z: float, seed: int, cosmo, per_side: int = 4) -> np.ndarray:
    """The generator's truncated Zel'dovich dark matter rebuilt independently of its deposit: the same
    linear field and displacement (module docstring of ``dark_matter``, step 4), carried by per_side^3
    particles per cell (Fourier-shifted displacements), deposited with a triangular-shaped cloud written
    here. With 4^3 particles the lattice's ripple in a void stretched 1.5x per axis is 0.2% of the mean."""
    delta_k = linear_field.gaussian_field_k(size, box, cosmo.linear_power, np.random.default_rng(seed))
    k_nl = linear_field.nonlinear_wavenumber(cosmo, z, k_max=np.sqrt(3) * np.pi * size / box)
    kx, ky, kz = linear_field.wavenumbers(size, box)
    k2 = kx**2 + ky**2 + kz**2
    k2[0, 0, 0] = 1.0
    psi_k = [
        1j * kc / k2 * delta_k * linear_field.Cosmology.growth_factor(cosmo, z) * np.exp(-0.5 * k2 / k_nl**2)
        for kc in (kx, ky, kz)
    ]
    cell = box / size
    rho = np.zeros(size**3)
    lattice = np.indices((size,) * 3, dtype=np.float64).reshape(3, -1)
    offsets = (np.arange(per_side) + 0.5) / per_side - 0.5
    for o in np.stack(np.meshgrid(offsets, offsets, offsets, indexing="ij")).reshape(3, -1).T:
        shift = np.exp(1j * (kx * o[0] + ky * o[1] + kz * o[2]) * cell)
        pos = (
            lattice
            + o[:, None]
            + np.stack([np.fft.irfftn(p * shift, s=(size,) * 3, axes=(0, 1, 2)).ravel() for p in psi_k]) / cell
        )
        nearest = np.rint(pos)
        d = pos - nearest
        w = np.stack([0.5 * (0.5 - d) ** 2, 0.75 - d**2, 0.5 * (0.5 + d) ** 2])  # (3 offsets, 3 axes, n)
        i = ((nearest[None] + np.arange(-1, 2)[:, None, None]) % size).astype(np.int64)
        idx = (i[:, None, None, 0] * size + i[None, :, None, 1]) * size + i[None, None, :, 2]  # (3, 3, 3, n)
        weight = w[:, None, None, 0] * w[None, :, None, 1] * w[None, None, :, 2] / per_side**3
        rho += np.bincount(idx.ravel(), weights=weight.ravel(), minlength=size**3)
    return rho.reshape((size,) * 3)


def test_dark_matter_shows_no_particle_lattice_and_no_floor(tmp_path):
    """The stored dark-matter density of a 32^3 file of the Zel'dovich dark matter against the converged
    deposit of the same displacements (4^3 particles per cell): no voxel at the density floor and the
    emptiest voxel within a factor 2 of the reference's (one particle per cell with CIC: 0.024 against
    0.21); in the voids (reference below half the mean) ln(rho) within 0.05 rms (one particle per cell with CIC: 0.37);
    and no excess power along the grid axes, where the lattice's plaid puts it: over
    1/4 <= k / k_Nyquist < 1 the power of ln(rho) in modes within 10 degrees of an axis, relative to
    the reference's, at most 5% above that of all other modes (one particle per cell with CIC: 4.6x)."""
    path = tmp_path / "zeldovich_32.h5"
    generate.main(["--out", str(path), "--size", "32", "--seed", "1", "--chunk", "16", "--dm", "zeldovich"])
    with h5py.File(path) as f:
        x_dm, attrs = f["Nbody"][0].astype(np.float64), dict(f.attrs)
    size, box, z = 32, attrs["box_size_mpc_h"], attrs["redshift"]
    ref = reference_dm_density(size, box, z, int(attrs["seed"]), linear_field.Cosmology(sigma8=0.81))
    assert ref.sum() == pytest.approx(size**3)
    floor = np.log(generate.RHO_FLOOR) / generate.DENSITY_SCALE
    assert int((x_dm <= floor + 1e-6).sum()) == 0
    assert np.exp(14 * x_dm.min()) > 0.5 * ref.min()
    log_rho, log_ref = 14 * x_dm, np.log(np.maximum(ref, 1e-3))
    void = ref < 0.5
    assert void.mean() > 0.05  # enough void to see the lattice in
    assert np.sqrt(np.mean((log_rho - log_ref)[void] ** 2)) < 0.05
    n = np.fft.fftfreq(size, 1.0 / size)
    kvec = np.abs(np.stack(np.meshgrid(n, n, n, indexing="ij")))
    k = np.sqrt((kvec**2).sum(0))
    shell = (k >= size / 8) & (k < size / 2)
    along = shell & (kvec.max(0) >= np.cos(np.radians(10.0)) * k)
    p, p_ref = (np.abs(np.fft.fftn(f - f.mean())) ** 2 for f in (log_rho, log_ref))
    excess = (p[along].sum() / p_ref[along].sum()) / (p[shell & ~along].sum() / p_ref[shell & ~along].sum())
    assert excess < 1.05, excess


def test_dark_matter_is_the_linear_field_through_the_tsc_window_at_small_amplitude():
    """At sigma_8 = 1e-4 the Zel'dovich density is linear, so each mode of the deposited overdensity is
    D(z) delta_lin(k) (the input spectrum's field) times the deposit's response, which up to
    k_Nyquist / 4 is the TSC window prod_i sinc^3(k_i dx / 2) (Hockney & Eastwood 1988) within 1%
    (the 2^3 sub-lattice moves it by 0.65% at k_Nyquist / 4 on the axes; a CIC deposit is 3% off
    there), and keeps the phase. Second order in delta ~ 1e-4 is far below."""
    size, box, z = 32, 8.0, 2.0
    cosmo = linear_field.Cosmology(sigma8=1e-4)
    f = cosmology.simulate(size, box, z, 3, cosmo, 6.0, 1e4, 1.6, dm="zeldovich")
    ratio = np.fft.rfftn(f.rho_dm - 1.0) / (cosmo.growth_factor(z) * np.fft.rfftn(f.delta_linear))
    kx, ky, kz = linear_field.wavenumbers(size, box)
    dx = box / size
    window = (np.sinc(kx * dx / (2 * np.pi)) * np.sinc(ky * dx / (2 * np.pi)) * np.sinc(kz * dx / (2 * np.pi))) ** 3
    k = np.sqrt(kx**2 + ky**2 + kz**2)
    low = (k > 0) & (k <= 0.25 * np.pi / dx)
    assert low.sum() > 100
    np.testing.assert_allclose(ratio[low].real, window[low], atol=1e-2)
    assert np.abs(ratio[low].imag).max() < 5e-3


def test_if_missing_keeps_a_file_of_another_generator_version_and_says_so(tmp_path, capsys):
    old = tmp_path / "old.h5"
    with h5py.File(old, "w") as f:
        f["Nbody"], f["Hydro"] = np.zeros((4, 8, 8, 8), np.float32), np.zeros((5, 8, 8, 8), np.float32)
        f.attrs["generator"] = "shared_data.data.generate v1"
    assert generate.main(["--out", str(old), "--size", "8", "--if-missing"]) == 0
    assert capsys.readouterr().out == (
        f"{old} exists; not regenerated (written by shared_data.data.generate v1, "
        f"this is v{generate.GENERATOR_VERSION}: delete it to regenerate)\n"
    )
    with h5py.File(old) as f:
        assert not f["Hydro"][...].any()  # kept as it was
    new = tmp_path / "new.h5"
    generate.main(["--out", str(new), "--size", "8", "--box", "2"])
    capsys.readouterr()
    generate.main(["--out", str(new), "--size", "8", "--if-missing"])
    assert capsys.readouterr().out == f"{new} exists; not regenerated\n"
    generate.main(["--out", str(new), "--size", "8", "--if-missing", "--gas", "filtered"])
    assert capsys.readouterr().out == (
        f"{new} exists; not regenerated (it holds the nonlinear gas, not --gas filtered: delete it to regenerate)\n"
    )
    generate.main(["--out", str(new), "--size", "8", "--if-missing", "--dm", "zeldovich"])
    assert capsys.readouterr().out == (
        f"{new} exists; not regenerated (it holds the nbody dark matter, not --dm zeldovich: delete it to regenerate)\n"
    )
