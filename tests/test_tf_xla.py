"""The study experiments/h200_tf_xla: TF's steps exported as StableHLO and run by JAX's XLA
(export_hlo.py -> tf_xla.py there): the
exported train and eval steps equal TF's own, fp32 and bf16; the SYNTHETIC bench feeds the donated
variables back; the benchmark record has the other rows' schema; the GPU check script passes on CPU;
a missing or altered export is one error line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_one_error_line

from dlas_compare import benchmark_timing
from shared_data.core import config as config_mod
from shared_data.core.config import REPO_ROOT
from shared_data.core.errors import UserError
from shared_data.data import host_batches
from shared_data.model import unet_spec

from tf_impl import model as model_mod

STUDY = REPO_ROOT / "experiments" / "h200_tf_xla"
sys.path.insert(0, str(STUDY))
import export_hlo  # noqa: E402
import tf_xla  # noqa: E402
import xla_export as fmt  # noqa: E402

pytestmark = pytest.mark.study

_EXPORTS: dict[str, types.SimpleNamespace] = {}


def _export(precision, tiny_cfg, tmp_path_factory):
    """Export cpu_tiny at ``precision``, then run TF's own steps once on the exported objects, from
    weights 5 x the canonical init (std 0.1: the tiny net's output is then of the targets' size, so
    the loss depends on the net, not only on the targets)."""
    if precision not in _EXPORTS:
        cfg = config_mod.replace(tiny_cfg, enable_amp=precision != "float32")
        folder = tmp_path_factory.mktemp(f"export_{precision}")
        built = export_hlo.build_steps(cfg)
        model, optimizer, train_fn, eval_fn, _ = built
        weights = {k: 5 * v for k, v in unet_spec.init_weights(cfg, 7).items()}
        model_mod.params_from_canonical(model, weights)
        manifest = export_hlo.export(cfg, folder, built)
        batch = host_batches.synthetic_batch(cfg, cfg.global_batch_size, seed=1)
        tf_batch = {k: tf.constant(v) for k, v in batch.items()}
        tf_eval = {k: float(v) for k, v in eval_fn(tf_batch).items()}
        tf_loss = float(train_fn(tf_batch)["loss"])
        roles = export_hlo.variable_roles(cfg, model, optimizer)
        variables = {var.path: np.asarray(var.numpy()) for var, _ in roles.values()}
        _EXPORTS[precision] = types.SimpleNamespace(
            cfg=cfg,
            folder=folder,
            manifest=manifest,
            weights=weights,
            batch=batch,
            tf_loss=tf_loss,
            tf_eval=tf_eval,
            variables=variables,
        )
    return _EXPORTS[precision]


@pytest.fixture
def fp32_export(tiny_cfg, tmp_path_factory):
    return _export("float32", tiny_cfg, tmp_path_factory)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_exported_steps_run_by_jax_equal_tf_steps(precision, tiny_cfg, tmp_path_factory):
    """Loss, eval metrics and every variable the train step updates (12 weights, 24 Adam moments,
    the iteration counter), TF's own XLA step vs its StableHLO compiled by jaxlib's XLA. TF's XLA and
    jaxlib's are different builds and may sum the bias gradients in another order: float32 rounding
    of ~1e-7 per sum, ~2x that in Adam's v (g^2). Asserted: loss and eval within 1e-6 relative,
    each variable within 1e-5 relative norm, the counter exactly."""
    ex = _export(precision, tiny_cfg, tmp_path_factory)
    text = (ex.folder / "train_step.mlir").read_text()
    assert ("xbf16>" in text) == (precision == "bfloat16")  # the policy's compute type is in the graph
    train = ex.manifest["steps"]["train_step"]
    assert [a["name"] for a in train["arguments"][:3]] == ["inputs", "mask", "targets"]
    roles = [a["role"] for a in train["arguments"][3:]]
    assert roles.count("weight") == 12 and roles.count("adam_m") == roles.count("adam_v") == 12
    assert roles.count("iterations") == 1 and len(roles) == 37 and not (ex.folder / fmt.VALUES).exists()

    program = tf_xla.Program(ex.folder, ex.cfg)
    step = program.step("train_step")
    args = program.arguments("train_step", ex.weights, ex.batch)
    results = step(args)
    loss = float(step.metrics(results)["loss"])
    assert abs(loss - ex.tf_loss) <= 1e-6 * ex.tf_loss, (loss, ex.tf_loss)
    updates = [o for o in train["outputs"] if o["kind"] == "update"]
    assert len(updates) == 37
    for o in updates:
        want, got = ex.variables[o["tf_name"]], np.asarray(results[o["index"]])
        assert got.dtype == want.dtype and got.shape == want.shape, o["tf_name"]
        if o["role"] == "iterations":
            assert int(got) == int(want) == 1
        else:
            err = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
            assert err <= 1e-5, (o["tf_name"], err)
    ev = program.evaluate(ex.weights, ex.batch)
    assert ev["count"] == ex.tf_eval["count"] == ex.cfg.global_batch_size
    assert abs(ev["loss_sum"] - ex.tf_eval["loss_sum"]) <= 1e-6 * ex.tf_eval["loss_sum"]


def test_bench_feeds_donated_variables_back(fp32_export):
    """Three SYNTHETIC steps: the weight and counter arguments are donated (deleted) and replaced by
    the step's results, the batch stays; the counter reads 3 and every weight has moved."""
    ex = fp32_export
    bench = tf_xla.Bench(ex.cfg, "synthetic", export_dir=ex.folder)
    assert bench.framework == "tf-xla" and bench.global_batch == ex.cfg.global_batch_size and bench.replicas == 1
    spec = bench.train.spec
    first = list(bench.args)
    for _ in range(3):
        bench.step()
    bench.sync()
    updated = {o["argument"] for o in spec["outputs"] if o["kind"] == "update"}
    assert all(first[i].is_deleted() == (i in updated) for i in range(len(first)))
    init = unet_spec.init_weights(ex.cfg, ex.cfg.seed)
    for arg, value in zip(spec["arguments"], bench.args):
        if arg.get("role") == "iterations":
            assert int(value) == 3 and value.dtype == np.int64
        elif arg.get("role") == "weight":
            assert not np.allclose(np.asarray(value), init[arg["weight"]], rtol=0, atol=1e-6), arg["weight"]
    assert np.isfinite(float(bench._out[0]))
    with pytest.raises(UserError, match="only synthetic"):
        tf_xla.Bench(ex.cfg, "full", export_dir=ex.folder)
    with pytest.raises(UserError, match="one device only"):
        tf_xla.Bench(ex.cfg, "synthetic", 2, export_dir=ex.folder)


