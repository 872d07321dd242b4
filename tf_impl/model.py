"""The U-Net in Keras 3 (TensorFlow backend), channels-last NDHWC; see :mod:`shared_data.model.unet_spec`.

Mirrors :mod:`jax_impl.model` function by function: the same layer names (``down1`` ... ``last``),
the same canonical (4, 4, 4, C_in, C_out) kernels, the same ``downconv`` (``space_to_depth`` /
``strided``) and ``upconv`` (``subpixel`` / ``phases`` / ``transpose``) formulations and
small-level overrides; the docstring of :mod:`jax_impl.model` derives them.

Precision follows Keras' mixed-precision policy: ``float32``, ``mixed_bfloat16`` or
``mixed_float16`` (variables float32, compute in the half type). The last layer's output is cast to
float32 before tanh, so the output and the loss stay float32.
"""

from __future__ import annotations

from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

from shared_data.core.config import Config
from shared_data.model.unet_spec import KERNEL, PHASE_TAPS, conv_method, encoder_widths

#: Keras' registered-name prefix of the custom layers (``dlas_cosmo>DownConv``): a ``.keras`` file of
#: the model loads with ``keras.models.load_model`` once this module is imported.
SERIALIZATION_PACKAGE = "dlas_cosmo"
POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
KERNEL_INIT = keras.initializers.RandomNormal(stddev=0.02)


def phase_kernel(w: tf.Tensor) -> tf.Tensor:
    """(4, 4, 4, C_in, C_out) transposed-conv kernel -> (2, 2, 2, C_in, 8 C_out) phase kernel,
    output channels ordered (r0, r1, r2, c_out)."""
    c_in, c_out = w.shape[3], w.shape[4]
    idx = PHASE_TAPS  # [r, a]
    taps = (
        16 * idx[:, :, None, None, None, None]
        + 4 * idx[None, None, :, :, None, None]
        + idx[None, None, None, None, :, :]
    )  # [r0, a0, r1, a1, r2, a2] -> flat tap
    g = tf.gather(tf.reshape(w, (KERNEL**3, c_in, c_out)), taps)
    g = tf.transpose(g, (1, 3, 5, 6, 0, 2, 4, 7))  # a0, a1, a2, ci, r0, r1, r2, co
    return tf.reshape(g, (2, 2, 2, c_in, 8 * c_out))


def side(x: tf.Tensor) -> int | tf.Tensor:
    """The spatial side of NDHWC ``x``: static when known, else a tensor (a model built with a free side)."""
    return x.shape[1] if x.shape[1] is not None else tf.shape(x)[1]


def depth_to_space(y: tf.Tensor, n: int | tf.Tensor, c_out: int) -> tf.Tensor:
    """Interleave the 8 phases of ``y`` (B, n+1, n+1, n+1, 8 C_out) into (B, 2n, 2n, 2n, C_out)."""
    y = tf.reshape(y, (-1, n + 1, n + 1, n + 1, 2, 2, 2, c_out))
    phases = [
        [[y[:, r0 : r0 + n, r1 : r1 + n, r2 : r2 + n, r0, r1, r2] for r2 in (0, 1)] for r1 in (0, 1)] for r0 in (0, 1)
    ]
    z = tf.stack([tf.stack([tf.stack(p2, axis=-2) for p2 in p1], axis=-3) for p1 in phases], axis=-4)
    z = tf.transpose(z, (0, 1, 4, 2, 5, 3, 6, 7))
    return tf.reshape(z, (-1, 2 * n, 2 * n, 2 * n, c_out))


