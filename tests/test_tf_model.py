"""TF U-Net: shapes and dtypes per policy, up/down-convs against float64 references, JAX parity."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import rel_err

from shared_data.core import config as config_mod
from shared_data.model import unet_spec

from tf_impl import model as model_mod

RNG = np.random.default_rng(1)


@pytest.mark.parametrize("method", ["subpixel", "subpixel_crop", "phases", "transpose"])
@pytest.mark.parametrize("n, c_in, c_out", [(1, 3, 2), (2, 4, 3), (5, 3, 4), (8, 6, 5)])
def test_upconv_equals_float64_transposed_conv_definition(method, n, c_in, c_out):
    x = RNG.standard_normal((2, n, n, n, c_in)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, c_in, c_out)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    layer = model_mod.UpConv(c_out, method)
    layer.build(x.shape)
    layer.kernel.assign(w)
    layer.bias.assign(b)
    got = layer(tf.constant(x))
    assert tuple(got.shape) == (2, 2 * n, 2 * n, 2 * n, c_out) and got.dtype == tf.float32
    assert rel_err(got, unet_spec.conv_transpose_reference(x, w, b)) < 1e-5


@pytest.mark.parametrize(
    "method, conv_pad, regroup",
    [
        ("subpixel", "separate", "gather"),
        ("subpixel", "separate", "transpose"),
        ("subpixel", "folded", "gather"),
        ("subpixel_crop", "separate", "gather"),
        ("subpixel_crop", "separate", "transpose"),
        ("subpixel_crop", "folded", "transpose"),
        ("phases", "separate", "transpose"),
        ("phases", "folded", "gather"),
        ("transpose", "separate", "gather"),
    ],
)
@pytest.mark.parametrize("split", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_upconv_forms_forward_and_gradients_equal_float64_reference(method, conv_pad, regroup, split, n=3):
    """Every TF up-conv form (``upconv`` x ``conv_pad`` x ``kernel_regroup``, one input or the two parts
    of a ``skip_concat: split`` input): output and the gradients of <g, output> with respect to the
    input(s) and the kernel against the float64 definition."""
    c_a, c_b, c_out = 3, 2, 4
    x = RNG.standard_normal((2, n, n, n, c_a + c_b)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, c_a + c_b, c_out)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    g = RNG.standard_normal((2, 2 * n, 2 * n, 2 * n, c_out)).astype(np.float32)
    layer = model_mod.UpConv(c_out, method, regroup, conv_pad=conv_pad)
    parts = [tf.constant(x[..., :c_a]), tf.constant(x[..., c_a:])] if split else [tf.constant(x)]
    layer.build([p.shape for p in parts] if split else parts[0].shape)
    layer.kernel.assign(w)
    layer.bias.assign(b)
    with tf.GradientTape() as tape:
        tape.watch(parts)
        out = layer(parts if split else parts[0])
        inner = tf.reduce_sum(out * g)
    *dparts, dw = tape.gradient(inner, [*parts, layer.kernel])
    ref_dx, ref_dw = unet_spec.conv_transpose_reference_grads(x, w, g)
    assert tuple(out.shape) == (2, 2 * n, 2 * n, 2 * n, c_out) and out.dtype == tf.float32
    assert rel_err(out, unet_spec.conv_transpose_reference(x, w, b)) < 1e-5
    assert rel_err(tf.concat(dparts, -1), ref_dx) < 1e-5 and rel_err(dw, ref_dw) < 1e-5


@pytest.mark.parametrize("method", ["subpixel_crop", "transpose"])
def test_padded_output_channels_equal_float64_reference(method):
    """``pad_out_channels``: 5 channels computed as 8 (zero kernels), 5 returned; output and gradients
    against the float64 definition, the kernel variable of canonical shape."""
    n, c_in, c_out = 3, 4, 5
    x = RNG.standard_normal((2, n, n, n, c_in)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, c_in, c_out)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    g = RNG.standard_normal((2, 2 * n, 2 * n, 2 * n, c_out)).astype(np.float32)
    layer = model_mod.UpConv(c_out, method, "gather", 8)
    layer.build(x.shape)
    layer.kernel.assign(w)
    layer.bias.assign(b)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = layer(xt)
        inner = tf.reduce_sum(out * g)
    dx, dw, db = tape.gradient(inner, [xt, layer.kernel, layer.bias])
    ref_dx, ref_dw = unet_spec.conv_transpose_reference_grads(x, w, g)
    assert tuple(out.shape) == (2, 2 * n, 2 * n, 2 * n, c_out) and tuple(layer.kernel.shape) == w.shape
    assert rel_err(out, unet_spec.conv_transpose_reference(x, w, b)) < 1e-5
    assert rel_err(dx, ref_dx) < 1e-5 and rel_err(dw, ref_dw) < 1e-5
    assert rel_err(db, g.astype(np.float64).sum(axis=(0, 1, 2, 3))) < 1e-5


def test_phase_kernel_forms_are_the_same_permutation():
    """The flip-reshape-transpose phase kernel is the gather of PHASE_TAPS, element for element."""
    w = tf.constant(RNG.standard_normal((4, 4, 4, 3, 2)).astype(np.float32))
    assert np.array_equal(model_mod.phase_kernel_transposed(w).numpy(), model_mod.phase_kernel(w).numpy())


@pytest.mark.parametrize("method", ["space_to_depth", "strided"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_downconv_equals_float64_reference(method, n):
    x = RNG.standard_normal((2, n, n, n, 3)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, 3, 5)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    layer = model_mod.DownConv(5, method)
    layer.build(x.shape)
    layer.kernel.assign(w)
    layer.bias.assign(b)
    assert rel_err(layer(tf.constant(x)), unet_spec.conv_reference(x, w, b)) < 1e-5


@pytest.mark.parametrize(
    "precision, compute", [("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16")]
)
def test_shapes_and_dtypes_under_each_policy(tiny_cfg, precision, compute):
    cfg = config_mod.replace(
        tiny_cfg, enable_amp=precision != "float32", amp_dtype=precision if precision != "float32" else "bfloat16"
    )
    model = model_mod.build_model(cfg)
    out = model(tf.constant(RNG.standard_normal((2, 16, 16, 16, 4)).astype(np.float32)))
    assert tuple(out.shape) == (2, 16, 16, 16, 5) and out.dtype == tf.float32
    assert all(v.dtype == "float32" for v in model.trainable_variables)
    assert model_mod.conv_layers(model)["down1"].compute_dtype == compute
    assert model.get_layer("tanh").compute_dtype == "float32"


@pytest.mark.slow
def test_full_size_parameter_count_matches_spec():
    cfg = config_mod.load_config("base")
    model = model_mod.build_model(cfg)
    assert model.count_params() == unet_spec.num_params(cfg)
    shapes = {f"{n}/kernel": tuple(l.kernel.shape) for n, l in model_mod.conv_layers(model).items()}
    assert shapes == {f"{s.name}/kernel": s.kernel_shape for s in unet_spec.layer_specs(cfg)}


@pytest.mark.parametrize(
    "small",
    [
        {},
        {"upconv_transpose_below": 4, "downconv_strided_below": 16, "upconv": "phases"},
        {"kernel_regroup": "transpose", "skip_concat": "split"},
        {"upconv": "subpixel_crop", "kernel_regroup": "transpose", "skip_concat": "split", "pad_out_channels": 8},
        {"upconv": "subpixel_crop", "conv_pad": "folded", "kernel_regroup": "transpose", "pad_out_channels": 8},
    ],
)
def test_same_canonical_weights_give_same_outputs_as_jax(tiny_cfg, small):
    """Parity: one weights file, both frameworks, fp32: relative error < 1e-4 (also with other
    formulations per level in TF only)."""
    import jax.numpy as jnp

    from jax_impl import model as jax_model

    weights = unet_spec.init_weights(tiny_cfg, 7)
    x = RNG.standard_normal((2, 16, 16, 16, 4)).astype(np.float32)
    tf_model = model_mod.build_model(config_mod.replace(tiny_cfg, **small))
    model_mod.params_from_canonical(tf_model, weights)
    out_tf = tf_model(tf.constant(x)).numpy()
    out_jax = np.asarray(
        jax_model.build_model(tiny_cfg).apply({"params": jax_model.params_from_canonical(weights)}, jnp.asarray(x))
    )
    assert rel_err(out_tf, out_jax.astype(np.float64)) < 1e-4
    back = model_mod.params_to_canonical(tf_model)
    assert all(np.array_equal(back[k], weights[k]) for k in weights)


def test_folded_pad_gradients_compiled_equal_separate_pad_and_survive_saving(tiny_cfg, tmp_path):
    """``conv_pad: folded`` (XLA convolutions with their own padding and a hand-given gradient): the
    XLA-compiled gradients of <g, model(x)> with respect to the input and every variable equal those of
    the separate-pad model in float32, and a saved ``.keras`` file loads with the setting and the outputs."""
    weights = unet_spec.init_weights(tiny_cfg, 3)
    x = tf.constant(RNG.standard_normal((2, 16, 16, 16, 4)).astype(np.float32))
    g = tf.constant(RNG.standard_normal((2, 16, 16, 16, 5)).astype(np.float32))
    forms = {"upconv": "subpixel_crop", "kernel_regroup": "transpose"}
    grads = {}
    for conv_pad in ("separate", "folded"):
        model = model_mod.build_model(config_mod.replace(tiny_cfg, conv_pad=conv_pad, **forms))
        model_mod.params_from_canonical(model, weights)

        @tf.function(jit_compile=True)
        def inner_grads(x, model=model):
            with tf.GradientTape() as tape:
                tape.watch(x)
                inner = tf.reduce_sum(model(x) * g)
            return tape.gradient(inner, [x, *model.trainable_variables])

        grads[conv_pad] = inner_grads(x)
    assert len(grads["folded"]) == len(grads["separate"]) > 1
    for got, want in zip(grads["folded"], grads["separate"]):
        assert rel_err(got, want.numpy().astype(np.float64)) < 1e-5
    path = tmp_path / "folded.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert model_mod.conv_layers(loaded)["last"].conv_pad == "folded"
    assert rel_err(loaded(x), model(x).numpy().astype(np.float64)) < 1e-6


def test_flat_adam_is_refused_in_one_line(tiny_cfg):
    """``adam_update: flat`` is JAX's (optax.flatten); TF's trainer refuses it, naming the key and value."""
    from shared_data.core.errors import UserError

    from tf_impl import step as step_mod

    with pytest.raises(UserError, match=r"'adam_update': TensorFlow has only per_tensor, got 'flat'"):
        step_mod.make_optimizer(config_mod.replace(tiny_cfg, adam_update="flat"), np.array([1e-3]))
    assert step_mod.make_optimizer(tiny_cfg, np.array([1e-3])).beta_1 == 0.9
