"""The N-body dark matter (shared_data.data.nbody), CAMB's spectrum (boltzmann) and the gas from the
particles, against analytic cases on tiny meshes; and the v4 files of ``--dm zeldovich``, bit for bit."""

from __future__ import annotations

import hashlib

import h5py
import numpy as np
import pytest

from shared_data.data import boltzmann, gas_physics, generate, linear_field, nbody

#: SHA-256 of the Nbody and Hydro bytes written by generator v4 (commit 04b05ee, before the N-body) for
#: the arguments beside them: ``--dm zeldovich`` must reproduce them bit for bit.
V4_FILES = (
    (
        ["--size", "16", "--seed", "3", "--chunk", "16"],
        "853e8e415f62ffc52240cb819ccde525fe898d805816de634781c685c4864050",
        "bf01d0aae0c215f0077155bc6d3e9bec935f07e726a76d9c16396241254d439c",
    ),
    (
        ["--size", "20", "--seed", "7", "--box", "6", "--redshift", "3", "--chunk", "0"],
        "32232518b9e14556caacc99cab64c5bbfcde7f916c2adffd88638a77a71bf127",
        "27bda6b29ef812b301b35edfe7641323135da88b748a80ab27f9ea44207e797f",
    ),
)


@pytest.mark.parametrize("argv, nbody_sha, hydro_sha", V4_FILES)
def test_zeldovich_dark_matter_is_generator_v4_bit_for_bit(tmp_path, argv, nbody_sha, hydro_sha):
    out = tmp_path / "v4.h5"
    generate.main(["--out", str(out), *argv, "--dm", "zeldovich"])
    with h5py.File(out) as f:
        assert hashlib.sha256(f["Nbody"][...].tobytes()).hexdigest() == nbody_sha
        assert hashlib.sha256(f["Hydro"][...].tobytes()).hexdigest() == hydro_sha
        assert f.attrs["dm"] == "zeldovich" and f.attrs["spectrum"] == "bbks" and f.attrs["gas"] == "nonlinear"


def test_growth_is_exact_in_both_limits():
    """Omega_m = 1: D = a and dD/da = 1 (Einstein-de Sitter); LambdaCDM: within 0.5% of the Carroll,
    Press & Turner fit at z = 0..19, D(1) = 1, and dD/da the derivative of D (finite difference)."""
    eds = linear_field.Cosmology(Omega_m=1.0)
    d, dp = nbody.growth(eds, np.array([0.05, 0.3, 1.0]))
    np.testing.assert_allclose(d, [0.05, 0.3, 1.0], rtol=1e-10)
    np.testing.assert_allclose(dp, 1.0, rtol=1e-10)
    cosmo = linear_field.Cosmology()
    for z in (0.0, 2.0, 9.0, 19.0):
        assert float(nbody.growth(cosmo, 1 / (1 + z))[0]) == pytest.approx(cosmo.growth_factor(z), rel=5e-3)
    a, h = 0.4, 1e-5
    slope = (nbody.growth(cosmo, a + h)[0] - nbody.growth(cosmo, a - h)[0]) / (2 * h)
    assert float(nbody.growth(cosmo, a)[1]) == pytest.approx(float(slope), rel=1e-8)


def plane_wave_delta(size: int, box: float, eps: float) -> np.ndarray:
    """rfftn modes of delta = eps cos(k x), k the fundamental."""
    x = np.arange(size) * box / size
    delta = np.broadcast_to((eps * np.cos(2 * np.pi * x / box))[:, None, None], (size,) * 3)
    return np.fft.rfftn(delta)


def test_a_small_plane_wave_grows_as_d_whatever_the_steps():
    """delta = 1e-3 cos(k x) at z = 0 on 16^3: displacement at z = 2 is D(z=2) Psi1 (Psi1 = -eps sin(kx)/k)
    and velocity 100 a^2 E dD/da Psi1 km/s within 1e-3, with 1 step or 5 (FastPM's factors are exact
    for the Zel'dovich solution, exact in one dimension); no motion across the wave."""
    size, box, z = 16, 16.0, 2.0
    cosmo = linear_field.Cosmology()
    dk = plane_wave_delta(size, box, 1e-3)
    psi1, psi2 = nbody.lpt_displacements(dk, size, box)
    assert np.abs(psi2).max() < 1e-20  # one dimension: no second order
    a = 1 / (1 + z)
    d, dp = (float(v) for v in nbody.growth(cosmo, a))
    big = np.abs(psi1[0]) > 0.5 * np.abs(psi1[0]).max()
    for steps in (1, 5):
        p = nbody.run(dk, size, box, z, cosmo, steps=steps)
        np.testing.assert_allclose(p.displacement[0][big] / (d * psi1[0][big]), 1.0, atol=1e-3)
        v_lin = 100 * a**2 * cosmo.E(z) * dp * psi1[0][big]
        np.testing.assert_allclose(p.velocity[0][big] / v_lin, 1.0, atol=1e-3)
        assert np.abs(p.displacement[1:]).max() == 0.0


