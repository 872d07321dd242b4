"""The U-Net in Flax (linen), channels-last NDHWC; see :mod:`shared_data.model.unet_spec` for the contract.

Why linen: parameters are a plain nested dict, which maps one-to-one onto the canonical weights file,
optax and orbax, and keeps ``train_step`` a pure function of ``(state, batch)`` as in Flax's
ImageNet example.

Precision: parameters are float32; ``dtype`` (float32 / bfloat16 / float16) is the compute type,
to which inputs and kernels are cast; the last layer's output is cast to float32 before tanh.

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
* ``phases``: the same 8 phase convolutions run one by one, phase ``r`` on the window
  ``[r, r + n + 1)`` of the padded input with ``C_out`` channels, giving exactly the ``n^3`` outputs it
  needs: the transposed convolution's FLOPs with no ``((n+1)/n)^3`` excess (2x at n = 4), at the price
  of 8 narrower convolutions (slower than ``subpixel`` at every level on the H200).

``downconv_strided_below`` / ``upconv_transpose_below`` switch the small levels to the plain forms.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from shared_data.core.config import Config
from shared_data.model.unet_spec import KERNEL, PHASE_TAPS, conv_method, encoder_widths

DIMS = ("NDHWC", "DHWIO", "NDHWC")
KERNEL_INIT = nn.initializers.normal(stddev=0.02)


def phase_kernel(w: jax.Array) -> jax.Array:
    """(4, 4, 4, C_in, C_out) transposed-conv kernel -> (2, 2, 2, C_in, 8 C_out) phase kernel,
    output channels ordered (r0, r1, r2, c_out)."""
    c_in, c_out = w.shape[3], w.shape[4]
    idx = PHASE_TAPS  # [r, a]
    # g[r0, a0, r1, a1, r2, a2, ci, co] = w[idx[r0, a0], idx[r1, a1], idx[r2, a2], ci, co]
    g = w[idx[:, :, None, None, None, None], idx[None, None, :, :, None, None], idx[None, None, None, None, :, :]]
    g = g.transpose(1, 3, 5, 6, 0, 2, 4, 7)  # a0, a1, a2, ci, r0, r1, r2, co
    return g.reshape(2, 2, 2, c_in, 8 * c_out)


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


def conv_transpose_subpixel(x: jax.Array, w: jax.Array) -> jax.Array:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` by phase convolution + depth-to-space."""
    n, c_out = x.shape[1], w.shape[-1]
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    y = lax.conv_general_dilated(xp, phase_kernel(w), (1, 1, 1), "VALID", dimension_numbers=DIMS)
    return depth_to_space(y, n, c_out)


