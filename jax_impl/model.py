"""The U-Net in Flax (linen), channels-last NDHWC; see :mod:`shared_data.model.unet_spec` for the contract.

Why linen: parameters are a plain nested dict, which maps one-to-one onto the canonical weights file,
optax and orbax, and keeps ``train_step`` a pure function of ``(state, batch)`` as in Flax's
ImageNet example.

Precision: parameters are float32; ``dtype`` (float32 / bfloat16 / float16) is the compute type,
to which inputs and kernels are cast; the last layer's output is cast to float32 before tanh. A bias
is broadcast in float32 and then cast, which gives the same forward values and makes its gradient (the
sum of the output's cotangent over batch and voxels) a float32 sum: a reduction in the half type
accumulates in the half type on XLA:CPU, where a bfloat16 sum stalls once the running total's spacing
exceeds the terms (a bias gradient far from its value, and another one for each split of the batch
across replicas). TensorFlow's XLA bridge sums half types in float32 (``XlaHelpers::SumAccumulationType``).

Down-convolution (``downconv``):

* ``strided``: ``lax.conv_general_dilated`` with stride 2, padding 1.
* ``space_to_depth`` (default): the same function as a stride-1 2x2x2 VALID convolution of the
  padded input rearranged by space-to-depth (2x2x2 blocks -> 8 C_in channels), with the kernel
  regrouped as ``w[2a + r] -> w'[a, (r, c_in)]`` per axis. Identical FLOPs; its input gradient is a
  stride-1 convolution instead of XLA's slow input-dilated one, which makes the backward pass many
  times faster (experiments/perf_notes.md).

Up-convolution (``upconv``):

* ``transpose``: ``lax.conv_general_dilated`` with ``lhs_dilation=2`` and the flipped kernel
  (the definition of a transposed convolution; XLA's GPU path for it and its gradient is slow).
* ``subpixel`` (default): the same function as 8 phase convolutions folded into one stride-1
  convolution. Per axis, output ``2m + r`` of ConvTranspose(k=4, s=2, p=1) only sees inputs
  ``m - 1, m`` (r = 0, taps 3, 1) or ``m, m + 1`` (r = 1, taps 2, 0). Padding the input by one voxel
  per side and running a 2x2x2 VALID convolution with ``8 x C_out`` output channels computes every
  phase; phase ``(r0, r1, r2)`` at output ``m`` is the result at ``m + r``, and a depth-to-space
  interleave builds the 2n^3 output. FLOPs are ``((n+1)/n)^3`` of the transposed convolution's.
  The parameter stays the canonical (4, 4, 4, C_in, C_out) kernel; the 2x2x2 phase kernel is
  gathered from it inside the step, so both modes share weights files and checkpoints.
* ``subpixel_crop``: ``subpixel`` with the phase channels in reversed order, ``(1 - r0, 1 - r1, 1 - r2,
  c_out)``: the depth-to-space is then one interleaving transpose of the (n+1)^3 phase volume into
  (2n+2)^3 and a crop of one voxel per side (:func:`depth_to_space_crop` derives it), an affine copy
  instead of eight shifted slices stacked; its gradient is a one-voxel pad and the inverse transpose.
* ``phases``: the same 8 phase convolutions run one by one, phase ``r`` on the window
  ``[r, r + n + 1)`` of the padded input with ``C_out`` channels, giving exactly the ``n^3`` outputs it
  needs: the transposed convolution's FLOPs with no ``((n+1)/n)^3`` excess (2x at n = 4), at the price
  of 8 narrower convolutions (slower than ``subpixel`` at every level on the H200).

``downconv_strided_below`` / ``upconv_transpose_below`` switch the small levels to the plain forms.

Step levers (the same function, other kernels; each form is tested against the float64 definition):

* ``conv_pad``: ``separate`` pads the up-conv's input by one voxel (a copy) and runs a VALID
  convolution; ``folded`` gives the padding to the convolution itself (``phases``: phase ``r`` pads
  ``(1 - r, r)`` per axis), so no padded copy is made or kept for the kernel gradient.
* ``kernel_regroup``: the phase kernel of ``subpixel`` / ``phases`` is formed every step from the
  canonical kernel, by a gather of ``PHASE_TAPS`` (``gather``; its gradient is a scatter) or as a flip,
  reshape and transpose (``transpose``; a permutation both ways, fused with the bf16 cast).
* ``skip_concat``: ``concat`` builds each decoder input ``[up, skip]``; ``split`` passes the pair to
  the next up-conv, which runs one convolution per part with its slice of the kernel's input channels
  and sums them before the depth-to-space (the sum fuses into the shuffle), so no concatenated copy is made.
* ``pad_out_channels``: the ``last`` layer's 5 output channels (40 phase channels) rounded up to a
  multiple of it with zero kernels, e.g. 8 (64 phase channels, a tensor-core tile), the extra channels
  dropped before tanh: more FLOPs in one layer for a better-shaped convolution.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from shared_data.core.config import Config
from shared_data.model.unet_spec import KERNEL, PHASE_TAPS, conv_method, encoder_widths, split_sum

DIMS = ("NDHWC", "DHWIO", "NDHWC")
KERNEL_INIT = nn.initializers.normal(stddev=0.02)


def phase_kernel(w: jax.Array) -> jax.Array:
    """(4, 4, 4, C_in, C_out) transposed-conv kernel -> (2, 2, 2, C_in, 8 C_out) phase kernel,
    output channels ordered (r0, r1, r2, c_out), by a gather of ``PHASE_TAPS`` (its gradient is a scatter)."""
    c_in, c_out = w.shape[3], w.shape[4]
    idx = PHASE_TAPS  # [r, a]
    # g[r0, a0, r1, a1, r2, a2, ci, co] = w[idx[r0, a0], idx[r1, a1], idx[r2, a2], ci, co]
    g = w[idx[:, :, None, None, None, None], idx[None, None, :, :, None, None], idx[None, None, None, None, :, :]]
    g = g.transpose(1, 3, 5, 6, 0, 2, 4, 7)  # a0, a1, a2, ci, r0, r1, r2, co
    return g.reshape(2, 2, 2, c_in, 8 * c_out)


def phase_kernel_transposed(w: jax.Array) -> jax.Array:
    """:func:`phase_kernel` as a flip, a reshape and a transpose (no gather, so its gradient is a
    transpose too, which XLA fuses with the casts). Per axis ``PHASE_TAPS[r, a] = 3 - (2 a + r)``:
    the flipped axis of 4 taps, read as (a, r), is the phase layout."""
    c_in, c_out = w.shape[3], w.shape[4]
    g = w[::-1, ::-1, ::-1].reshape(2, 2, 2, 2, 2, 2, c_in, c_out)  # a0, r0, a1, r1, a2, r2, ci, co
    return g.transpose(0, 2, 4, 6, 1, 3, 5, 7).reshape(2, 2, 2, c_in, 8 * c_out)


PHASE_KERNEL = {"gather": phase_kernel, "transpose": phase_kernel_transposed}


def depth_to_space(y: jax.Array, n: int, c_out: int) -> jax.Array:
    """Interleave the 8 phases of ``y`` (B, n+1, n+1, n+1, 8 C_out) into (B, 2n, 2n, 2n, C_out)."""
    b = y.shape[0]
    y = y.reshape(b, n + 1, n + 1, n + 1, 2, 2, 2, c_out)
    phases = [
        [[y[:, r0 : r0 + n, r1 : r1 + n, r2 : r2 + n, r0, r1, r2] for r2 in (0, 1)] for r1 in (0, 1)] for r0 in (0, 1)
    ]
    z = jnp.stack([jnp.stack([jnp.stack(p2, axis=-2) for p2 in p1], axis=-3) for p1 in phases], axis=-4)
    # z: (B, n, n, n, r0, r1, r2, C) -> (B, n, r0, n, r1, n, r2, C)
    z = z.transpose(0, 1, 4, 2, 5, 3, 6, 7)
    return z.reshape(b, 2 * n, 2 * n, 2 * n, c_out)


def inputs_of(x: jax.Array | tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """``x`` as a tuple of NDHWC inputs: one array, or the parts of a channel concatenation
    (``skip_concat: split``)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def pad1(x: jax.Array) -> jax.Array:
    """NDHWC ``x`` with one zero voxel added on each side of the three spatial axes."""
    return jnp.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))