class _NoWork:
    """The Bench interface with nothing behind it: what every row's record is made of."""

    framework, global_batch, compile_sec, replicas = "none", 4, 0.0, 1

    def step(self):
        pass

    def sync(self):
        pass

    def peak_memory_bytes(self):
        return None

    def versions(self):
        return {}

    def device_name(self):
        return "1 x cpu"


def test_benchmark_record_has_the_schema_of_the_other_rows(fp32_export, tmp_path):
    ex = fp32_export
    out = tmp_path / "r.jsonl"
    argv = ["--config", "cpu_tiny", "--no-enable_amp", "--tf_xla_export", str(ex.folder)]
    assert tf_xla.main([*argv, "--warmup", "1", "--steps", "2", "--windows", "2", "--out", str(out)]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert set(record) == set(benchmark_timing.run_bench(_NoWork(), ex.cfg, "synthetic", 0, 1, 1))
    assert (record["framework"], record["mode"], record["loader"]) == ("tf-xla", "synthetic", "cached device batch")
    assert record["samples_per_sec"] > 0 and record["compile_sec"] > 0 and record["global_batch"] == 4
    assert record["versions"]["exported_by"]["tensorflow"] == tf.__version__
    assert "no TF runtime" in record["notes"] and f"JAX {record['versions']['jax']}" in record["notes"]


def _check_script():
    spec = importlib.util.spec_from_file_location("check_tf_xla", STUDY / "check_tf_xla.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_script_passes_on_cpu_tiny_fp32(fp32_export, tmp_path, capsys):
    ex, check = fp32_export, _check_script()
    out = tmp_path / "check.jsonl"
    argv = ["--config", "cpu_tiny", "--no-enable_amp", "--tf_xla_export", str(ex.folder), "--out", str(out)]
    assert check.main(argv) == 0, capsys.readouterr().out
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["ok"] and record["tolerances"] == check.TOLERANCES[("float32", "cpu")]
    assert [r["name"] for r in record["rows"]] == ["loss", *unet_spec.init_weights(ex.cfg, 0)]
    assert record["rows"][0]["loss"] <= 1e-5


def test_gpu_check_comparison_accepts_keras_adam_and_flags_a_wrong_gradient():
    """compare() on hand-made first steps: TF's = Keras' first Adam step on a gradient g, JAX's =
    optax's on the same g (eps placed differently) passes; a 1% error in one layer's gradient, or an
    update of the wrong sign on 1% of one layer's entries, fails that layer alone."""
    check = _check_script()
    cfg = config_mod.load_config("cpu_tiny")
    rng = np.random.default_rng(0)
    w0 = unet_spec.init_weights(cfg, 0)
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    g = {k: rng.standard_normal(v.shape) * 1e-3 for k, v in w0.items()}
    tf_out = {
        "loss": 0.5,
        "adam_m": {k: (1 - b1) * v for k, v in g.items()},
        "weights": {k: w0[k] - lr * v / (np.abs(v) + eps / np.sqrt(1 - b2)) for k, v in g.items()},
    }
    jax_out = {
        "loss": 0.5,
        "adam_m": {k: (1 - b1) * v for k, v in g.items()},
        "weights": {k: w0[k] - lr * v / (np.abs(v) + eps) for k, v in g.items()},
    }
    tol = check.TOLERANCES[("float32", "cpu")]
    assert check.compare(cfg, tf_out, jax_out, w0, lr, tol)[1]
    wrong_grad = {**tf_out, "adam_m": {**tf_out["adam_m"], "up1/kernel": 1.01 * tf_out["adam_m"]["up1/kernel"]}}
    rows, ok = check.compare(cfg, wrong_grad, jax_out, w0, lr, tol)
    assert not ok and [r["name"] for r in rows if not r["ok"]] == ["up1/kernel"]
    flipped = tf_out["weights"]["down2/kernel"].copy().reshape(-1)
    n = flipped.size // 100
    flipped[:n] = 2 * w0["down2/kernel"].reshape(-1)[:n] - flipped[:n]  # the update's sign reversed
    wrong_sign = {**tf_out, "weights": {**tf_out["weights"], "down2/kernel": flipped.reshape(w0["down2/kernel"].shape)}}
    rows, ok = check.compare(cfg, wrong_sign, jax_out, w0, lr, check.TOLERANCES[("bfloat16", "gpu")])
    assert not ok and [r["name"] for r in rows if not r["ok"]] == ["down2/kernel"]


def _run(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, env=env)


def test_missing_or_altered_export_isassert_one_error_line(fp32_export, tmp_path):
    bench = [str(STUDY / "tf_xla.py"), "--config", "cpu_tiny", "--no-enable_amp"]
    missing = tmp_path / "nowhere"
    assert_one_error_line(
        _run(*bench, "--tf_xla_export", str(missing)),
        f"no export folder {missing}",
        "python experiments/h200_tf_xla/export_hlo.py --config cpu_tiny --no-enable_amp --global_batch_size 4",
    )
    altered = tmp_path / "altered"
    altered.mkdir()
    for f in fp32_export.folder.iterdir():
        (altered / f.name).write_bytes(f.read_bytes())
    (altered / "train_step.mlir").write_text((altered / "train_step.mlir").read_text() + "\n")
    assert_one_error_line(_run(*bench, "--tf_xla_export", str(altered)), "train_step.mlir is not the file", "re-export")
    amp = [str(STUDY / "tf_xla.py"), "--config", "cpu_tiny", "--enable_amp"]
    assert_one_error_line(_run(*amp, "--tf_xla_export", str(fp32_export.folder)), "exported for enable_amp=False")
    assert_one_error_line(
        _run(str(STUDY / "check_tf_xla.py"), "--config", "cpu_tiny", "--tf_xla_export", str(missing)),
        "no export folder",
    )


def test_the_jax_side_imports_no_tensorflow_and_the_tf_side_no_jax():
    """tf_xla.py and the check script run where only JAX is installed; the exporter where only TF is."""
    no_tf = (
        f"import sys, runpy; sys.path.insert(0, {str(STUDY)!r}); sys.modules['tensorflow'] = None; "
        "import tf_xla, dlas_compare.benchmark; "
        f"sys.argv = ['check', '--help']; runpy.run_path({str(STUDY / 'check_tf_xla.py')!r}, run_name='__main__')"
    )
    res = _run("-c", no_tf)
    assert res.returncode == 0 and "--tf_xla_export" in res.stdout, res.stderr[-2000:]
    no_jax = f"import sys; sys.path.insert(0, {str(STUDY)!r}); sys.modules['jax'] = None; import export_hlo, xla_export"
    res = _run("-c", no_jax)
    assert res.returncode == 0, res.stderr[-2000:]


def test_manifest_text_parsers():
    text = (
        'module @m attributes {mhlo.input_output_alias = [{alias = {kind = "may_alias", parameter_index = array<i64>, '
        "parameter_number = 2 : i64}, output_index = array<i64: 1>}]} {\n"
        '  func.func @main(%arg0: tensor<4x2xf32> loc("a"), %arg1: tensor<i64> loc("b"), %arg2: tensor<3xbf16>) '
        "-> (tensor<f32>, tensor<3xbf16>) {\n"
    )
    assert fmt.main_signature(text) == (
        [((4, 2), "float32"), ((), "int64"), ((3,), "bfloat16")],
        [((), "float32"), ((3,), "bfloat16")],
    )
    assert fmt.input_output_aliases(text) == {1: 2}
    with pytest.raises(ValueError, match="static dimensions"):
        fmt.tensor_type("?x4xf32")