def conv_transpose_phases(x: jax.Array, w: jax.Array) -> jax.Array:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` as 8 separate phase convolutions (no excess
    FLOPs), interleaved into (B, 2n, 2n, 2n, C_out)."""
    b, n, c_out = x.shape[0], x.shape[1], w.shape[-1]
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    wk = phase_kernel(w).reshape(2, 2, 2, x.shape[-1], 2, 2, 2, c_out)
    phases = [
        [
            [
                lax.conv_general_dilated(
                    xp[:, r0 : r0 + n + 1, r1 : r1 + n + 1, r2 : r2 + n + 1],
                    wk[..., r0, r1, r2, :],
                    (1, 1, 1),
                    "VALID",
                    dimension_numbers=DIMS,
                )
                for r2 in (0, 1)
            ]
            for r1 in (0, 1)
        ]
        for r0 in (0, 1)
    ]
    z = jnp.stack([jnp.stack([jnp.stack(p2, axis=-2) for p2 in p1], axis=-3) for p1 in phases], axis=-4)
    return z.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, 2 * n, 2 * n, 2 * n, c_out)


def conv_transpose_dilated(x: jax.Array, w: jax.Array) -> jax.Array:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` as an input-dilated convolution with the
    spatially flipped kernel, padding k - 1 - p = 2 per side."""
    return lax.conv_general_dilated(
        x, w[::-1, ::-1, ::-1], (1, 1, 1), [(2, 2)] * 3, lhs_dilation=(2, 2, 2), dimension_numbers=DIMS
    )


UPCONV = {"subpixel": conv_transpose_subpixel, "phases": conv_transpose_phases, "transpose": conv_transpose_dilated}


def conv_strided(x: jax.Array, w: jax.Array) -> jax.Array:
    """Conv3D(k=4, s=2, p=1) of NDHWC ``x`` with DHWIO kernel ``w`` (cross-correlation)."""
    return lax.conv_general_dilated(x, w, (2, 2, 2), [(1, 1)] * 3, dimension_numbers=DIMS)


def conv_space_to_depth(x: jax.Array, w: jax.Array) -> jax.Array:
    """Conv3D(k=4, s=2, p=1) as space-to-depth of the padded input + a 2x2x2 stride-1 VALID conv."""
    b, n, c = x.shape[0], x.shape[1], x.shape[-1]
    m = n // 2 + 1
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    s = xp.reshape(b, m, 2, m, 2, m, 2, c).transpose(0, 1, 3, 5, 2, 4, 6, 7).reshape(b, m, m, m, 8 * c)
    c_out = w.shape[-1]
    wk = w.reshape(2, 2, 2, 2, 2, 2, c, c_out).transpose(0, 2, 4, 1, 3, 5, 6, 7).reshape(2, 2, 2, 8 * c, c_out)
    return lax.conv_general_dilated(s, wk, (1, 1, 1), "VALID", dimension_numbers=DIMS)


DOWNCONV = {"space_to_depth": conv_space_to_depth, "strided": conv_strided}


class _Conv(nn.Module):
    """A (4, 4, 4, C_in, features) float32 kernel + bias applied in ``dtype`` by ``FNS[method]``."""

    features: int
    method: str
    dtype: Any = jnp.float32
    FNS: ClassVar[dict] = {}

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.param("kernel", KERNEL_INIT, (KERNEL, KERNEL, KERNEL, x.shape[-1], self.features), jnp.float32)
        b = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        return self.FNS[self.method](x.astype(self.dtype), w.astype(self.dtype)) + b.astype(self.dtype)


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
        upconv: ``"subpixel"``, ``"phases"`` or ``"transpose"``.
        downconv: ``"space_to_depth"`` or ``"strided"``.
        upconv_transpose_below: up-convs whose input is smaller than this (voxels per side) are
            ``"transpose"`` (0: none).
        downconv_strided_below: down-convs whose input is smaller than this are ``"strided"``.
        dtype: compute dtype.
    """

    widths: tuple[int, ...]
    out_channels: int
    upconv: str = "subpixel"
    downconv: str = "space_to_depth"
    dtype: Any = jnp.float32
    upconv_transpose_below: int = 0
    downconv_strided_below: int = 0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        skips = []
        for i, w in enumerate(self.widths):
            with jax.named_scope(f"down{i + 1}"):
                method = conv_method("down", x.shape[1], self.downconv, self.downconv_strided_below)
                x = DownConv(w, method, self.dtype, name=f"down{i + 1}")(x)
                x = nn.leaky_relu(x, negative_slope=0.01)
                skips.append(x)
        n = len(self.widths)
        for j, w in enumerate(self.widths[-2::-1]):
            name = f"up{n - 1 - j}"
            with jax.named_scope(name):
                method = conv_method("up", x.shape[1], self.upconv, self.upconv_transpose_below)
                x = nn.relu(UpConv(w, method, self.dtype, name=name)(x))
                x = jnp.concatenate([x, skips[n - 2 - j]], axis=-1)
        with jax.named_scope("last"):
            method = conv_method("up", x.shape[1], self.upconv, self.upconv_transpose_below)
            x = UpConv(self.out_channels, method, self.dtype, name="last")(x)
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