def conv_phase(xi: jax.Array, wi: jax.Array, fold_pad: bool) -> jax.Array:
    """A 2x2x2 phase convolution of NDHWC ``xi`` padded by one voxel per side: (B, n+1, n+1, n+1, C)
    out. ``fold_pad``: the convolution pads (``conv_pad: folded``), else a pad and a VALID conv."""
    if fold_pad:
        return lax.conv_general_dilated(xi, wi, (1, 1, 1), [(1, 1)] * 3, dimension_numbers=DIMS)
    return lax.conv_general_dilated(pad1(xi), wi, (1, 1, 1), "VALID", dimension_numbers=DIMS)


def conv_transpose_subpixel(
    x: jax.Array | tuple[jax.Array, ...], w: jax.Array, *, fold_pad: bool = False, regroup: str = "gather"
) -> jax.Array:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` (or the channel concatenation of a tuple) by phase
    convolution + depth-to-space. ``fold_pad``: the one-voxel padding is the convolution's own
    (``conv_pad: folded``), not a separate pad; ``regroup``: ``PHASE_KERNEL`` key."""
    xs = inputs_of(x)
    n, c_out = xs[0].shape[1], w.shape[-1]

    conv = functools.partial(conv_phase, fold_pad=fold_pad)
    return depth_to_space(split_sum(conv, xs, PHASE_KERNEL[regroup](w)), n, c_out)


def depth_to_space_crop(y: jax.Array, n: int, c_out: int) -> jax.Array:
    """:func:`depth_to_space` for phase channels in reversed order ``(1 - r0, 1 - r1, 1 - r2, c_out)``:
    one interleaving transpose of ``y`` (B, n+1, n+1, n+1, 8 C_out) into (B, 2n+2, 2n+2, 2n+2, C_out) and
    a crop of one voxel per side. Per axis, with ``s = 1 - r``, the transpose puts phase ``r`` of
    window ``j`` at ``2 j + s``; output ``2 m + r`` is phase ``r`` of window ``m + r``, at
    ``2 m + 2 r + 1 - r = (2 m + r) + 1``: every output sits one place further, whatever its phase."""
    b = y.shape[0]
    z = y.reshape(b, n + 1, n + 1, n + 1, 2, 2, 2, c_out).transpose(0, 1, 4, 2, 5, 3, 6, 7)
    z = z.reshape(b, 2 * n + 2, 2 * n + 2, 2 * n + 2, c_out)
    return z[:, 1 : 2 * n + 1, 1 : 2 * n + 1, 1 : 2 * n + 1]


def conv_transpose_subpixel_crop(
    x: jax.Array | tuple[jax.Array, ...], w: jax.Array, *, fold_pad: bool = False, regroup: str = "gather"
) -> jax.Array:
    """:func:`conv_transpose_subpixel` with the phase kernel's output channels in reversed phase order, so
    that the depth-to-space is one transpose and a crop (:func:`depth_to_space_crop`) instead of eight
    shifted slices stacked (the same convolution, the same FLOPs)."""
    xs = inputs_of(x)
    n, c_in, c_out = xs[0].shape[1], w.shape[3], w.shape[-1]
    wk = PHASE_KERNEL[regroup](w).reshape(2, 2, 2, c_in, 2, 2, 2, c_out)[:, :, :, :, ::-1, ::-1, ::-1]
    wk = wk.reshape(2, 2, 2, c_in, 8 * c_out)

    conv = functools.partial(conv_phase, fold_pad=fold_pad)
    return depth_to_space_crop(split_sum(conv, xs, wk), n, c_out)


def conv_transpose_phases(
    x: jax.Array | tuple[jax.Array, ...], w: jax.Array, *, fold_pad: bool = False, regroup: str = "gather"
) -> jax.Array:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` as 8 separate phase convolutions (no excess
    FLOPs), interleaved into (B, 2n, 2n, 2n, C_out). Phase ``r`` reads the window ``[r - 1, r + n)``
    of ``x`` per axis: with ``fold_pad`` the convolution pads ``(1 - r, r)`` itself."""
    xs = inputs_of(x)
    b, n, c_out = xs[0].shape[0], xs[0].shape[1], w.shape[-1]
    wk = PHASE_KERNEL[regroup](w).reshape(2, 2, 2, w.shape[3], 2, 2, 2, c_out)

    def phase(r0, r1, r2):
        def conv(xi, wi):
            if fold_pad:
                pads = [(1 - r, r) for r in (r0, r1, r2)]
                return lax.conv_general_dilated(xi, wi, (1, 1, 1), pads, dimension_numbers=DIMS)
            xp = pad1(xi)[:, r0 : r0 + n + 1, r1 : r1 + n + 1, r2 : r2 + n + 1]
            return lax.conv_general_dilated(xp, wi, (1, 1, 1), "VALID", dimension_numbers=DIMS)

        return split_sum(conv, xs, wk[..., r0, r1, r2, :])

    phases = [[[phase(r0, r1, r2) for r2 in (0, 1)] for r1 in (0, 1)] for r0 in (0, 1)]
    z = jnp.stack([jnp.stack([jnp.stack(p2, axis=-2) for p2 in p1], axis=-3) for p1 in phases], axis=-4)
    return z.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, 2 * n, 2 * n, 2 * n, c_out)


def conv_transpose_dilated(x: jax.Array | tuple[jax.Array, ...], w: jax.Array, **_) -> jax.Array:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` as an input-dilated convolution with the
    spatially flipped kernel, padding k - 1 - p = 2 per side: one convolution whose output is the
    interleaved (B, 2n, 2n, 2n, C_out) volume, no depth-to-space pass (cuDNN's transposed convolution,
    a data-gradient kernel, when XLA matches it). Its padding is the convolution's own and its kernel a
    flip, so ``conv_pad`` and ``kernel_regroup`` do not change it."""

    def conv(xi, wi):
        return lax.conv_general_dilated(xi, wi, (1, 1, 1), [(2, 2)] * 3, lhs_dilation=(2, 2, 2), dimension_numbers=DIMS)

    return split_sum(conv, inputs_of(x), w[::-1, ::-1, ::-1])


