"""validate: the metrics against an independent NumPy computation on a Gaussian field of known spectrum
and a noisy copy of it (r(k) = 1 / sqrt(1 + N/S) for added white noise), the baselines, units from the
files' attributes, errors for missing ones, and TF vs JAX predictions giving the same metrics."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from shared_data.core.errors import DatasetError, run_cli
from shared_data.data import generate, linear_field
from shared_data.inference import validate
from shared_data.inference.metrics import compute_metrics
from shared_data.inference.units import DENSITY, TEMPERATURE, linear, read_volume, units_from_files

L, VOXEL, T0, GAMMA = 32, 0.5, 1.0e4, 1.6
NOISE = 0.1  # std of the white noise added to rho / <rho> in the "prediction"


def _attrs(box=L * VOXEL, drop=()):
    attrs = {
        "Nbody_channels": json.dumps(generate.NBODY_CHANNELS),
        "Hydro_channels": json.dumps(generate.HYDRO_CHANNELS),
        "density_scale": 14.0,
        "temperature_scale": 8.0,
        "velocity_scale_km_s": 2000.0,
        "igm_T0_K": T0,
        "igm_gamma": GAMMA,
        "box_size_mpc_h": box,
        "transforms": json.dumps(
            {"temperature": f"x = ln(T / T0) / 8.0, T0 = {T0} K", "velocity": "x = v / 2000.0 km/s (peculiar velocity)"}
        ),
    }
    return {k: v for k, v in attrs.items() if k not in drop}


AMPLITUDE = 0.01  # P(k) = A k^-2 in (Mpc/h)^3, k in h/Mpc: delta of std ~0.1 on this grid


def _power(k):
    return np.where(k > 0, AMPLITUDE * np.maximum(k, 1e-9) ** -2.0, 0.0)


@pytest.fixture(scope="module")
def fields():
    """rho = 1 + delta (delta a Gaussian field of P(k) = A k^-2), its noisy copy and velocities."""
    rng = np.random.default_rng(7)
    delta = linear_field.irfft3(linear_field.gaussian_field_k(L, L * VOXEL, _power, rng), L)
    assert 0.05 < delta.std() < 0.2 and delta.min() > -0.9
    noise = NOISE * rng.standard_normal(delta.shape)
    assert (delta + noise).min() > -0.95
    vel = 0.01 * rng.standard_normal((3, L, L, L))
    return 1.0 + delta, 1.0 + delta + noise, vel


def _stored(rho, vel):
    """Hydro in stored units, T = T0 rho^(gamma - 1) (the IGM relation)."""
    x = np.log(rho) / 14.0
    return np.concatenate([x[None], ((GAMMA - 1) * np.log(rho) / 8.0)[None], vel]).astype(np.float32)


def _write(path, hydro, nbody=None, attrs=None):
    with h5py.File(path, "w") as f:
        f.create_dataset("Hydro", data=hydro)
        if nbody is not None:
            f.create_dataset("Nbody", data=nbody)
        for k, v in (attrs or {}).items():
            f.attrs[k] = v
    return path


def _pair(tmp_path, fields, truth_attrs=None, pred_attrs=None):
    rho, rho_noisy, vel = fields
    truth = _stored(rho, vel)
    nbody = np.concatenate([truth[:1], vel]).astype(np.float32)  # dark matter = the gas: a perfect baseline
    t = _write(tmp_path / "truth.h5", truth, nbody, _attrs() if truth_attrs is None else truth_attrs)
    p = _write(tmp_path / "pred.h5", _stored(rho_noisy, vel), None, _attrs() if pred_attrs is None else pred_attrs)
    return p, t


def _reference(a, b, box, edges):
    """P_ab per bin from the full complex FFT (every mode once), |k| in [lo, hi), the last bin up to
    and including the Nyquist wavenumber: (k_mean, P_ab, n)."""
    n = a.shape[0]
    k_f = 2 * np.pi / box
    fa, fb = np.fft.fftn(a), np.fft.fftn(b)
    p = (fa * np.conj(fb)).real * box**3 / n**6
    f = 2 * np.pi * np.fft.fftfreq(n, box / n)
    k = np.sqrt(f[:, None, None] ** 2 + f[None, :, None] ** 2 + f[None, None, :] ** 2)
    out = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        last = i == len(edges) - 2
        sel = (k >= lo) & ((k <= k_f * n / 2) if last else (k < hi))
        out.append((k[sel].mean(), p[sel].mean(), sel.sum()))
    return map(np.array, zip(*out))


def _delta(stored, scale=14.0):
    rho = np.exp(scale * stored.astype(np.float64))
    return rho / rho.mean() - 1


@pytest.mark.slow
def test_spectra_and_r_match_numpy_and_the_noise_model(tmp_path, fields):
    pred_path, truth_path = _pair(tmp_path, fields)
    m = validate.validate_files(pred_path, truth_path, tmp_path / "out")
    s = m["power"]["gas_density"]
    with h5py.File(truth_path) as f, h5py.File(pred_path) as g:
        dt, dp = _delta(f["Hydro"][0]), _delta(g["Hydro"][0])
    box, edges = L * VOXEL, np.asarray(m["k_edges_h_mpc"])
    k_f = 2 * np.pi / box
    np.testing.assert_allclose(edges, k_f * np.append(np.arange(0.5, L / 2, 1.0), L / 2), rtol=1e-8)
    assert m["k_nyquist_h_mpc"] == pytest.approx(np.pi / VOXEL) and len(s["k"]) == L // 2
    k, p_tt, n = _reference(dt, dt, box, edges)
    _, p_pp, _ = _reference(dp, dp, box, edges)
    _, p_pt, _ = _reference(dp, dt, box, edges)
    np.testing.assert_allclose(s["k"], k, rtol=1e-12)
    np.testing.assert_array_equal(s["n_modes"], n)
    np.testing.assert_allclose(s["P_true"], p_tt, rtol=1e-9)
    np.testing.assert_allclose(s["ratio_pred"], p_pp / p_tt, rtol=1e-9)
    np.testing.assert_allclose(s["r_pred"], p_pt / np.sqrt(p_pp * p_tt), rtol=1e-9)
    # the truth has the input spectrum (Gaussian sampling error sqrt(2 / n) per bin) ...
    kk = np.sqrt(sum(np.meshgrid(*[(2 * np.pi * np.fft.fftfreq(L, VOXEL)) ** 2] * 3, indexing="ij")))
    want = np.array([_power(kk[(kk >= lo) & (kk < hi)]).mean() for lo, hi in zip(edges[:-2], edges[1:-1])])
    assert np.all(np.abs(s["P_true"][:-1] / want - 1) < 5 * np.sqrt(2 / n[:-1]))
    # ... and white noise of variance sigma^2 has P_N = sigma^2 voxel^3, so with x = P_N / P_S
    # r = 1 / sqrt(1 + x) and P_pred / P_true = 1 + x, up to the signal x noise cross term and the
    # noise's own sampling error; propagated, they give per bin (n modes counted over the whole
    # k-space, Hermitian pairs twice) sigma_r = x / ((1 + x) sqrt(n)), sigma_ratio = 2 sqrt(x (1 + x) / n)
    x = NOISE**2 * VOXEL**3 / p_tt
    r_model, ratio_model = 1 / np.sqrt(1 + x), 1 + x
    z_r = (np.asarray(s["r_pred"]) - r_model) / (x / ((1 + x) * np.sqrt(n)))
    z_ratio = (np.asarray(s["ratio_pred"]) - ratio_model) / (2 * np.sqrt(x * (1 + x) / n))
    for z in (z_r, z_ratio):
        assert np.abs(z).max() < 4 and 0.3 < np.mean(z**2) < 3, z  # deviations of unit variance
    assert r_model.max() > 0.97 and r_model.min() < 0.5  # the test spans the signal- to the noise-dominated regime
    # the baseline (dark matter = gas here) is perfect: r = ratio = 1, and the IGM-relation temperature too
    for name in ("gas_density", "gas_temperature"):
        np.testing.assert_allclose(m["power"][name]["r_baseline"], 1, atol=1e-6)
        np.testing.assert_allclose(m["power"][name]["ratio_baseline"], 1, atol=1e-5)
        assert m["l1"][name]["baseline"] < 1e-7
    assert "IGM relation" in m["l1"]["gas_temperature"]["baseline_is"]
    assert m["l1"]["gas_vx"]["baseline_is"] == "dm_vx used as gas_vx"
    with h5py.File(truth_path) as f, h5py.File(pred_path) as g:
        for c, name in enumerate(generate.HYDRO_CHANNELS):
            l1 = np.mean(np.abs(g["Hydro"][c].astype(np.float64) - f["Hydro"][c]))
            assert m["l1"][name]["model"] == pytest.approx(l1, rel=1e-12)
    for pdf in m["pdf"].values():
        width = np.diff(pdf["edges"])
        for tag in ("true", "pred", "baseline"):
            assert np.sum(np.asarray(pdf[tag]) * width) == pytest.approx(1.0)
        assert pdf["l1_distance"]["baseline"] < 1e-6 < pdf["l1_distance"]["pred"]
    assert json.loads((tmp_path / "out" / "validation.json").read_text())["l1"] == m["l1"]
    png = (tmp_path / "out" / "validation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000


def test_units_come_from_the_attributes(tmp_path, fields):
    """A box twice as large: k halves, P (in (Mpc/h)^3) grows 8 times, r and the ratio are unchanged."""
    a = validate.validate_files(*_pair(tmp_path, fields), tmp_path / "a", plot=False)
    big = _attrs(box=2 * L * VOXEL)
    (tmp_path / "b").mkdir()
    b = validate.validate_files(*_pair(tmp_path / "b", fields, big, big), tmp_path / "b", plot=False)
    sa, sb = a["power"]["gas_density"], b["power"]["gas_density"]
    np.testing.assert_allclose(sb["k"], np.asarray(sa["k"]) / 2, rtol=1e-12)
    np.testing.assert_allclose(sb["P_true"], np.asarray(sa["P_true"]) * 8, rtol=1e-12)
    np.testing.assert_allclose(sb["r_pred"], sa["r_pred"], rtol=1e-12)
    assert b["voxel_size_mpc_h"] == 2 * VOXEL and b["units_sources"]["voxel_size"] == "truth.h5:box_size_mpc_h"
    # the temperature scale of a file that states it only in its transforms text
    old = _attrs(drop=("temperature_scale", "velocity_scale_km_s"))
    (tmp_path / "c").mkdir()
    c = validate.validate_files(*_pair(tmp_path / "c", fields, old, old), tmp_path / "c", plot=False)
    assert c["units_sources"]["temperature_scale"] == "truth.h5:transforms['temperature']"
    assert c["power"]["gas_temperature"]["r_pred"] == a["power"]["gas_temperature"]["r_pred"]


def test_linear_inverts_the_storage_transforms():
    """Stored x = ln(rho) / 14 and ln(T / T0) / 8 give rho and T back (float64); another channel is an
    error naming it."""
    from types import SimpleNamespace

    units = SimpleNamespace(density_scale=14.0, temperature_scale=8.0, temperature_T0=1.5e4)
    rho, temp = np.array([0.1, 1.0, 250.0]), np.array([3e3, 1.5e4, 2e6])
    np.testing.assert_allclose(linear(DENSITY, np.log(rho) / 14, units), rho, rtol=1e-12)
    stored = (np.log(temp / 1.5e4) / 8).astype(np.float32)
    np.testing.assert_allclose(linear(TEMPERATURE, stored, units), temp, rtol=1e-5)
    with pytest.raises(ValueError, match="'gas_vx'"):
        linear("gas_vx", stored, units)


@pytest.mark.parametrize(
    "drop, flag, value",
    [
        (("box_size_mpc_h",), "voxel_size", VOXEL),
        (("density_scale",), "density_scale", 14.0),
        (("temperature_scale", "transforms"), "temperature_scale", 8.0),
        (("igm_T0_K", "transforms"), "temperature_T0", T0),
        (("Hydro_channels",), "hydro_channels", ",".join(generate.HYDRO_CHANNELS)),
    ],
)
def test_missing_attribute_is_an_error_naming_the_flag(tmp_path, fields, drop, flag, value):
    bare = _attrs(drop=drop)
    pred, truth = _pair(tmp_path, fields, bare, bare)
    with pytest.raises(DatasetError, match=f"no attribute '{drop[0]}' .*--{flag.replace('temperature_T0', 'T0')}"):
        validate.validate_files(pred, truth, tmp_path / "out", plot=False)
    m = validate.validate_files(pred, truth, tmp_path / "out", {flag: value}, plot=False)
    assert m["units_sources"][flag] == f"flag --{flag.replace('temperature_T0', 'T0')}"
    assert m["side"] == L


@pytest.mark.slow
def test_files_that_disagree_and_cli_errors(tmp_path, fields, capsys):
    pred, truth = _pair(tmp_path, fields, _attrs(), _attrs(box=99.0))
    with pytest.raises(DatasetError, match="'box_size_mpc_h' differs between the files"):
        validate.validate_files(pred, truth, tmp_path / "out", plot=False)
    pred, truth = _pair(tmp_path, fields)
    with h5py.File(pred, "r+") as f:
        hydro = f["Hydro"][:4]
        del f["Hydro"]
        f.create_dataset("Hydro", data=hydro)
    with pytest.raises(DatasetError, match=r"Hydro \(4, 32, 32, 32\) differs from the truth's \(5, 32, 32, 32\)"):
        validate.validate_files(pred, truth, tmp_path / "out", plot=False)
    gamma_less = _attrs(drop=("igm_gamma",))
    pred, truth = _pair(tmp_path, fields, gamma_less, gamma_less)
    m = validate.validate_files(pred, truth, tmp_path / "out", plot=False)
    assert m["l1"]["gas_temperature"]["baseline"] is None and "r_baseline" not in m["power"]["gas_temperature"]
    bare = _attrs(drop=("box_size_mpc_h",))
    pred, truth = _pair(tmp_path, fields, bare, bare)
    assert run_cli(validate.main, ["--pred", str(pred), "--truth", str(truth), "--out", str(tmp_path / "o")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and "no attribute 'box_size_mpc_h'" in err[0] and "--voxel_size" in err[0]
    argv = ["--pred", str(pred), "--truth", str(truth), "--out", str(tmp_path / "o"), "--voxel_size", "0.5"]
    assert run_cli(validate.main, argv) == 0


@pytest.mark.slow
def test_tf_and_jax_predictions_give_the_same_metrics(tiny_cfg, data_dir, tmp_path):
    """The same canonical weights in both frameworks: predictions within float32 round-off, so L1
    within 1e-5 relative, P ratio and r(k) within 1e-4 per bin, PDF distances within 2e-3 (a voxel
    or two may land in a neighbouring histogram bin)."""
    from shared_data.model import unet_spec

    from jax_impl import predict as jax_predict
    from tf_impl import predict as tf_predict

    w = {k: v * 8 if k.endswith("kernel") else v + 0.01 for k, v in unet_spec.init_weights(tiny_cfg, 3).items()}
    unet_spec.save_weights(tmp_path / "w.npz", w)
    volume = data_dir / "val_24.h5"
    records = {}
    for name, fw in (("jax", jax_predict), ("tf", tf_predict)):
        out = tmp_path / f"{name}.h5"
        argv = ["--config", "cpu_tiny", "--weights", str(tmp_path / "w.npz"), "--input", str(volume), "--out", str(out)]
        assert fw.main([*argv, "--validate", str(tmp_path / name)]) == 0
        records[name] = json.loads((tmp_path / name / "validation.json").read_text())
    j, t = records["jax"], records["tf"]
    assert j["what"].startswith("JAX prediction") and t["what"].startswith("TensorFlow prediction")
    for name in j["l1"]:
        assert t["l1"][name]["model"] == pytest.approx(j["l1"][name]["model"], rel=1e-5)
        assert t["l1"][name]["baseline"] == j["l1"][name]["baseline"]
    for name in j["power"]:
        for key in ("ratio_pred", "r_pred"):
            np.testing.assert_allclose(t["power"][name][key], j["power"][name][key], atol=1e-4)
        np.testing.assert_array_equal(t["power"][name]["P_true"], j["power"][name]["P_true"])
        distance = j["pdf"][name]["l1_distance"]["pred"]
        assert t["pdf"][name]["l1_distance"]["pred"] == pytest.approx(distance, abs=2e-3)
    assert np.std(j["power"]["gas_density"]["r_pred"]) > 0.01  # structured predictions, not constants


def test_non_ml_baseline_is_the_filtered_generator_applied_to_the_input(tmp_path):
    """On a ``--gas filtered`` volume the non-ML baseline, computed by validate from the Nbody input
    alone, is the file's gas: r = 1, P ratio 1 and L1 at float32 rounding for density, temperature
    and velocities; on the ``nonlinear`` volume of the same seed it is not (r < 0.99 somewhere),
    while the dark matter as gas stays the other baseline, and both are logged."""
    metrics = {}
    for gas in ("filtered", "nonlinear"):
        path = tmp_path / f"{gas}.h5"
        generate.main(["--out", str(path), "--size", "16", "--seed", "2", "--gas", gas])
        hydro, attrs = read_volume(path, "Hydro")
        nbody, _ = read_volume(path, "Nbody")
        units = units_from_files({path: attrs}, 16, {})
        assert units.k_jeans == 6.0 and units.sources["k_jeans"] == f"{gas}.h5:k_jeans_h_mpc"
        metrics[gas] = compute_metrics(hydro, hydro, nbody, units)
    m = metrics["filtered"]
    for name in ("gas_density", "gas_temperature"):
        s = m["power"][name]
        np.testing.assert_allclose(s["r_non_ml"], 1, atol=1e-5)
        np.testing.assert_allclose(s["ratio_non_ml"], 1, atol=1e-4)
        assert s["summary"]["non_ml"]["r_mean"] == pytest.approx(1, abs=1e-5)
    for name in generate.HYDRO_CHANNELS:
        assert m["l1"][name]["non_ml"] < 2e-6 < m["l1"][name]["baseline"]
    assert (
        "Jeans-filtered" in m["l1"]["gas_vx"]["non_ml_is"] and "gamma = 1.6" in m["l1"]["gas_temperature"]["non_ml_is"]
    )
    nonlinear = metrics["nonlinear"]["power"]
    assert min(nonlinear["gas_temperature"]["r_non_ml"]) < 0.99 and min(nonlinear["gas_density"]["r_non_ml"]) < 0.99


def test_a_file_without_attributes_is_read_with_the_tutorials_transforms(tmp_path, fields, caplog):
    """The tutorial's layout (datasets only) in both files: the assumed units, said in one log line,
    give the metrics of the same volumes with the attributes; a flag still wins."""
    import logging

    pred_path, truth_path = _pair(tmp_path, fields, truth_attrs={}, pred_attrs={})
    with caplog.at_level(logging.INFO, logger="dlas.validate"):
        bare = validate.validate_files(pred_path, truth_path, tmp_path / "bare", plot=False)
    lines = [r.getMessage() for r in caplog.records if "has no attributes" in r.getMessage()]
    assert len(lines) == 1 and "rho = exp(14 x)" in lines[0] and "0.25 Mpc/h voxels" in lines[0]
    assert bare["units_sources"]["density_scale"] == "assumed (the tutorial's layout)"
    assert bare["voxel_size_mpc_h"] == 0.25
    attrs = _attrs(box=L * 0.25)
    attrs.update(k_jeans_h_mpc=6.0)
    (tmp_path / "with").mkdir()
    p2, t2 = _pair(tmp_path / "with", fields, truth_attrs=attrs, pred_attrs=attrs)
    full = validate.validate_files(p2, t2, tmp_path / "full", plot=False)
    assert bare["l1"] == full["l1"]
    for name in ("gas_density", "gas_temperature"):
        for key in ("r_pred", "r_baseline", "r_non_ml", "ratio_pred"):
            np.testing.assert_allclose(bare["power"][name][key], full["power"][name][key], rtol=1e-12)
    flagged = validate.validate_files(pred_path, truth_path, tmp_path / "flag", {"voxel_size": 0.5}, plot=False)
    assert flagged["voxel_size_mpc_h"] == 0.5
