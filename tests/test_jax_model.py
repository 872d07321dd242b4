"""JAX U-Net: shapes and dtypes, up-convs against the float64 reference, parameters against the spec."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import rel_err

from shared_data.core import config as config_mod
from shared_data.model import unet_spec

from jax_impl import model as model_mod

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("method", ["subpixel", "subpixel_crop", "phases", "transpose"])
@pytest.mark.parametrize("n, c_in, c_out", [(1, 3, 2), (2, 4, 3), (5, 3, 4), (8, 6, 5)])
def test_upconv_equals_float64_transposed_conv_definition(method, n, c_in, c_out):
    x = RNG.standard_normal((2, n, n, n, c_in)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, c_in, c_out)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    ref = unet_spec.conv_transpose_reference(x, w, b)
    layer = model_mod.UpConv(c_out, method)
    got = layer.apply({"params": {"kernel": jnp.asarray(w), "bias": jnp.asarray(b)}}, jnp.asarray(x))
    assert got.shape == (2, 2 * n, 2 * n, 2 * n, c_out) and got.dtype == jnp.float32
    assert rel_err(got, ref) < 1e-5


# The fast tier runs each lever once (split inputs); the slow tier every combination, one input too.
FAST_FORMS = {
    ("subpixel", "folded", "transpose"),
    ("subpixel_crop", "separate", "gather"),
    ("subpixel_crop", "folded", "transpose"),
    ("phases", "folded", "transpose"),
    ("transpose", "separate", "gather"),
}
UPCONV_FORMS = [
    (method, pad, regroup, split)
    for method in ("subpixel", "subpixel_crop", "phases", "transpose")
    for pad in ("separate", "folded")
    for regroup in ("gather", "transpose")
    for split in (True, False)
    if method != "transpose" or (pad, regroup) == ("separate", "gather")  # the flipped-kernel form has neither
]


@pytest.mark.parametrize(
    "method, conv_pad, regroup, split",
    [p if p[3] and p[:3] in FAST_FORMS else pytest.param(*p, marks=pytest.mark.slow) for p in UPCONV_FORMS],
)
def test_upconv_forms_forward_and_gradients_equal_float64_reference(method, conv_pad, regroup, split, n=3):
    """Every up-conv form (``upconv`` x ``conv_pad`` x ``kernel_regroup``, one input or the two parts of a
    ``skip_concat: split`` input): output and the gradients of <g, output> with respect to the input(s)
    and the kernel against the float64 definition."""
    c_a, c_b, c_out = 3, 2, 4
    x = RNG.standard_normal((2, n, n, n, c_a + c_b)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, c_a + c_b, c_out)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    g = RNG.standard_normal((2, 2 * n, 2 * n, 2 * n, c_out)).astype(np.float32)
    layer = model_mod.UpConv(c_out, method, conv_pad=conv_pad, kernel_regroup=regroup)
    parts = (jnp.asarray(x[..., :c_a]), jnp.asarray(x[..., c_a:])) if split else jnp.asarray(x)

    def inner(parts, w):
        out = layer.apply({"params": {"kernel": w, "bias": jnp.asarray(b)}}, parts)
        return jnp.sum(out * jnp.asarray(g)), out

    (_, out), (dparts, dw) = jax.jit(jax.value_and_grad(inner, argnums=(0, 1), has_aux=True))(parts, jnp.asarray(w))
    dx = jnp.concatenate(dparts, axis=-1) if split else dparts
    ref_dx, ref_dw = unet_spec.conv_transpose_reference_grads(x, w, g)
    assert out.shape == (2, 2 * n, 2 * n, 2 * n, c_out) and out.dtype == jnp.float32
    assert rel_err(out, unet_spec.conv_transpose_reference(x, w, b)) < 1e-5
    assert rel_err(dx, ref_dx) < 1e-5 and rel_err(dw, ref_dw) < 1e-5


@pytest.mark.parametrize("method", [pytest.param("subpixel", marks=pytest.mark.slow), "subpixel_crop", "transpose"])
def test_padded_output_channels_equal_float64_reference(method):
    """``pad_out_channels``: the last layer's 5 channels computed as 8 (zero kernels), 5 returned; output and
    gradients against the float64 definition, and the kernel parameter keeps its canonical shape."""
    n, c_in, c_out = 3, 4, 5
    x = RNG.standard_normal((2, n, n, n, c_in)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, c_in, c_out)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    g = RNG.standard_normal((2, 2 * n, 2 * n, 2 * n, c_out)).astype(np.float32)
    layer = model_mod.UpConv(c_out, method, pad_out=8)
    assert jax.eval_shape(layer.init, jax.random.key(0), jnp.asarray(x))["params"]["kernel"].shape == w.shape

    def inner(x, w, b):
        out = layer.apply({"params": {"kernel": w, "bias": b}}, x)
        return jnp.sum(out * jnp.asarray(g)), out

    grad_fn = jax.jit(jax.value_and_grad(inner, argnums=(0, 1, 2), has_aux=True))
    (_, out), (dx, dw, db) = grad_fn(*map(jnp.asarray, (x, w, b)))
    ref_dx, ref_dw = unet_spec.conv_transpose_reference_grads(x, w, g)
    assert out.shape == (2, 2 * n, 2 * n, 2 * n, c_out)
    assert rel_err(out, unet_spec.conv_transpose_reference(x, w, b)) < 1e-5
    assert rel_err(dx, ref_dx) < 1e-5 and rel_err(dw, ref_dw) < 1e-5
    assert rel_err(db, g.astype(np.float64).sum(axis=(0, 1, 2, 3))) < 1e-5


def test_phase_kernel_forms_are_the_same_permutation():
    """The flip-reshape-transpose phase kernel is the gather of PHASE_TAPS, element for element."""
    w = jnp.asarray(RNG.standard_normal((4, 4, 4, 3, 2)).astype(np.float32))
    assert np.array_equal(model_mod.phase_kernel_transposed(w), model_mod.phase_kernel(w))


def test_reference_grads_against_finite_differences():
    """The float64 gradient reference equals central differences of the float64 forward reference
    (exact for a bilinear function up to rounding)."""
    x = RNG.standard_normal((1, 2, 2, 2, 2))
    w = RNG.standard_normal((4, 4, 4, 2, 3))
    g = RNG.standard_normal((1, 4, 4, 4, 3))
    dx, dw = unet_spec.conv_transpose_reference_grads(x, w, g)
    h = 1e-3
    for arr, grad in ((x, dx), (w, dw)):
        for idx in [tuple(RNG.integers(0, d) for d in arr.shape) for _ in range(6)]:
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += h
            minus[idx] -= h
            args_p = (plus, w) if arr is x else (x, plus)
            args_m = (minus, w) if arr is x else (x, minus)
            f_p, f_m = (np.sum(g * unet_spec.conv_transpose_reference(*args)) for args in (args_p, args_m))
            fd = (f_p - f_m) / (2 * h)
            assert abs(fd - grad[idx]) < 1e-8 * max(1.0, abs(fd))


@pytest.mark.parametrize("method", ["space_to_depth", "strided"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_downconv_equals_float64_reference(method, n):
    x = RNG.standard_normal((2, n, n, n, 3)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 4, 3, 5)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    got = model_mod.DownConv(5, method).apply(
        {"params": {"kernel": jnp.asarray(w), "bias": jnp.asarray(b)}}, jnp.asarray(x)
    )
    assert got.shape == (2, n // 2, n // 2, n // 2, 5)
    assert rel_err(got, unet_spec.conv_reference(x, w, b)) < 1e-5


def test_reference_itself_against_scatter_loop():
    """The vectorised reference equals the definition written as a plain scatter loop (1-D per axis)."""
    x = RNG.standard_normal((1, 2, 2, 2, 1))
    w = RNG.standard_normal((4, 4, 4, 1, 1))
    out = np.zeros((1, 4, 4, 4, 1))
    for i in np.ndindex(2, 2, 2):
        for k in np.ndindex(4, 4, 4):
            o = tuple(2 * ii - 1 + kk for ii, kk in zip(i, k))
            if all(0 <= oo < 4 for oo in o):
                out[(0, *o, 0)] += x[(0, *i, 0)] * w[(*k, 0, 0)]
    np.testing.assert_allclose(unet_spec.conv_transpose_reference(x, w), out, rtol=1e-12)


def test_full_size_net_shapes_dtypes_and_parameter_count():
    cfg = config_mod.load_config("base")
    model = model_mod.build_model(cfg)
    x = jax.ShapeDtypeStruct((2, 64, 64, 64, 4), jnp.float32)
    variables = jax.eval_shape(model.init, jax.random.key(0), x)
    out = jax.eval_shape(model.apply, variables, x)
    assert out.shape == (2, 64, 64, 64, 5) and out.dtype == jnp.float32
    n = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(variables))
    assert n == unet_spec.num_params(cfg)
    assert 116e6 < n < 118e6  # the model contract: about 117 M parameters
    shapes = {f"{l}/{k}": v.shape for l, d in variables["params"].items() for k, v in d.items()}
    assert shapes == {
        f"{s.name}/{leaf}": (s.kernel_shape if leaf == "kernel" else (s.c_out,))
        for s in unet_spec.layer_specs(cfg)
        for leaf in ("kernel", "bias")
    }
    bf16 = model_mod.build_model(config_mod.replace(cfg, enable_amp=True))
    assert jax.eval_shape(bf16.apply, variables, x).dtype == jnp.float32  # tanh output stays float32
    half = jax.eval_shape(bf16.init, jax.random.key(0), x)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(half))


@pytest.mark.parametrize("param_dtype, pad_out", [(jnp.float32, 0), (jnp.float32, 8), (jnp.bfloat16, 0)])
def test_bf16_bias_gradient_is_a_float32_sum(param_dtype, pad_out):
    """Under bfloat16 compute the bias gradient, a sum over batch and voxels of the output's
    cotangent, accumulates in float32: 2 x 16^3 terms of ~1e-3 against the float64 sum of the same
    bfloat16 cotangents (a bfloat16 running sum stalls once its spacing exceeds the terms, far below
    the total). The forward equals conv + bias rounded to bfloat16 first. Float32 parameters (the
    default) and bfloat16 ones (``grad_allreduce_dtype: bfloat16``, whose gradient is then rounded
    to bfloat16 once)."""
    c_in, c_out = 3, 5
    x = jnp.asarray(RNG.standard_normal((2, 32, 32, 32, c_in)), jnp.bfloat16)
    w = jnp.asarray(0.02 * RNG.standard_normal((4, 4, 4, c_in, c_out)), param_dtype)
    b = jnp.asarray(RNG.standard_normal(c_out), param_dtype)
    g = jnp.asarray(RNG.uniform(0.5, 1.5, (2, 16, 16, 16, c_out)) * 1e-3, jnp.bfloat16)
    layer = model_mod.DownConv(c_out, dtype=jnp.bfloat16, pad_out=pad_out)
    out, vjp = jax.vjp(lambda b: layer.apply({"params": {"kernel": w, "bias": b}}, x), b)
    (db,) = vjp(g)
    ref = np.asarray(g, np.float64).sum(axis=(0, 1, 2, 3))
    assert db.dtype == param_dtype and rel_err(db, ref) < (1e-5 if param_dtype == jnp.float32 else 4e-3)
    no_bias = layer.apply({"params": {"kernel": w, "bias": jnp.zeros_like(b)}}, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(no_bias + b.astype(jnp.bfloat16)))


@pytest.mark.slow
def test_tiny_net_runs_and_modes_agree(tiny_cfg):
    params = model_mod.init_params(tiny_cfg, seed=3)
    x = jnp.asarray(RNG.standard_normal((2, 16, 16, 16, 4)).astype(np.float32))
    a = model_mod.build_model(tiny_cfg).apply({"params": params}, x)
    b = model_mod.build_model(config_mod.replace(tiny_cfg, upconv="transpose", downconv="strided")).apply(
        {"params": params}, x
    )
    assert a.shape == (2, 16, 16, 16, 5) and float(jnp.abs(a).max()) < 1
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    mixed = config_mod.replace(tiny_cfg, upconv_transpose_below=4, downconv_strided_below=16)
    # tiny net: down-conv inputs 16, 8, 4 -> s2d, strided, strided;
    # up-conv inputs 2, 4, 8 -> transpose, subpixel, subpixel
    assert [unet_spec.conv_method("down", n, "space_to_depth", 16) for n in (16, 8, 4)] == [
        "space_to_depth",
        "strided",
        "strided",
    ]
    assert [unet_spec.conv_method("up", n, "subpixel", 4) for n in (2, 4, 8)] == ["transpose", "subpixel", "subpixel"]
    np.testing.assert_allclose(model_mod.build_model(mixed).apply({"params": params}, x), a, rtol=1e-5, atol=1e-6)
    half = model_mod.build_model(config_mod.replace(tiny_cfg, enable_amp=True)).apply({"params": params}, x)
    assert half.dtype == jnp.float32 and rel_err(half, np.asarray(a, np.float64)) < 5e-2


def test_canonical_round_trip(tiny_cfg, tmp_path):
    w = unet_spec.init_weights(tiny_cfg, 1)
    assert all(abs(v.std() - 0.02) < 0.005 for k, v in w.items() if k.endswith("kernel") and v.size > 1000)
    unet_spec.save_weights(tmp_path / "w.npz", w)
    back = model_mod.params_to_canonical(
        model_mod.params_from_canonical(unet_spec.load_weights(tmp_path / "w.npz", tiny_cfg))
    )
    assert set(back) == set(w) and all(np.array_equal(back[k], w[k]) for k in w)
    with pytest.raises(Exception, match=r"'down1/kernel' has shape \(4, 4, 4, 4, 4\), expected \(4, 4, 4, 4, 8\)"):
        unet_spec.load_weights(tmp_path / "w.npz", config_mod.replace(tiny_cfg, unet_widths=(8, 8, 8)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "levers",
    [
        {"conv_pad": "folded", "kernel_regroup": "transpose", "skip_concat": "split"},
        {
            "upconv": "subpixel_crop",
            "conv_pad": "folded",
            "kernel_regroup": "transpose",
            "skip_concat": "split",
            "pad_out_channels": 8,
        },
        {"upconv": "phases", "conv_pad": "folded", "skip_concat": "split"},
        {"upconv": "transpose", "skip_concat": "split"},
    ],
)
def test_tiny_net_levers_give_the_same_outputs_and_gradients(tiny_cfg, levers):
    """The whole net with the step levers (fp32): output and parameter gradients as the default forms'."""
    params = model_mod.init_params(tiny_cfg, seed=4)
    x = jnp.asarray(RNG.standard_normal((2, 16, 16, 16, 4)).astype(np.float32))

    def out_and_grads(cfg):
        model = model_mod.build_model(cfg)
        return jax.value_and_grad(lambda p: jnp.sum(model.apply({"params": p}, x) ** 2))(params)

    (ref, ref_g), (got, got_g) = out_and_grads(tiny_cfg), out_and_grads(config_mod.replace(tiny_cfg, **levers))
    assert abs(float(got) - float(ref)) < 1e-5 * abs(float(ref))
    for key in ref_g:
        for leaf in ("kernel", "bias"):
            assert rel_err(got_g[key][leaf], np.asarray(ref_g[key][leaf], np.float64)) < 1e-4, (key, leaf)