UPCONV = {
    "subpixel": conv_transpose_subpixel,
    "subpixel_crop": conv_transpose_subpixel_crop,
    "phases": conv_transpose_phases,
    "transpose": conv_transpose_dilated,
}


def conv_strided(x: jax.Array, w: jax.Array, **_) -> jax.Array:
    """Conv3D(k=4, s=2, p=1) of NDHWC ``x`` with DHWIO kernel ``w`` (cross-correlation)."""
    return lax.conv_general_dilated(x, w, (2, 2, 2), [(1, 1)] * 3, dimension_numbers=DIMS)


def conv_space_to_depth(x: jax.Array, w: jax.Array, **_) -> jax.Array:
    """Conv3D(k=4, s=2, p=1) as space-to-depth of the padded input + a 2x2x2 stride-1 VALID conv. The
    pad is part of the space-to-depth copy (one fusion), and the kernel's regrouping is a reshape and a
    transpose, so ``conv_pad`` and ``kernel_regroup`` do not change it."""
    b, n, c = x.shape[0], x.shape[1], x.shape[-1]
    m = n // 2 + 1
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    s = xp.reshape(b, m, 2, m, 2, m, 2, c).transpose(0, 1, 3, 5, 2, 4, 6, 7).reshape(b, m, m, m, 8 * c)
    c_out = w.shape[-1]
    wk = w.reshape(2, 2, 2, 2, 2, 2, c, c_out).transpose(0, 2, 4, 1, 3, 5, 6, 7).reshape(2, 2, 2, 8 * c, c_out)
    return lax.conv_general_dilated(s, wk, (1, 1, 1), "VALID", dimension_numbers=DIMS)


