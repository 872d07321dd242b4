"""predict: the receptive margin measured on the network, the tiling plan, tiled == whole volume in
both frameworks, padding, checkpoints, the output file and the input errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shared_data.core import config as config_mod
from shared_data.core.errors import ConfigError, DatasetError, run_cli
from shared_data.data import generate
from shared_data.inference import predict as predict_mod
from shared_data.inference import tiling
from shared_data.model import unet_spec

from jax_impl import model as jax_model
from jax_impl import predict as jax_predict


def _weights(cfg, seed=1):
    """Weights with kernels of std 0.16 (8 x the init) and small positive biases: outputs of std ~0.3,
    far from zero and from tanh's saturation, so differences show."""
    return {k: v * 8 if k.endswith("kernel") else v + 0.01 for k, v in unet_spec.init_weights(cfg, seed).items()}


@pytest.fixture(scope="module")
def cfg():
    return config_mod.load_config("cpu_tiny")


@pytest.fixture(scope="module")
def vol64(tmp_path_factory):
    """A generated 64^3 volume: larger than the smallest seamless tile (56) of cpu_tiny."""
    path = tmp_path_factory.mktemp("vol") / "vol64.h5"
    generate.main(["--out", str(path), "--size", "64", "--seed", "3", "--chunk", "16"])
    return path


