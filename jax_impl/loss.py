"""The training loss of the JAX trainer: the counterpart of :mod:`tf_impl.loss`, term by term.

Per sample, in float32, over a crop of side s with N_out channels (channels last):

* L1: mean over voxels and channels of |f(pred) - f(target)| (with ``loss_norm: l2`` of its square:
  L1 is minimised by the conditional median of the target given the input, L2 by its conditional
  mean, which differ where the target is multi-modal, as a two-phase temperature is), where ``f`` is the identity for
  ``loss_space: log`` (the stored, log-transformed units) and, for ``loss_space: physical``,
  rho / <rho> = exp(density_scale x) on ``density_channel`` and T / T0 = exp(temperature_scale x) on
  ``temperature_channel`` (the other channels, velocities, are linear already);
* ``lambda_rho`` x mean over voxels of |exp(s x_pred) - exp(s x_target)| on the density channel,
  s = ``density_scale`` (the tutorial's physical-space term; in any ``loss_space``);
* ``lambda_fourier`` x mean over the modes of the real 3-D FFT (``rfftn`` over the crop's three
  spatial axes, s x s x (s/2 + 1) modes, orthonormal: sum |F|^2 = sum |x|^2) and over channels of
  |FFT(f(pred) - f(target))|: an L1 in Fourier space, which weights the small-scale modes as much
  as the large ones (a pixel-space L1 lets the smooth part of the error dominate); with
  ``fourier_channels: scored`` over the density and temperature channels only (the two the
  time-to-quality target scores), which costs 2/N_out of the transforms.

The loss is the mean of the per-sample values over the samples whose ``mask`` is 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from shared_data.core.config import Config


def loss_space_scales(cfg: Config) -> np.ndarray:
    """Per output channel, the scale ``a`` of ``f(x) = exp(a x)`` for ``loss_space: physical`` (0: f is
    the identity); all zeros for ``loss_space: log``. (N_out,) float32."""
    scales = np.zeros(cfg.N_out_channels, np.float32)
    if cfg.loss_space == "physical":
        scales[cfg.density_channel] = cfg.density_scale
        scales[cfg.temperature_channel] = cfg.temperature_scale
    return scales


def to_loss_space(x: jax.Array, cfg: Config) -> jax.Array:
    """``x`` (..., N_out) float32 in the units the loss compares (:func:`loss_space_scales`)."""
    scales = loss_space_scales(cfg)
    if not scales.any():
        return x
    return jnp.where(scales > 0, jnp.exp(jnp.asarray(scales) * x), x)


def fourier_l1(diff: jax.Array) -> jax.Array:
    """Per sample, the mean over the real-FFT modes and channels of |rfftn(diff)| (orthonormal), for
    ``diff`` (B, s, s, s, C) float32; (B,) float32."""
    modes = jnp.fft.rfftn(jnp.moveaxis(diff, -1, 1), axes=(2, 3, 4), norm="ortho")
    return jnp.mean(jnp.abs(modes), axis=(1, 2, 3, 4))


def fourier_diff(diff: jax.Array, cfg: Config) -> jax.Array:
    """The channels of ``diff`` (B, s, s, s, N_out) that the Fourier term compares (``fourier_channels``)."""
    if cfg.fourier_channels == "scored":
        return diff[..., jnp.asarray([cfg.density_channel, cfg.temperature_channel])]
    return diff


def loss_fn(pred: jax.Array, batch: dict, cfg: Config) -> jax.Array:
    """The masked mean over samples of the module docstring's per-sample loss; float32 scalar.

    ``pred`` and ``batch["targets"]`` (B, s, s, s, N_out) in stored units (any float dtype),
    ``batch["mask"]`` (B,) float32.
    """
    y = batch["targets"].astype(jnp.float32)
    pred = pred.astype(jnp.float32)
    diff = to_loss_space(pred, cfg) - to_loss_space(y, cfg)
    per_sample = jnp.mean(jnp.abs(diff) if cfg.loss_norm == "l1" else jnp.square(diff), axis=(1, 2, 3, 4))
    if cfg.lambda_rho:
        d, s = cfg.density_channel, cfg.density_scale
        rho = jnp.mean(jnp.abs(jnp.exp(s * pred[..., d]) - jnp.exp(s * y[..., d])), axis=(1, 2, 3))
        per_sample = per_sample + cfg.lambda_rho * rho
    if cfg.lambda_fourier:
        per_sample = per_sample + cfg.lambda_fourier * fourier_l1(fourier_diff(diff, cfg))
    mask = batch["mask"]
    return jnp.sum(per_sample * mask) / jnp.maximum(jnp.sum(mask), 1.0)
