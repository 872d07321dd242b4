"""TensorFlow on a GPU: the convolutions against the float64 references, the loaders bit for bit
against the NumPy reader (the ``device`` loader and DALI's TF plugin with GPU pipelines), the
compiled train step against the CPU's, mixed precision under XLA, and MirroredStrategy over two
logical GPUs against one replica. Marked ``gpu``: skipped where TensorFlow sees no GPU.

    pytest -m gpu tests/test_gpu_tf.py
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from shared_data.core import config as config_mod  # noqa: E402
from shared_data.core.config import REPO_ROOT  # noqa: E402
from shared_data.model import unet_spec  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not tf.config.list_physical_devices("GPU"), reason="TensorFlow sees no GPU"),
]

RNG = np.random.default_rng(7)
# fp32 with TF32 off: cuDNN's algorithms sum in another order than the float64 reference
FP32_REL = 1e-5
# bf16 / fp16 compute of a whole tiny net against its fp32 output, relative L2 (8-bit / 11-bit mantissas)
LOW_PRECISION_REL = {"bfloat16": 3e-2, "float16": 5e-3}


@pytest.fixture(autouse=True)
def no_tf32():
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(True)


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "xla"])
@pytest.mark.parametrize(
    "method, conv_pad",
    [
        ("subpixel", "separate"),
        ("subpixel_crop", "folded"),
        ("phases", "separate"),
        ("phases", "folded"),
        ("transpose", "separate"),
    ],
)
@pytest.mark.parametrize("n, c_in, c_out", [(1, 64, 32), (2, 64, 32), (16, 32, 16)])
def test_upconv_on_gpu_equals_float64_reference(method, conv_pad, jit, n, c_in, c_out):
    from tf_impl import model as model_mod

    x = RNG.standard_normal((2, n, n, n, c_in)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, c_in, c_out)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    with tf.device("/GPU:0"):
        layer = model_mod.UpConv(c_out, method, conv_pad=conv_pad)
        layer.build(x.shape)
        layer.kernel.assign(w)
        layer.bias.assign(b)
        got = tf.function(layer, jit_compile=jit)(tf.constant(x))
    assert "GPU" in got.device
    assert rel_err(got, unet_spec.conv_transpose_reference(x, w, b)) < FP32_REL


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "xla"])
@pytest.mark.parametrize("method", ["space_to_depth", "strided"])
@pytest.mark.parametrize("n, c_in, c_out", [(2, 64, 32), (32, 16, 32)])
def test_downconv_on_gpu_equals_float64_reference(method, jit, n, c_in, c_out):
    from tf_impl import model as model_mod

    x = RNG.standard_normal((2, n, n, n, c_in)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, c_in, c_out)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    with tf.device("/GPU:0"):
        layer = model_mod.DownConv(c_out, method)
        layer.build(x.shape)
        layer.kernel.assign(w)
        layer.bias.assign(b)
        got = tf.function(layer, jit_compile=jit)(tf.constant(x))
    assert rel_err(got, unet_spec.conv_reference(x, w, b)) < FP32_REL


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_mixed_precision_net_under_xla_is_close_to_fp32(tiny_cfg, precision):
    """The known failure class of TF's XLA with 3-D convolutions in half precision: the whole tiny
    net in bf16 / fp16 under XLA stays within the mantissa's error of its fp32 output."""
    from tf_impl import model as model_mod

    x = tf.constant(RNG.uniform(-1, 1, (2, 16, 16, 16, 4)).astype(np.float32))
    weights = unet_spec.init_weights(tiny_cfg, 3)
    out = {}
    for name, cfg in (
        ("float32", tiny_cfg),
        (precision, config_mod.replace(tiny_cfg, enable_amp=True, amp_dtype=precision)),
    ):
        model = model_mod.params_from_canonical(model_mod.build_model(cfg), weights)
        out[name] = tf.function(lambda t, model=model: model(t, training=False), jit_compile=True)(x).numpy()
    assert np.isfinite(out[precision]).all()
    assert rel_err(out[precision], out["float32"]) < LOW_PRECISION_REL[precision]


def test_train_step_on_gpu_equals_cpu(tiny_cfg):
    """One XLA-compiled fp32 train step on the GPU and on the CPU: the same loss and updates."""
    from tf_impl import distribute
    from tf_impl import model as model_mod
    from tf_impl import step as step_mod

    batch = {
        "inputs": RNG.uniform(-1, 1, (4, 16, 16, 16, 4)).astype(np.float32),
        "targets": RNG.uniform(-1, 1, (4, 16, 16, 16, 5)).astype(np.float32),
        "mask": np.ones(4, np.float32),
    }
    result = {}
    for device in ("/CPU:0", "/GPU:0"):
        with tf.device(device):
            model = model_mod.params_from_canonical(
                model_mod.build_model(tiny_cfg), unet_spec.init_weights(tiny_cfg, 0)
            )
            opt = step_mod.make_optimizer(tiny_cfg, np.full(4, 1e-3, np.float32))
            opt.build(model.trainable_variables)
            train, _ = step_mod.step_functions(tiny_cfg, distribute.make_strategy(), model, opt, jit=True)
            loss = float(train({k: tf.constant(v) for k, v in batch.items()})["loss"])
            result[device] = loss, model_mod.params_to_canonical(model)
    (loss_cpu, w_cpu), (loss_gpu, w_gpu) = result["/CPU:0"], result["/GPU:0"]
    assert abs(loss_gpu - loss_cpu) < 1e-5 * abs(loss_cpu)
    for k in w_cpu:
        np.testing.assert_allclose(w_gpu[k], w_cpu[k], rtol=1e-4, atol=1e-6, err_msg=k)