def test_flat_adam_equals_float64_adam(tiny_cfg):
    """``adam_update: flat`` (optax.flatten) and the per-tensor Adam against Adam written out in float64
    (Kingma & Ba 2015, Algorithm 1, PyTorch's eps placement) over three steps of a two-leaf tree."""
    from jax_impl import step as step_mod

    lrs = np.array([1e-2, 5e-3, 2e-3])
    params = {"a": RNG.standard_normal((3, 4)).astype(np.float32), "b": RNG.standard_normal(5).astype(np.float32)}
    grads = [{k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in params.items()} for _ in range(3)]
    ref = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in ref.items()}
    v2 = {k: np.zeros_like(v) for k, v in ref.items()}
    for t, g in enumerate(grads, start=1):
        for k in ref:
            m[k] = 0.9 * m[k] + 0.1 * g[k]
            v2[k] = 0.999 * v2[k] + 0.001 * g[k].astype(np.float64) ** 2
            mhat, vhat = m[k] / (1 - 0.9**t), v2[k] / (1 - 0.999**t)
            ref[k] = ref[k] - lrs[t - 1] * mhat / (np.sqrt(vhat) + 1e-8)
    for mode in ("per_tensor", "flat"):
        tx = step_mod.make_optimizer(config_mod.replace(tiny_cfg, adam_update=mode), lrs)
        p = {k: jnp.asarray(v) for k, v in params.items()}
        state = tx.init(p)
        for g in grads:
            updates, state = tx.update({k: jnp.asarray(v) for k, v in g.items()}, state, p)
            p = optax.apply_updates(p, updates)
        for k in ref:
            assert rel_err(p[k], ref[k]) < 1e-6, (mode, k)
    flat_state = step_mod.make_optimizer(config_mod.replace(tiny_cfg, adam_update="flat"), lrs).init(params)
    assert {leaf.shape for leaf in jax.tree.leaves(flat_state) if leaf.ndim} == {(17,)}  # one vector per moment