DOWNCONV = {"space_to_depth": conv_space_to_depth, "strided": conv_strided}


class _Conv(nn.Module):
    """A (4, 4, 4, C_in, features) float32 kernel + bias applied in ``dtype`` by ``FNS[method]``.

    The input is one NDHWC array or, for an up-conv under ``skip_concat: split``, a tuple of arrays
    whose channels, concatenated, are the C_in of the kernel (the kernel is the same either way).
    ``conv_pad`` and ``kernel_regroup`` are the config keys of the same names; ``pad_out`` (> 1) runs
    the convolution with ``features`` rounded up to a multiple of it, the extra kernels and biases zero,
    and drops the extra output channels (``pad_out_channels``: tensor-core-sized channel counts)."""

    features: int
    method: str
    dtype: Any = jnp.float32
    conv_pad: str = "separate"
    kernel_regroup: str = "gather"
    pad_out: int = 0
    FNS: ClassVar[dict] = {}

    @nn.compact
    def __call__(self, x: jax.Array | tuple[jax.Array, ...]) -> jax.Array:
        xs = tuple(xi.astype(self.dtype) for xi in inputs_of(x))
        c_in = sum(xi.shape[-1] for xi in xs)
        w = self.param("kernel", KERNEL_INIT, (KERNEL, KERNEL, KERNEL, c_in, self.features), jnp.float32)
        b = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        w = w.astype(self.dtype)
        extra = -self.features % self.pad_out if self.pad_out > 1 else 0
        if extra:
            w, b = jnp.pad(w, ((0, 0),) * 4 + ((0, extra),)), jnp.pad(b, (0, extra))
        y = self.FNS[self.method](
            xs if len(xs) > 1 else xs[0], w, fold_pad=self.conv_pad == "folded", regroup=self.kernel_regroup
        )
        y = y + jnp.broadcast_to(b.astype(jnp.float32), y.shape).astype(self.dtype)  # a float32 bias gradient
        return y[..., : self.features] if extra else y


