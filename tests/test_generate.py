"""The generator: deterministic, physically consistent (P(k), T-rho relation), contract-abiding."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import run_in_process

from shared_data.data import cosmology, generate, inspect
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


def test_linear_field_power_matches_input_spectrum():
    """Measured P(k) of the 64^3 linear field / input P(k): each bin within 5 sigma of 1 (sigma =
    sqrt(2 / N_modes), the Gaussian-field sampling error), and the mode-weighted mean within 3%,
    over 2 k_fundamental <= k <= 0.5 k_Nyquist."""
    size, box = 64, 64.0
    cosmo = cosmology.Cosmology()
    rng = np.random.default_rng(11)
    field = cosmology.irfft3(cosmology.gaussian_field_k(size, box, cosmo.linear_power, rng), size)
    k_f, k_nyq = 2 * np.pi / box, np.pi * size / box
    edges = np.arange(2 * k_f, 0.5 * k_nyq, k_f)
    k, p, n = cosmology.measure_power(field, box, edges)
    # compare with the input P averaged over the same modes
    kx, ky, kz = cosmology.wavenumbers(size, box)
    kk = np.sqrt(kx**2 + ky**2 + kz**2)
    ref = np.array([cosmo.linear_power(kk[(kk >= lo) & (kk < hi)]).mean() for lo, hi in zip(edges[:-1], edges[1:])])
    ratio = p / ref
    sigma = np.sqrt(2 / n)
    assert np.all(np.abs(ratio - 1) < 5 * sigma), (ratio, sigma)
    assert abs(np.average(ratio, weights=n) - 1) < 0.03


def test_sigma8_and_growth():
    cosmo = cosmology.Cosmology(sigma8=0.8)
    assert cosmo.sigma_r(8.0) == pytest.approx(0.8, rel=1e-6)
    assert cosmo.growth_factor(0.0) == pytest.approx(1.0)
    # matter domination: D ~ a at high z, so D(9)/D(19) ~ 2 within a few percent
    assert cosmo.growth_factor(9.0) / cosmo.growth_factor(19.0) == pytest.approx(2.0, rel=0.02)
    assert cosmo.growth_rate(50.0) == pytest.approx(1.0, abs=1e-3)


def test_fields_obey_physics(data_dir):
    with h5py.File(data_dir / "train_32.h5") as f:
        nbody, hydro, attrs = f["Nbody"][...], f["Hydro"][...], dict(f.attrs)
    assert nbody.shape == (4, 32, 32, 32) and hydro.shape == (5, 32, 32, 32) and hydro.dtype == np.float32
    assert np.abs(hydro).max() < 1
    # mass conservation: CIC deposit keeps the mean density at 1
    rho_dm = np.exp(14 * nbody[0].astype(np.float64))
    assert rho_dm[rho_dm > 1.5e-3].sum() / rho_dm.size == pytest.approx(1.0, abs=0.02)
    # T = T0 (1 + delta)^(gamma - 1): ln(T/T0) / 8 = (gamma - 1) ln(rho) where rho above the floor
    gamma = attrs["igm_gamma"]
    rho_gas_log = 14 * hydro[0].astype(np.float64)
    ok = rho_gas_log > np.log(1e-3) + 1e-3
    np.testing.assert_allclose(8 * hydro[1][ok], (gamma - 1) * rho_gas_log[ok], atol=1e-5)
    # gas is smoother than dark matter; velocities stay close
    assert hydro[0].std() < nbody[0].std()
    assert np.corrcoef(hydro[2].ravel(), nbody[1].ravel())[0, 1] > 0.9


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