def _batches_equal(got, want, split):
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for k in ("inputs", "targets", "mask"):
            a, b = np.asarray(g[k]), np.asarray(w[k])
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{split} step {i} {k}"


@pytest.mark.parametrize("kind", ["device", "dali-npy", "dali-h5", "dali-device"])
def test_gpu_loaders_equal_the_numpy_reader_bit_for_bit(tiny_cfg, kind):
    """Every loader a TF user runs on a GPU yields the NumPy reader's batches bit for bit (the DALI
    ones through the TF plugin, pipelines on the GPU), each batch on the GPU."""
    from tf_impl import data as data_mod
    from tf_impl import distribute

    if kind.startswith("dali"):
        pytest.importorskip("nvidia.dali.plugin.tf")
    cfg = config_mod.replace(tiny_cfg, data_loader_config=kind, dali_h5_mode="simple", Nsamples=12, Nsamples_val=6)
    strategy = distribute.make_strategy()
    for split in ("train", "val"):
        got_in = data_mod.make_input(cfg, split, strategy)
        want_in = data_mod.make_input(config_mod.replace(cfg, data_loader_config="lowmem"), split, strategy)
        for epoch in (0, 1):
            got = list(got_in.epoch(epoch))
            assert all("GPU" in b["draws" if kind == "device" else "inputs"].device for b in got)
            if kind == "device":  # the crop plan, cut on the GPU as the step cuts it
                got = [tf.function(data_mod.crops, jit_compile=True)(b, cfg) for b in got]
            _batches_equal(got, list(want_in.epoch(epoch)), f"{kind} {split} epoch {epoch}")


MIRRORED_SCRIPT = r"""
import sys
from tf_impl import cluster, distribute
import tensorflow as tf
(cluster.split_gpu if tf.config.list_physical_devices("GPU") else cluster.split_cpu)(2)
import numpy as np
from shared_data.core import config as config_mod
from shared_data.model import unet_spec
from tf_impl import data as data_mod, model as model_mod, step as step_mod
tf.config.experimental.enable_tensor_float_32_execution(False)
base = config_mod.load_config("cpu_tiny", overrides=dict(train_path=sys.argv[1], val_path=sys.argv[2], Nsamples=12))
cfg = config_mod.replace(base, data_loader_config=sys.argv[3])
mirrored = distribute.make_strategy(2)
assert mirrored.num_replicas_in_sync == 2, mirrored
# the loader feeds each replica its shard (the device loader: its crop plan, cut in the step); one replica
# gets the two shards' crops concatenated: the same global batch
inp = data_mod.make_input(cfg, "train", mirrored)
per_replica = list(inp.epoch(0))
cut = tf.function(lambda b: mirrored.run(lambda r: data_mod.crops(r, cfg), args=(b,)))
global_batches = [
    {k: tf.concat([t.numpy() for t in mirrored.experimental_local_results(c[k])], 0) for k in c}
    for c in map(cut, per_replica)
]
one_replica = distribute.make_strategy(1)
def run(strategy, batches, spec):
    with strategy.scope():
        model, opt = model_mod.build_model(cfg), step_mod.make_optimizer(cfg, np.full(8, 1e-3, np.float32))
        model_mod.params_from_canonical(model, unet_spec.init_weights(cfg, 0))
    train_fn, _, _ = step_mod.compile_steps(cfg, strategy, step_mod.TrainState(model, opt), spec)
    return [float(train_fn(b)["loss"]) for b in batches], model_mod.params_to_canonical(model)
one, w1 = run(one_replica, global_batches, data_mod.batch_spec(cfg, one_replica))
two, w2 = run(mirrored, per_replica, data_mod.input_spec(inp, cfg, mirrored))
print(cfg.data_loader_config, "1 replica losses", one, "2 replicas", two)
np.testing.assert_allclose(two, one, rtol=%g)
for k in w1:
    np.testing.assert_allclose(w2[k], w1[k], rtol=%g, atol=%g, err_msg=k)
print("MirroredStrategy over 2 logical devices == 1 replica on the same global batches,", cfg.data_loader_config)
"""
# the same global batch split over two replicas: the losses and updates agree to fp32 rounding
MIRRORED_TOL = (1e-5, 1e-4, 1e-6)


@pytest.mark.parametrize("kind", ["device", "dali-npy"])
def test_mirrored_strategy_on_two_logical_gpus_equals_one_replica(tiny_cfg, kind):
    if kind.startswith("dali"):
        pytest.importorskip("nvidia.dali.plugin.tf")
    res = subprocess.run(
        [sys.executable, "-c", MIRRORED_SCRIPT % MIRRORED_TOL, tiny_cfg.train_path, tiny_cfg.val_path, kind],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    print(res.stdout[-600:])
