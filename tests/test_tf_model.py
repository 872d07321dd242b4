"""TF U-Net: shapes and dtypes per policy, up/down-convs against float64 references, JAX parity."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import rel_err

from shared_data.core import config as config_mod
from shared_data.model import unet_spec
from tf_impl import model as model_mod

RNG = np.random.default_rng(1)


@pytest.mark.parametrize("method", ["subpixel", "phases", "transpose"])
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


@pytest.mark.parametrize("small", [{}, {"upconv_transpose_below": 4, "downconv_strided_below": 16, "upconv": "phases"}])
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