def conv_transpose_subpixel(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` by phase convolution + depth-to-space."""
    n, c_out = side(x), w.shape[-1]
    xp = tf.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    y = tf.nn.conv3d(xp, phase_kernel(w), (1, 1, 1, 1, 1), "VALID")
    return depth_to_space(y, n, c_out)


def conv_transpose_phases(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` as 8 separate phase convolutions (no excess
    FLOPs), interleaved into (B, 2n, 2n, 2n, C_out)."""
    n, c_out = side(x), w.shape[-1]
    xp = tf.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    wk = tf.reshape(phase_kernel(w), (2, 2, 2, x.shape[-1], 2, 2, 2, c_out))
    phases = [
        [
            [
                tf.nn.conv3d(
                    xp[:, r0 : r0 + n + 1, r1 : r1 + n + 1, r2 : r2 + n + 1],
                    wk[..., r0, r1, r2, :],
                    (1, 1, 1, 1, 1),
                    "VALID",
                )
                for r2 in (0, 1)
            ]
            for r1 in (0, 1)
        ]
        for r0 in (0, 1)
    ]
    z = tf.stack([tf.stack([tf.stack(p2, axis=-2) for p2 in p1], axis=-3) for p1 in phases], axis=-4)
    z = tf.transpose(z, (0, 1, 4, 2, 5, 3, 6, 7))
    return tf.reshape(z, (-1, 2 * n, 2 * n, 2 * n, c_out))


def conv_transpose_dilated(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` with ``tf.nn.conv3d_transpose`` (its kernel
    layout is (k, k, k, C_out, C_in), hence the transpose)."""
    n = side(x)
    out_shape = tf.stack([tf.shape(x)[0], 2 * n, 2 * n, 2 * n, w.shape[-1]])
    return tf.nn.conv3d_transpose(x, tf.transpose(w, (0, 1, 2, 4, 3)), out_shape, (1, 2, 2, 2, 1), "SAME")


def conv_strided(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    """Conv3D(k=4, s=2, p=1) of NDHWC ``x`` with DHWIO kernel ``w`` (explicit padding 1)."""
    xp = tf.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    return tf.nn.conv3d(xp, w, (1, 2, 2, 2, 1), "VALID")


def conv_space_to_depth(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    """Conv3D(k=4, s=2, p=1) as space-to-depth of the padded input + a 2x2x2 stride-1 VALID conv."""
    n, c = side(x), x.shape[-1]
    m = n // 2 + 1
    xp = tf.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    s = tf.reshape(
        tf.transpose(tf.reshape(xp, (-1, m, 2, m, 2, m, 2, c)), (0, 1, 3, 5, 2, 4, 6, 7)), (-1, m, m, m, 8 * c)
    )
    c_out = w.shape[-1]
    wk = tf.reshape(
        tf.transpose(tf.reshape(w, (2, 2, 2, 2, 2, 2, c, c_out)), (0, 2, 4, 1, 3, 5, 6, 7)), (2, 2, 2, 8 * c, c_out)
    )
    return tf.nn.conv3d(s, wk, (1, 1, 1, 1, 1), "VALID")


UPCONV = {"subpixel": conv_transpose_subpixel, "phases": conv_transpose_phases, "transpose": conv_transpose_dilated}
DOWNCONV = {"space_to_depth": conv_space_to_depth, "strided": conv_strided}


class _Conv(keras.layers.Layer):
    """A (4, 4, 4, C_in, features) kernel + bias applied by ``fn``; variables float32."""

    fns: ClassVar[dict] = {}

    def __init__(self, features: int, method: str, **kwargs):
        super().__init__(**kwargs)
        self.features, self.method = features, method

    def build(self, input_shape):
        self.kernel = self.add_weight(
            name="kernel", shape=(KERNEL, KERNEL, KERNEL, input_shape[-1], self.features), initializer=KERNEL_INIT
        )
        self.bias = self.add_weight(name="bias", shape=(self.features,), initializer="zeros")

    def call(self, x):
        dt = self.compute_dtype
        return self.fns[self.method](tf.cast(x, dt), tf.cast(self.kernel, dt)) + tf.cast(self.bias, dt)

    def get_config(self):
        return {**super().get_config(), "features": self.features, "method": self.method}


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class DownConv(_Conv):
    """Conv3D(k=4, s=2, p=1) + bias: (B, n, n, n, C_in) -> (B, n/2, n/2, n/2, features)."""

    fns = DOWNCONV


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class UpConv(_Conv):
    """ConvTranspose3d(k=4, s=2, p=1) + bias: (B, n, n, n, C_in) -> (B, 2n, 2n, 2n, features)."""

    fns = UPCONV


def build_model(cfg: Config, batch_size: int | None = None, free_side: bool = False) -> keras.Model:
    """The U-Net of ``cfg`` as a functional Keras model under ``cfg.precision``'s policy.

    Input (B, s, s, s, N_in) float32; output (B, s, s, s, N_out) float32 in (-1, 1); ``s`` is
    ``crop_size``, or with ``free_side`` any multiple of 2**levels given at call time.
    """
    policy = keras.DTypePolicy(POLICIES[cfg.precision])
    s = None if free_side else cfg.crop_size
    inputs = keras.Input((s, s, s, cfg.N_in_channels), batch_size=batch_size, name="inputs")
    widths = encoder_widths(cfg)
    x, skips = inputs, []
    for i, w in enumerate(widths):
        method = conv_method("down", x.shape[1], cfg.downconv, cfg.downconv_strided_below)
        x = DownConv(w, method, dtype=policy, name=f"down{i + 1}")(x)
        x = keras.layers.LeakyReLU(negative_slope=0.01, dtype=policy, name=f"down{i + 1}_act")(x)
        skips.append(x)
    n = len(widths)
    for j, w in enumerate(widths[-2::-1]):
        name = f"up{n - 1 - j}"
        method = conv_method("up", x.shape[1], cfg.upconv, cfg.upconv_transpose_below)
        x = UpConv(w, method, dtype=policy, name=name)(x)
        x = keras.layers.ReLU(dtype=policy, name=f"{name}_act")(x)
        x = keras.layers.Concatenate(axis=-1, dtype=policy, name=f"{name}_concat")([x, skips[n - 2 - j]])
    method = conv_method("up", x.shape[1], cfg.upconv, cfg.upconv_transpose_below)
    x = UpConv(cfg.N_out_channels, method, dtype=policy, name="last")(x)
    out = keras.layers.Activation("tanh", dtype="float32", name="tanh")(x)
    return keras.Model(inputs, out, name="unet")


def conv_layers(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """The model's conv layers by canonical name (``down1`` ... ``last``)."""
    return {layer.name: layer for layer in model.layers if isinstance(layer, _Conv)}


def params_from_canonical(model: keras.Model, weights: dict[str, np.ndarray]) -> keras.Model:
    """Load canonical arrays (``"down1/kernel"`` ...) into the model's variables; return the model."""
    for name, layer in conv_layers(model).items():
        layer.kernel.assign(weights[f"{name}/kernel"])
        layer.bias.assign(weights[f"{name}/bias"])
    return model


def params_to_canonical(model: keras.Model) -> dict[str, np.ndarray]:
    """The model's variables as canonical float32 arrays."""
    out = {}
    for name, layer in conv_layers(model).items():
        out[f"{name}/kernel"] = np.asarray(layer.kernel.numpy(), np.float32)
        out[f"{name}/bias"] = np.asarray(layer.bias.numpy(), np.float32)
    return out