def test_2lpt_of_two_crossed_waves():
    """phi1 = A cos(kx) + B cos(ky) (delta = lap phi1): the 2LPT source is A B k^4 cos(kx) cos(ky), so
    phi2 = -A B k^2 cos(kx) cos(ky) / 2 and Psi2_x = grad_x phi2 = A B k^3 sin(kx) cos(ky) / 2."""
    size, box, amp_a, amp_b = 16, 16.0, 0.3, 0.2
    k = 2 * np.pi / box
    q = np.arange(size) * box / size
    x, y = np.meshgrid(q, q, indexing="ij")
    delta = -(k**2) * (amp_a * np.cos(k * x) + amp_b * np.cos(k * y))
    dk = np.fft.rfftn(np.broadcast_to(delta[..., None], (size,) * 3))
    psi1, psi2 = nbody.lpt_displacements(dk, size, box)
    want_x = amp_a * amp_b * k**3 * np.sin(k * x) * np.cos(k * y) / 2
    np.testing.assert_allclose(
        psi2[0].reshape((size,) * 3), np.broadcast_to(want_x[..., None], (size,) * 3), atol=1e-12
    )
    np.testing.assert_allclose(psi1[0].reshape((size,) * 3)[:, 0, 0], amp_a * k * np.sin(k * q), atol=1e-12)
    assert np.abs(psi2[2]).max() < 1e-14


def test_momentum_is_conserved_and_the_run_deterministic_by_seed():
    """A 16^3 box of the default spectrum: the total momentum stays 0 to round-off (the same CIC both
    ways and an odd gradient), the same seed gives the same bytes, another seed other particles."""
    size, box = 16, 4.0
    cosmo = linear_field.Cosmology(spectrum="camb")
    runs = []
    for seed in (1, 1, 2):
        dk = linear_field.gaussian_field_k(size, box, cosmo.linear_power, np.random.default_rng(seed))
        runs.append(nbody.run(dk, size, box, 2.0, cosmo, steps=4))
    v = runs[0].velocity
    assert np.abs(v.sum(1)).max() < 1e-9 * np.abs(v).sum(1).max()
    np.testing.assert_array_equal(runs[0].displacement, runs[1].displacement)
    assert not np.allclose(runs[0].displacement, runs[2].displacement)
    assert np.abs(runs[0].displacement).max() > 0.1 * box / size  # it moved


def test_camb_table_is_packaged_and_normalised(tmp_path, monkeypatch):
    """The default cosmology's table ships with the package (no CAMB run, no cache written); the
    spectrum is normalised to sigma_8; its shape is CAMB's, BBKS's within 20% over 0.01-10 h/Mpc."""
    monkeypatch.setenv("DLAS_COSMO_CACHE", str(tmp_path))
    cosmo = linear_field.Cosmology(spectrum="camb", sigma8=0.7)
    assert cosmo.sigma_r(8.0) == pytest.approx(0.7, rel=1e-6)
    assert not any(tmp_path.iterdir())
    k = np.geomspace(0.01, 10, 20)
    ratio = cosmo.linear_power(k) / linear_field.Cosmology(sigma8=0.7).linear_power(k)
    assert np.all(np.abs(ratio - 1) < 0.2), ratio
    with pytest.raises(ValueError, match="spectrum 'eh'"):
        linear_field.Cosmology(spectrum="eh")


def test_table_interpolation_is_log_log_with_power_law_ends():
    k = np.array([1.0, 10.0, 100.0])
    p = k**-2.0
    got = boltzmann.interpolate(k, p, np.array([0.1, 3.0, 1000.0, 0.0]))
    np.testing.assert_allclose(got[:3], [100.0, 1 / 9, 1e-6], rtol=1e-12)
    assert got[3] == 0.0


def test_dispersion_temperature_of_two_streams_is_the_strong_shock_and_of_a_halo_the_virial():
    """Two cold streams at +-u: sigma^2 = u^2 and T = mu m_p u^2 / (3 k_B), the strong-shock
    temperature of gas falling at u (gas_physics.shock_temperature with lambda_1 = sqrt(2), k = a H f);
    an isotropic dispersion sigma_1 per axis: T = mu m_p sigma_1^2 / k_B."""
    u = 150.0
    vel = np.array([[u, -u], [0.0, 0.0], [0.0, 0.0]])
    sigma2 = (vel**2).sum(0).mean() - (vel.mean(1) ** 2).sum()
    t = gas_physics.dispersion_temperature(sigma2)
    assert t == pytest.approx(float(gas_physics.shock_temperature(np.sqrt(2.0), 1.0, 1.0 / u)), rel=1e-12)
    assert gas_physics.dispersion_temperature(3 * 100.0**2) == pytest.approx(
        gas_physics.MU * gas_physics.PROTON_MASS_KG * 1e10 / gas_physics.BOLTZMANN_J_K, rel=1e-12
    )


def test_particle_heating_folds_a_plane_collapse_past_the_caustic():
    """Psi_x = -A sin(kq)/k with A = 2 (and k_J far above k): lambda_1 = A cos(kq), so the elements
    with A cos(kq) >= 1 are folded and no others; the shear offset has mean 0."""
    size, box, amp = 16, 4.0, 2.0
    k = 2 * np.pi / box
    q = np.arange(size) * box / size
    disp = np.zeros((3, size, size, size))
    disp[0] = (-amp * np.sin(k * q) / k)[:, None, None]
    folded, offset = gas_physics.particle_heating(disp.reshape(3, -1), size, box, k_jeans=1e6)
    lam = amp * np.cos(k * q)
    want = np.broadcast_to((lam >= 1 - 1e-9)[:, None, None], (size,) * 3).ravel()
    np.testing.assert_array_equal(folded.astype(bool), want)
    assert abs(offset.mean()) < 1e-12