@pytest.fixture(scope="module")
def weights_file(cfg, tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "w.npz"
    unet_spec.save_weights(path, _weights(cfg))
    return path


@pytest.mark.slow
def test_receptive_margin_is_the_networks_dependency_window(cfg):
    """The input voxels an output depends on (support of its gradient, all activations kept in
    their linear range by positive weights and inputs, so no dependency cancels or dies) equal
    unet_spec.input_window for every output of one period (8 for 3 levels), on the three axes; and
    perturbing one input voxel changes outputs only where the window says (bit-identical elsewhere)."""
    assert unet_spec.receptive_margin(cfg) == 21 == 3 * (2**3 - 1)
    rng = np.random.default_rng(0)
    positive = {
        k: rng.uniform(0, 2 / np.prod(v.shape[:4]), v.shape).astype(np.float32) if k.endswith("kernel") else v
        for k, v in unet_spec.init_weights(cfg, 0).items()
    }
    model, params = jax_model.build_model(cfg), jax_model.params_from_canonical(positive)
    n, c = 64, 32
    x = jnp.asarray(rng.uniform(0.1, 1.0, (1, n, n, n, 4)), jnp.float32)

    def input_gradient(cot):  # of sum(cot * model(x)); vmapped below: one compiled pass for all cotangents
        return jax.vjp(lambda v: model.apply({"params": params}, v), x)[1](cot)[0]

    outputs = [(o, axis) for o in range(24, 32) for axis in range(3)]
    cots = np.zeros((len(outputs), 1, n, n, n, 5), np.float32)
    for j, (o, axis) in enumerate(outputs):
        idx = [c, c, c]
        idx[axis] = o
        cots[(j, 0, *idx, 0)] = 1.0
    grads = np.asarray(jax.jit(jax.vmap(input_gradient))(cots))
    for (o, axis), g in zip(outputs, grads):
        lo, hi = unet_spec.input_window(cfg, o)
        support = np.nonzero(np.abs(g[0]).sum(axis=tuple(a for a in range(4) if a != axis)))[0]
        assert (support.min(), support.max()) == (lo, hi), (o, axis)
        assert len(support) == hi - lo + 1
    # perturbation with signed weights: changes confined to the outputs whose window holds the voxel
    w = _weights(cfg)
    apply = jax_predict.make_apply(cfg, w)
    base = rng.standard_normal((1, n, n, n, 4)).astype(np.float32) * 0.1
    bumped = base.copy()
    i = (29, 30, 31)
    bumped[(0, *i)] += 1.0
    changed = np.abs(apply(bumped) - apply(base))[0].max(axis=-1) > 0
    allowed = [
        np.array([unet_spec.input_window(cfg, o)[0] <= i[a] <= unet_spec.input_window(cfg, o)[1] for o in range(n)])
        for a in range(3)
    ]
    box = allowed[0][:, None, None] & allowed[1][None, :, None] & allowed[2][None, None, :]
    assert changed.any() and not (changed & ~box).any()
    for a in range(3):  # and the changes reach the window's ends
        hit = np.nonzero(changed.any(axis=tuple(b for b in range(3) if b != a)))[0]
        ok = np.nonzero(allowed[a])[0]
        assert (hit.min(), hit.max()) == (ok.min(), ok.max())


@pytest.mark.parametrize(
    "size, window, overlap", [(64, 56, 21), (120, 56, 21), (64, 56, 0), (72, 64, 24), (64, 64, 21), (40, 80, 21)]
)
def test_axis_plan_partitions_with_margins(size, window, overlap):
    align = 8
    plan = tiling.axis_plan(size, window, overlap, align)
    assert plan[0][1] == 0 and plan[-1][2] == size
    for (start, lo, hi), nxt in zip(plan, plan[1:] + [None]):
        w = min(window, size)
        assert start % align == 0 and start >= 0 and start + w <= size
        assert start == 0 or lo - start >= overlap
        assert start + w == size or start + w - hi >= overlap
        assert lo < hi and (nxt is None or nxt[1] == hi)


def test_plan_rejects_small_windows_and_chooses_by_memory(cfg):
    assert tiling.min_window(21, 8) == 56
    with pytest.raises(ValueError):
        tiling.axis_plan(64, 48, 21, 8)
    with pytest.raises(ConfigError, match=r"--tile 48: .* at least 56"):
        tiling.choose_window(cfg, 64, 48, 21, "float32", 16)
    with pytest.raises(ConfigError, match=r"multiple of 2\*\*levels = 8"):
        tiling.choose_window(cfg, 128, 60, 21, "float32", 16)
    assert tiling.choose_window(cfg, 64, 0, 21, "float32", 16) == 64
    assert tiling.choose_window(cfg, 64, None, 21, "float32", 16) == 64  # whole volume fits
    tight = tiling.activation_bytes(cfg, 72, 1, "float32") / 2**30
    assert tiling.choose_window(cfg, 128, None, 21, "float32", tight) == 72
    with pytest.raises(ConfigError, match="smallest seamless tile"):
        tiling.choose_window(cfg, 128, None, 21, "float32", tight / 10)
    # the estimate: input + twice each layer's output, e.g. 4 x 16^3 x 4 B + 2 (8^3 x 4 + ...) x 4 B
    acts = sum(2 * s.out_size**3 * s.c_out for s in unet_spec.layer_specs(cfg, 16))
    assert tiling.activation_bytes(cfg, 16) == 4 * 16**3 * 4 + 4 * acts


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_tiled_prediction_equals_whole_volume(framework, cfg, vol64):
    """8 windows of 56^3 with the receptive margin as overlap reproduce the whole-volume result at
    every voxel (float round-off); overlap 0 does not (seams), so the comparison has teeth."""
    if framework == "tf":
        from tf_impl import predict as fw
    else:
        fw = jax_predict
    apply = fw.make_apply(cfg, _weights(cfg))
    x, _ = predict_mod.read_input(vol64, 4)
    whole, n1 = tiling.predict_volume(x, apply, 5, 64, 21, 8)
    tiled, n8 = tiling.predict_volume(x, apply, 5, 56, 21, 8, batch_size=3)
    assert (n1, n8) == (1, 8)
    assert np.abs(tiled - whole).max() < 1e-5
    seams, _ = tiling.predict_volume(x, apply, 5, 56, 0, 8)
    assert np.abs(seams - whole).max() > 1e-2
    np.testing.assert_allclose(whole[None], apply(x[None]), atol=1e-6)


@pytest.mark.slow
def test_cli_writes_hydro_with_attributes_and_provenance(cfg, vol64, weights_file, tmp_path, caplog):
    out = tmp_path / "pred.h5"
    argv = ["--config", "cpu_tiny", "--weights", str(weights_file), "--input", str(vol64), "--out", str(out)]
    with caplog.at_level(logging.INFO):
        assert jax_predict.main([*argv, "--tile", "56"]) == 0
    assert "tiling: 56^3 windows, overlap 21 voxels (receptive margin 21), batch 1" in caplog.text
    x, _ = predict_mod.read_input(vol64, 4)
    expect = jax_predict.make_apply(cfg, _weights(cfg))(x[None])[0]
    with h5py.File(out) as f, h5py.File(vol64) as src:
        assert list(f.keys()) == ["Hydro"] and f["Hydro"].dtype == np.float32 and f["Hydro"].shape == (5, 64, 64, 64)
        np.testing.assert_allclose(np.moveaxis(f["Hydro"][...], 0, -1), expect, atol=1e-5)
        for key, value in src.attrs.items():  # the input's checksums describe its values, not these
            assert f.attrs[key] == value if not key.endswith("_crc32") else key not in f.attrs or key == "Hydro_crc32"
        assert f.attrs["prediction_input_Nbody_crc32"] == src.attrs["Nbody_crc32"]
        assert f.attrs["prediction_framework"] == "jax" and f.attrs["prediction_precision"] == "float32"
        assert f.attrs["prediction_weights"] == f"weights {weights_file}"
        tiling = json.loads(f.attrs["prediction_tiling"])
        assert tiling == dict(side=64, padded_side=64, window=56, overlap=21, receptive_margin=21, windows=8)
    bf16 = tmp_path / "bf16.h5"
    assert jax_predict.main([*argv[:-1], str(bf16), "--precision", "bfloat16"]) == 0
    with h5py.File(bf16) as f:
        assert f.attrs["prediction_precision"] == "bfloat16"
        err = np.abs(np.moveaxis(f["Hydro"][...], 0, -1) - expect)
    assert 0 < err.mean() < 0.02  # bf16 rounding: ~3 significant digits


def test_side_not_a_multiple_is_padded_and_cropped(cfg, weights_file, tmp_path, caplog):
    path = tmp_path / "v20.h5"
    generate.main(["--out", str(path), "--size", "20", "--seed", "4", "--box", "5"])
    out = tmp_path / "p20.h5"
    with caplog.at_level(logging.INFO):
        argv = ["--config", "cpu_tiny", "--weights", str(weights_file), "--input", str(path), "--out", str(out)]
        assert jax_predict.main(argv) == 0
    assert (
        "volume side 20 is not a multiple of 2**levels = 8: zero-padded to 24, the prediction cropped back to 20"
        in caplog.text
    )
    x, _ = predict_mod.read_input(path, 4)
    padded = np.pad(x, [(0, 4)] * 3 + [(0, 0)])
    expect = jax_predict.make_apply(cfg, _weights(cfg))(padded[None])[0, :20, :20, :20]
    with h5py.File(out) as f:
        assert f["Hydro"].shape == (5, 20, 20, 20)
        np.testing.assert_allclose(np.moveaxis(f["Hydro"][...], 0, -1), expect, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_checkpoint_of_a_run_predicts_like_its_saved_weights(framework, tiny_cfg, data_dir, tmp_path):
    """--workdir takes the run's latest checkpoint through the framework's checkpoints.Checkpoints, read-only."""
    if framework == "tf":
        from tf_impl import predict as fw
        from tf_impl import train
    else:
        from jax_impl import train

        fw = jax_predict
    workdir, saved = tmp_path / "run", tmp_path / "final.npz"
    cfg = config_mod.replace(tiny_cfg, Nsamples=4, Nsamples_val=4, num_epochs=1)
    train.train_and_evaluate(cfg, workdir, save_weights=str(saved))
    # what a save in progress (the run still training) looks like: reading must not remove it
    in_progress = [workdir / "checkpoints" / n for n in ("2.orbax-checkpoint-tmp-1", "ckpt-2_temp")]
    for p in in_progress:
        p.mkdir()
    got, source = fw.load_weights(cfg, None, str(workdir))
    assert all(p.is_dir() for p in in_progress)
    assert source == f"checkpoint {workdir / 'checkpoints'} epoch 1"
    want = unet_spec.load_weights(saved, cfg)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    other = config_mod.replace(cfg, unet_widths=(4, 8, 16))
    with pytest.raises(ConfigError, match="was trained with unet_widths"):
        fw.load_weights(other, None, str(workdir))


def _file(path, nbody):
    with h5py.File(path, "w") as f:
        f.create_dataset("Nbody", data=nbody)
    return path


def test_bad_inputs_give_one_error_line(vol64, weights_file, tmp_path, capsys):
    base = ["--config", "cpu_tiny", "--weights", str(weights_file), "--out", str(tmp_path / "o.h5")]
    cases = [
        (_file(tmp_path / "c3.h5", np.zeros((3, 16, 16, 16), np.float32)), [], "'Nbody' has shape (3, 16, 16, 16)"),
        (_file(tmp_path / "f64.h5", np.zeros((4, 16, 16, 16))), [], "dtype float64, expected float32"),
        (_file(tmp_path / "box.h5", np.zeros((4, 16, 16, 8), np.float32)), [], "expected a cube"),
        (_file(tmp_path / "nan.h5", np.full((4, 8, 8, 8), np.nan, np.float32)), [], "non-finite value"),
        (tmp_path / "missing.h5", [], "not found"),
        (vol64, ["--tile", "60"], "--tile 60: a tile side must be a multiple of 2**levels = 8"),
        (vol64, ["--overlap", "-1"], "--overlap -1: expected >= 0"),
    ]
    for path, extra, message in cases:
        assert run_cli(jax_predict.main, [*base, "--input", str(path), *extra]) == 2
        # run_cli's one line (other lines on stderr may come from log handlers of earlier tests)
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        assert len(err) == 1 and message in err[0], (message, err)
    with h5py.File(tmp_path / "nonbody.h5", "w") as f:
        f.create_dataset("Hydro", data=np.zeros((5, 8, 8, 8), np.float32))
    with pytest.raises(DatasetError, match="missing dataset 'Nbody'"):
        predict_mod.read_input(tmp_path / "nonbody.h5", 4)
    changed = tmp_path / "changed.h5"
    changed.write_bytes(Path(vol64).read_bytes())
    with h5py.File(changed, "a") as f:  # a finite value changed after writing: the recorded CRC-32 differs
        f["Nbody"][2, 5, 6, 7] += 1e-3
    with pytest.raises(DatasetError, match=r"changed\.h5: Nbody channel 2 does not match its recorded CRC-32"):
        predict_mod.read_input(changed, 4)
    same = ["--config", "cpu_tiny", "--weights", str(weights_file), "--input", str(vol64), "--out", str(vol64)]
    assert run_cli(jax_predict.main, same) == 2
    assert f"--out {vol64} is --input {vol64} (the same path)" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_error_is_one_line_without_traceback(weights_file, tmp_path):
    import subprocess
    import sys

    from shared_data.core.config import REPO_ROOT

    bad = _file(tmp_path / "c3.h5", np.zeros((3, 16, 16, 16), np.float32))
    out = tmp_path / "o.h5"
    argv = ["--config", "cpu_tiny", "--weights", str(weights_file), "--input", str(bad), "--out", str(out)]
    for module in ("jax_impl.predict", "tf_impl.predict"):
        res = subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO_ROOT, capture_output=True, text=True)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "'Nbody' has shape (3, 16, 16, 16), expected (4, L, L, L)" in lines[0]


@pytest.mark.slow
def test_a_tutorial_layout_volume_trains_predicts_and_validates(tiny_cfg, data_dir, tmp_path, caplog):
    """Files with the two datasets only (the tutorial's Nyx volumes, no attributes): one JAX epoch of
    cpu_tiny trains on them, predict writes the prediction, and ``--validate`` scores it with the
    tutorial's transforms assumed and said in one line, model and both baselines."""
    from jax_impl import train

    for name in ("train_32.h5", "val_24.h5"):
        with h5py.File(data_dir / name) as src, h5py.File(tmp_path / name, "w") as dst:
            for key in ("Nbody", "Hydro"):
                dst.create_dataset(key, data=src[key][...])
    cfg = config_mod.replace(
        tiny_cfg,
        train_path=str(tmp_path / "train_32.h5"),
        val_path=str(tmp_path / "val_24.h5"),
        Nsamples=4,
        Nsamples_val=4,
        num_epochs=1,
    )
    weights = tmp_path / "w.npz"
    train.train_and_evaluate(cfg, tmp_path / "run", save_weights=str(weights))
    pred, report = tmp_path / "pred.h5", tmp_path / "report"
    argv = ["--config", "cpu_tiny", "--weights", str(weights), "--input", str(tmp_path / "val_24.h5")]
    with caplog.at_level(logging.INFO):
        assert jax_predict.main([*argv, "--out", str(pred), "--validate", str(report)]) == 0
    said = [r.getMessage() for r in caplog.records if "has no attributes (the tutorial's layout)" in r.getMessage()]
    assert len(said) == 1 and "assuming rho = exp(14 x)" in said[0]
    record = json.loads((report / "validation.json").read_text())
    assert record["units_sources"]["density_scale"] == "assumed (the tutorial's layout)"
    for name in ("gas_density", "gas_temperature"):
        assert set(record["power"][name]["summary"]) == {"model", "baseline", "non_ml"}
    assert (report / "validation.png").stat().st_size > 0
