"""export: each framework's artefacts load back and predict what the in-memory model predicts; the
JAX artefact and the SavedModel run in a process that has none of this project's code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from shared_data.core import config as config_mod
from shared_data.core.errors import run_cli
from shared_data.model import unet_spec


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """cpu_tiny, weights of std 0.16 saved as a canonical file, and a batch of 3 inputs of 16^3."""
    d = tmp_path_factory.mktemp("export")
    cfg = config_mod.load_config("cpu_tiny")
    w = {k: v * 8 if k.endswith("kernel") else v + 0.01 for k, v in unet_spec.init_weights(cfg, 2).items()}
    unet_spec.save_weights(d / "w.npz", w)
    x = np.random.default_rng(0).standard_normal((3, 16, 16, 16, 4)).astype(np.float32) * 0.1
    np.save(d / "x.npy", x)
    return cfg, w, d, x


#: Run last in the bare interpreter: none of this project's packages (nor flax) was imported.
CHECK = """
import sys
loaded = {m.split(".")[0] for m in sys.modules} & {"shared_data", "jax_impl", "tf_impl", "compare", "flax"}
assert not loaded, loaded
"""


def _run_bare(code: str, cwd) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter started in ``cwd`` without PYTHONPATH, then :data:`CHECK`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [sys.executable, "-c", textwrap.dedent(code) + CHECK]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_jax_export_runs_without_the_project(setup):
    cfg, w, d, x = setup
    from jax_impl import export as jax_export
    from jax_impl import predict as jax_predict

    out = d / "jax"
    argv = ["--config", "cpu_tiny", "--weights", str(d / "w.npz"), "--out", str(out)]
    assert jax_export.main(argv) == 0
    record = json.loads((out / "export.json").read_text())
    assert record["framework"] == "jax" and record["files"] == ["unet.jax_export"]
    assert record["input"] == {"shape": [None, None, None, None, 4], "dtype": "float32", "layout": "NDHWC"}
    assert record["side_multiple_of"] == 8
    x32 = np.random.default_rng(2).standard_normal((2, 32, 32, 32, 4)).astype(np.float32) * 0.1
    np.save(d / "x32.npy", x32)
    res = _run_bare(
        f"""
        import jax, numpy as np
        exported = jax.export.deserialize(open({str(out / "unet.jax_export")!r}, "rb").read())
        x = np.load({str(d / "x.npy")!r})
        np.save("y3.npy", np.asarray(exported.call(x)))
        np.save("y1.npy", np.asarray(exported.call(x[:1])))
        np.save("y32.npy", np.asarray(exported.call(np.load({str(d / "x32.npy")!r}))))
        print(exported.platforms, exported.in_avals)
        """,
        d,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "cpu" in res.stdout and "cuda" in res.stdout and "float32[B,8*k,8*k,8*k,4]" in res.stdout
    want = jax_predict.make_apply(cfg, w)(x)
    assert np.abs(want).std() > 0.1
    np.testing.assert_allclose(np.load(d / "y3.npy"), want, atol=1e-6)
    np.testing.assert_allclose(np.load(d / "y1.npy"), want[:1], atol=1e-6)  # the batch is symbolic
    want32 = jax_predict.make_apply(cfg, w)(x32)
    np.testing.assert_allclose(np.load(d / "y32.npy"), want32, atol=1e-6)  # and the side


@pytest.mark.slow
def test_tf_savedmodel_and_keras_file_load_back(setup):
    cfg, w, d, x = setup
    import keras

    from tf_impl import export as tf_export
    from tf_impl import model as tf_model
    from tf_impl import predict as tf_predict

    out = d / "tf"
    argv = ["--config", "cpu_tiny", "--weights", str(d / "w.npz"), "--out", str(out), "--size", "24"]
    assert tf_export.main(argv) == 0
    assert json.loads((out / "export.json").read_text())["files"] == ["saved_model", "unet.keras"]
    x24 = np.random.default_rng(1).standard_normal((2, 24, 24, 24, 4)).astype(np.float32) * 0.1
    np.save(d / "x24.npy", x24)
    want = tf_predict.make_apply(cfg, w)(x24)
    loaded = keras.models.load_model(out / "unet.keras")  # stock Keras; the layers are registered by tf_impl.model
    assert {type(layer) for layer in loaded.layers} >= {tf_model.DownConv, tf_model.UpConv}
    np.testing.assert_array_equal(loaded(x24).numpy(), tf_export.build_exported_model(cfg, w, 24)(x24).numpy())
    np.testing.assert_allclose(loaded(x24).numpy(), want, atol=1e-5)  # eager vs predict's XLA: round-off
    # without --size: one SavedModel for any side that is a multiple of 2**levels
    free = d / "tf_free"
    assert tf_export.main([*argv[:4], "--out", str(free)]) == 0
    assert json.loads((free / "export.json").read_text())["input"]["shape"] == [None, None, None, None, 4]
    res = _run_bare(  # both SavedModels in one bare interpreter
        f"""
        import numpy as np, tensorflow as tf
        model = tf.saved_model.load({str(out / "saved_model")!r})
        np.save("ytf.npy", model.serve(tf.constant(np.load({str(d / "x24.npy")!r}))).numpy())
        model = tf.saved_model.load({str(free / "saved_model")!r})
        np.save("ytf16.npy", model.serve(tf.constant(np.load({str(d / "x.npy")!r}))).numpy())
        np.save("ytf24.npy", model.serve(tf.constant(np.load({str(d / "x24.npy")!r}))).numpy())
        """,
        d,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    np.testing.assert_allclose(np.load(d / "ytf.npy"), want, atol=1e-5)
    np.testing.assert_allclose(np.load(d / "ytf24.npy"), want, atol=1e-5)
    np.testing.assert_allclose(np.load(d / "ytf16.npy"), tf_predict.make_apply(cfg, w)(x), atol=1e-5)
    # a second export replaces the first (atomic folder swap)
    assert tf_export.main(argv) == 0 and (out / "saved_model" / "saved_model.pb").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_export_flag_errors(setup, capsys):
    _, _, d, _ = setup
    from jax_impl import export as jax_export

    argv = ["--config", "cpu_tiny", "--weights", str(d / "w.npz"), "--out", str(d / "e")]
    assert run_cli(jax_export.main, [*argv, "--size", "12"]) == 2
    assert "error: --size 12: expected a multiple of 2**levels = 8 from 8 to 1024" in capsys.readouterr().err
    assert run_cli(jax_export.main, [*argv[:3], str(d / "nope.npz"), *argv[4:]]) == 2
    assert "not found" in capsys.readouterr().err