class DownConv(_Conv):
    """Conv3D(k=4, s=2, p=1) + bias: (B, n, n, n, C_in) -> (B, n/2, n/2, n/2, features)."""

    method: str = "space_to_depth"
    FNS = DOWNCONV


class UpConv(_Conv):
    """ConvTranspose3d(k=4, s=2, p=1) + bias: (B, n, n, n, C_in) -> (B, 2n, 2n, 2n, features)."""

    method: str = "subpixel"
    FNS = UPCONV


class UNet(nn.Module):
    """3-D U-Net of the tutorial. Input (B, s, s, s, N_in) any float; output (B, s, s, s, N_out) float32 in (-1, 1).

    Args:
        widths: encoder widths (``unet_widths``, already cut for ``full_scale``).
        out_channels: N_out.
        upconv: ``"subpixel"``, ``"subpixel_crop"``, ``"phases"`` or ``"transpose"``.
        downconv: ``"space_to_depth"`` or ``"strided"``.
        upconv_transpose_below: up-convs whose input is smaller than this (voxels per side) are
            ``"transpose"`` (0: none).
        downconv_strided_below: down-convs whose input is smaller than this are ``"strided"``.
        dtype: compute dtype.
        conv_pad: ``"separate"`` (a pad, then a VALID convolution) or ``"folded"`` (the convolution pads).
        kernel_regroup: ``"gather"`` or ``"transpose"``: how the phase kernel is formed (:data:`PHASE_KERNEL`).
        skip_concat: ``"concat"`` (the decoder's ``[up, skip]`` concatenated) or ``"split"`` (the next
            up-conv runs on each part with its slice of the kernel and sums: no concatenated buffer).
        pad_out_channels: the ``last`` layer computes ``out_channels`` rounded up to a multiple of this
            (zero kernels, extra channels dropped before tanh); 0 or 1: as many as it returns.
    """

    widths: tuple[int, ...]
    out_channels: int
    upconv: str = "subpixel"
    downconv: str = "space_to_depth"
    dtype: Any = jnp.float32
    upconv_transpose_below: int = 0
    downconv_strided_below: int = 0
    conv_pad: str = "separate"
    kernel_regroup: str = "gather"
    skip_concat: str = "concat"
    pad_out_channels: int = 0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        skips = []
        for i, w in enumerate(self.widths):
            with jax.named_scope(f"down{i + 1}"):
                method = conv_method("down", x.shape[1], self.downconv, self.downconv_strided_below)
                x = DownConv(w, method, self.dtype, self.conv_pad, self.kernel_regroup, name=f"down{i + 1}")(x)
                x = nn.leaky_relu(x, negative_slope=0.01)
                skips.append(x)
        n = len(self.widths)
        for j, w in enumerate(self.widths[-2::-1]):
            name = f"up{n - 1 - j}"
            with jax.named_scope(name):
                method = conv_method("up", inputs_of(x)[0].shape[1], self.upconv, self.upconv_transpose_below)
                x = nn.relu(UpConv(w, method, self.dtype, self.conv_pad, self.kernel_regroup, name=name)(x))
                x = (x, skips[n - 2 - j])
                if self.skip_concat == "concat":
                    x = jnp.concatenate(x, axis=-1)
        with jax.named_scope("last"):
            method = conv_method("up", inputs_of(x)[0].shape[1], self.upconv, self.upconv_transpose_below)
            last = UpConv(
                self.out_channels,
                method,
                self.dtype,
                self.conv_pad,
                self.kernel_regroup,
                self.pad_out_channels,
                name="last",
            )
            x = last(x)
            return jnp.tanh(x.astype(jnp.float32))


COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def build_model(cfg: Config) -> UNet:
    """The U-Net of ``cfg`` with compute dtype from its precision policy (``cfg.precision``)."""
    return UNet(
        encoder_widths(cfg),
        cfg.N_out_channels,
        cfg.upconv,
        cfg.downconv,
        COMPUTE_DTYPES[cfg.precision],
        cfg.upconv_transpose_below,
        cfg.downconv_strided_below,
        cfg.conv_pad,
        cfg.kernel_regroup,
        cfg.skip_concat,
        cfg.pad_out_channels,
    )


def init_params(cfg: Config, seed: int) -> dict:
    """Float32 parameters of ``build_model(cfg)`` from the canonical init (shared with TF via
    :func:`shared_data.model.unet_spec.init_weights`), so both frameworks start from the same weights."""
    from shared_data.model.unet_spec import init_weights

    return params_from_canonical(init_weights(cfg, seed))


def params_from_canonical(weights: dict[str, np.ndarray]) -> dict:
    """Canonical ``{"down1/kernel": ...}`` arrays -> Flax params ``{"down1": {"kernel": ...}}``."""
    params: dict = {}
    for key, value in weights.items():
        layer, leaf = key.split("/")
        params.setdefault(layer, {})[leaf] = jnp.asarray(value, jnp.float32)
    return params


def params_to_canonical(params: dict) -> dict[str, np.ndarray]:
    """Flax params -> canonical arrays (float32 NumPy)."""
    return {
        f"{layer}/{leaf}": np.asarray(v, np.float32) for layer, leaves in params.items() for leaf, v in leaves.items()
    }
