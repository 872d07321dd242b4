"""The U-Net in Keras 3 (TensorFlow backend), channels-last NDHWC; see :mod:`shared_data.model.unet_spec`.

Mirrors :mod:`jax_impl.model` function by function: the same layer names (``down1`` ... ``last``),
the same canonical (4, 4, 4, C_in, C_out) kernels, the same ``downconv`` (``space_to_depth`` /
``strided``) and ``upconv`` (``subpixel`` / ``subpixel_crop`` / ``phases`` / ``transpose``)
formulations and small-level overrides, and the step levers ``kernel_regroup``, ``skip_concat`` and
``pad_out_channels`` and ``conv_pad``; the docstring of :mod:`jax_impl.model` derives them.
``tf.nn.conv3d`` takes no explicit padding, so ``conv_pad: folded`` runs the up-convs' convolutions as
XLA convolutions with their own padding (:func:`conv3d_padded`), the op JAX's ``conv_general_dilated``
lowers to.

Precision follows Keras' mixed-precision policy: ``float32``, ``mixed_bfloat16`` or
``mixed_float16`` (variables float32, compute in the half type). The last layer's output is cast to
float32 before tanh, so the output and the loss stay float32.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

# Private TF modules, because no public API does this: no public TF op takes a 3-D convolution's explicit
# padding (tf.nn.conv3d: SAME or VALID), and tf.raw_ops.XlaConvV2 needs the dimension-numbers proto these define.
from tensorflow.compiler.tf2xla.python import xla as tf_xla
from tensorflow.compiler.xla import xla_data_pb2

from shared_data.core.config import Config
from shared_data.model.unet_spec import KERNEL, PHASE_TAPS, conv_method, encoder_widths, split_sum

#: Keras' registered-name prefix of the custom layers (``dlas_cosmo>DownConv``): a ``.keras`` file of
#: the model loads with ``keras.models.load_model`` once this module is imported.
SERIALIZATION_PACKAGE = "dlas_cosmo"
POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
KERNEL_INIT = keras.initializers.RandomNormal(stddev=0.02)


def phase_kernel(w: tf.Tensor) -> tf.Tensor:
    """(4, 4, 4, C_in, C_out) transposed-conv kernel -> (2, 2, 2, C_in, 8 C_out) phase kernel,
    output channels ordered (r0, r1, r2, c_out), by a gather of ``PHASE_TAPS``."""
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


def phase_kernel_transposed(w: tf.Tensor) -> tf.Tensor:
    """:func:`phase_kernel` as a flip, a reshape and a transpose (``PHASE_TAPS[r, a] = 3 - (2 a + r)``
    per axis; :func:`jax_impl.model.phase_kernel_transposed`)."""
    c_in, c_out = w.shape[3], w.shape[4]
    g = tf.reshape(tf.reverse(w, axis=[0, 1, 2]), (2, 2, 2, 2, 2, 2, c_in, c_out))  # a0, r0, a1, r1, a2, r2
    return tf.reshape(tf.transpose(g, (0, 2, 4, 6, 1, 3, 5, 7)), (2, 2, 2, c_in, 8 * c_out))


PHASE_KERNEL = {"gather": phase_kernel, "transpose": phase_kernel_transposed}


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


def inputs_of(x) -> tuple[tf.Tensor, ...]:
    """``x`` as a tuple of NDHWC inputs: one tensor, or the parts of a channel concatenation
    (``skip_concat: split``)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def pad1(x: tf.Tensor) -> tf.Tensor:
    """NDHWC ``x`` with one zero voxel added on each side of the three spatial axes."""
    return tf.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))


def _dimension_numbers(lhs: str, rhs: str, out: str) -> xla_data_pb2.ConvolutionDimensionNumbers:
    """XLA convolution dimension numbers from layout strings: ``lhs``/``out`` name the batch ``B``,
    feature ``F`` and spatial ``012`` axes, ``rhs`` the input ``I``, output ``O`` and spatial axes."""
    dn = xla_data_pb2.ConvolutionDimensionNumbers()
    dn.input_batch_dimension, dn.input_feature_dimension = lhs.index("B"), lhs.index("F")
    dn.input_spatial_dimensions.extend(lhs.index(a) for a in "012")
    dn.kernel_input_feature_dimension, dn.kernel_output_feature_dimension = rhs.index("I"), rhs.index("O")
    dn.kernel_spatial_dimensions.extend(rhs.index(a) for a in "012")
    dn.output_batch_dimension, dn.output_feature_dimension = out.index("B"), out.index("F")
    dn.output_spatial_dimensions.extend(out.index(a) for a in "012")
    return dn


#: NDHWC input, DHWIO kernel, NDHWC output.
CONV_DIMS = _dimension_numbers("B012F", "012IO", "B012F")
#: The kernel gradient as a convolution: the input's channels are the batch, its batch the feature; the
#: output gradient is the kernel; the result comes out as a DHWIO kernel.
KERNEL_GRAD_DIMS = _dimension_numbers("F012B", "I012O", "012BF")


def _xla_conv(x: tf.Tensor, w: tf.Tensor, pads, dims) -> tf.Tensor:
    return tf_xla.conv(x, w, [1, 1, 1], pads, [1, 1, 1], [1, 1, 1], dims, precision_config=None)


def conv3d_padded(x: tf.Tensor, w: tf.Tensor, pads) -> tf.Tensor:
    """Stride-1 convolution of NDHWC ``x`` with DHWIO kernel ``w``, the convolution padding ``pads``
    ((lo, hi) per spatial axis) itself: no padded copy of ``x``. Output (B, n + lo + hi - k + 1, ...,
    C_out) in ``x``'s dtype.

    Its gradient is given here (XLA's convolution op has none registered in TF), the standard pair
    for a stride-1 convolution: the input gradient is the output gradient convolved with the spatially
    flipped kernel (input and output channels swapped) under padding (k - 1 - lo, k - 1 - hi); the
    kernel gradient is the input, padded by ``pads``, correlated with the output gradient over batch and
    positions (:data:`KERNEL_GRAD_DIMS`)."""
    pads = [tuple(p) for p in pads]

    @tf.custom_gradient
    def conv(x, w):
        def grad(dy):
            k = w.shape[:3]
            w_flipped = tf.transpose(tf.reverse(w, axis=[0, 1, 2]), (0, 1, 2, 4, 3))
            dx_pads = [(ki - 1 - lo, ki - 1 - hi) for ki, (lo, hi) in zip(k, pads)]
            return _xla_conv(dy, w_flipped, dx_pads, CONV_DIMS), _xla_conv(x, dy, pads, KERNEL_GRAD_DIMS)

        return _xla_conv(x, w, pads, CONV_DIMS), grad

    return conv(x, w)


def conv_phase(xi: tf.Tensor, wi: tf.Tensor, fold_pad: bool) -> tf.Tensor:
    """A 2x2x2 phase convolution of NDHWC ``xi`` padded by one voxel per side: (B, n+1, n+1, n+1, C)
    out. ``fold_pad``: the convolution pads (:func:`conv3d_padded`), else a pad and a VALID conv."""
    if fold_pad:
        return conv3d_padded(xi, wi, [(1, 1)] * 3)
    return tf.nn.conv3d(pad1(xi), wi, (1, 1, 1, 1, 1), "VALID")


def conv_transpose_subpixel(x, w: tf.Tensor, *, fold_pad: bool = False, regroup: str = "gather") -> tf.Tensor:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` (or the channel concatenation of a tuple) by phase
    convolution + depth-to-space. ``fold_pad``: the one-voxel padding is the convolution's own
    (``conv_pad: folded``, :func:`conv_phase`); ``regroup``: ``PHASE_KERNEL`` key."""
    xs = inputs_of(x)
    n, c_out = side(xs[0]), w.shape[-1]

    conv = functools.partial(conv_phase, fold_pad=fold_pad)
    return depth_to_space(split_sum(conv, xs, PHASE_KERNEL[regroup](w)), n, c_out)


def depth_to_space_crop(y: tf.Tensor, n: int | tf.Tensor, c_out: int) -> tf.Tensor:
    """:func:`depth_to_space` for phase channels in reversed order: one interleaving transpose into
    (B, 2n+2, 2n+2, 2n+2, C_out) and a crop of one voxel per side (:func:`jax_impl.model.depth_to_space_crop`
    derives it)."""
    z = tf.transpose(tf.reshape(y, (-1, n + 1, n + 1, n + 1, 2, 2, 2, c_out)), (0, 1, 4, 2, 5, 3, 6, 7))
    z = tf.reshape(z, (-1, 2 * n + 2, 2 * n + 2, 2 * n + 2, c_out))
    return z[:, 1 : 2 * n + 1, 1 : 2 * n + 1, 1 : 2 * n + 1]


def conv_transpose_subpixel_crop(x, w: tf.Tensor, *, fold_pad: bool = False, regroup: str = "gather") -> tf.Tensor:
    """:func:`conv_transpose_subpixel` with the phase channels in reversed order and the depth-to-space
    as one transpose and a crop (:func:`depth_to_space_crop`)."""
    xs = inputs_of(x)
    n, c_in, c_out = side(xs[0]), w.shape[3], w.shape[-1]
    wk = tf.reshape(PHASE_KERNEL[regroup](w), (2, 2, 2, c_in, 2, 2, 2, c_out))
    wk = tf.reshape(tf.reverse(wk, axis=[4, 5, 6]), (2, 2, 2, c_in, 8 * c_out))

    conv = functools.partial(conv_phase, fold_pad=fold_pad)
    return depth_to_space_crop(split_sum(conv, xs, wk), n, c_out)


def conv_transpose_phases(x, w: tf.Tensor, *, fold_pad: bool = False, regroup: str = "gather") -> tf.Tensor:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` as 8 separate phase convolutions (no excess
    FLOPs), interleaved into (B, 2n, 2n, 2n, C_out). Phase ``r`` reads the window ``[r - 1, r + n)``
    of ``x`` per axis: with ``fold_pad`` the convolution pads ``(1 - r, r)`` itself."""
    xs = inputs_of(x)
    n, c_out = side(xs[0]), w.shape[-1]
    wk = tf.reshape(PHASE_KERNEL[regroup](w), (2, 2, 2, w.shape[3], 2, 2, 2, c_out))

    def phase(r0, r1, r2):
        def conv(xi, wi):
            if fold_pad:
                return conv3d_padded(xi, wi, [(1 - r, r) for r in (r0, r1, r2)])
            xp = pad1(xi)[:, r0 : r0 + n + 1, r1 : r1 + n + 1, r2 : r2 + n + 1]
            return tf.nn.conv3d(xp, wi, (1, 1, 1, 1, 1), "VALID")

        return split_sum(conv, xs, wk[..., r0, r1, r2, :])

    phases = [[[phase(r0, r1, r2) for r2 in (0, 1)] for r1 in (0, 1)] for r0 in (0, 1)]
    z = tf.stack([tf.stack([tf.stack(p2, axis=-2) for p2 in p1], axis=-3) for p1 in phases], axis=-4)
    z = tf.transpose(z, (0, 1, 4, 2, 5, 3, 6, 7))
    return tf.reshape(z, (-1, 2 * n, 2 * n, 2 * n, c_out))


def conv_transpose_dilated(x, w: tf.Tensor, **_) -> tf.Tensor:
    """ConvTranspose3d(k=4, s=2, p=1) of NDHWC ``x`` with ``tf.nn.conv3d_transpose`` (its kernel
    layout is (k, k, k, C_out, C_in), hence the transpose): no depth-to-space pass."""
    xs = inputs_of(x)
    n = side(xs[0])
    out_shape = tf.stack([tf.shape(xs[0])[0], 2 * n, 2 * n, 2 * n, w.shape[-1]])

    def conv(xi, wi):
        return tf.nn.conv3d_transpose(xi, tf.transpose(wi, (0, 1, 2, 4, 3)), out_shape, (1, 2, 2, 2, 1), "SAME")

    return split_sum(conv, xs, w)


def conv_strided(x: tf.Tensor, w: tf.Tensor, **_) -> tf.Tensor:
    """Conv3D(k=4, s=2, p=1) of NDHWC ``x`` with DHWIO kernel ``w`` (explicit padding 1)."""
    xp = tf.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    return tf.nn.conv3d(xp, w, (1, 2, 2, 2, 1), "VALID")


def conv_space_to_depth(x: tf.Tensor, w: tf.Tensor, **_) -> tf.Tensor:
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


UPCONV = {
    "subpixel": conv_transpose_subpixel,
    "subpixel_crop": conv_transpose_subpixel_crop,
    "phases": conv_transpose_phases,
    "transpose": conv_transpose_dilated,
}
DOWNCONV = {"space_to_depth": conv_space_to_depth, "strided": conv_strided}


class _Conv(keras.layers.Layer):
    """A (4, 4, 4, C_in, features) kernel + bias applied by ``fn``; variables float32.

    The input is one NDHWC tensor or, for an up-conv under ``skip_concat: split``, a list of tensors
    whose channels, concatenated, are the kernel's C_in. ``kernel_regroup`` and ``conv_pad`` are the
    config keys; ``pad_out`` (> 1) rounds ``features`` up to a multiple of it with zero kernels and drops
    the extra output channels (``pad_out_channels``, :class:`jax_impl.model._Conv`)."""

    fns: ClassVar[dict] = {}

    def __init__(
        self,
        features: int,
        method: str,
        kernel_regroup: str = "gather",
        pad_out: int = 0,
        conv_pad: str = "separate",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.features, self.method, self.kernel_regroup, self.pad_out = features, method, kernel_regroup, pad_out
        self.conv_pad = conv_pad

    def build(self, input_shape):
        nested = isinstance(input_shape, (list, tuple)) and not isinstance(input_shape[0], (int, type(None)))
        c_in = sum(shape[-1] for shape in (input_shape if nested else [input_shape]))
        self.kernel = self.add_weight(
            name="kernel", shape=(KERNEL, KERNEL, KERNEL, c_in, self.features), initializer=KERNEL_INIT
        )
        self.bias = self.add_weight(name="bias", shape=(self.features,), initializer="zeros")

    def call(self, x):
        dt = self.compute_dtype
        xs = tuple(tf.cast(xi, dt) for xi in inputs_of(x))
        w, b = tf.cast(self.kernel, dt), tf.cast(self.bias, dt)
        extra = -self.features % self.pad_out if self.pad_out > 1 else 0
        if extra:
            w, b = tf.pad(w, ((0, 0),) * 4 + ((0, extra),)), tf.pad(b, ((0, extra),))
        fold_pad = self.conv_pad == "folded"
        y = self.fns[self.method](xs if len(xs) > 1 else xs[0], w, fold_pad=fold_pad, regroup=self.kernel_regroup) + b
        return y[..., : self.features] if extra else y

    def get_config(self):
        return {
            **super().get_config(),
            "features": self.features,
            "method": self.method,
            "kernel_regroup": self.kernel_regroup,
            "pad_out": self.pad_out,
            "conv_pad": self.conv_pad,
        }


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class DownConv(_Conv):
    """Conv3D(k=4, s=2, p=1) + bias: (B, n, n, n, C_in) -> (B, n/2, n/2, n/2, features)."""

    fns = DOWNCONV


@keras.saving.register_keras_serializable(package=SERIALIZATION_PACKAGE)
class UpConv(_Conv):
    """ConvTranspose3d(k=4, s=2, p=1) + bias: (B, n, n, n, C_in) -> (B, 2n, 2n, 2n, features)."""

    fns = UPCONV


def build_model(
    cfg: Config, batch_size: int | None = None, free_side: bool = False, stock_layers: bool = False
) -> keras.Model:
    """The U-Net of ``cfg`` as a functional Keras model under ``cfg.precision``'s policy.

    Input (B, s, s, s, N_in) float32; output (B, s, s, s, N_out) float32 in (-1, 1); ``s`` is
    ``crop_size``, or with ``free_side`` any multiple of 2**levels given at call time.

    ``stock_layers``: Keras' own ``Conv3D`` (padding ``same``: one voxel per side at stride 2 and an
    even side) and ``Conv3DTranspose`` (``tf.nn.conv3d_transpose``'s ``SAME``: PyTorch's ``p=1``) in
    place of :class:`DownConv` and :class:`UpConv`, the skips concatenated: the same function (the
    ``strided`` and ``transpose`` forms, none of the step levers), and a ``.keras`` file of it loads in
    any Keras 3 without this kit's code.
    """
    policy = keras.DTypePolicy(POLICIES[cfg.precision])
    s = None if free_side else cfg.crop_size
    inputs = keras.Input((s, s, s, cfg.N_in_channels), batch_size=batch_size, name="inputs")
    conv = functools.partial(stock_conv if stock_layers else kit_conv, cfg, dtype=policy)
    widths = encoder_widths(cfg)
    x, skips = inputs, []
    for i, w in enumerate(widths):
        x = conv("down", w, x, name=f"down{i + 1}")
        x = keras.layers.LeakyReLU(negative_slope=0.01, dtype=policy, name=f"down{i + 1}_act")(x)
        skips.append(x)
    n = len(widths)
    for j, w in enumerate(widths[-2::-1]):
        name = f"up{n - 1 - j}"
        x = conv("up", w, x, name=name)
        x = keras.layers.ReLU(dtype=policy, name=f"{name}_act")(x)
        x = [x, skips[n - 2 - j]]
        if cfg.skip_concat == "concat" or stock_layers:
            x = keras.layers.Concatenate(axis=-1, dtype=policy, name=f"{name}_concat")(x)
    x = conv("up", cfg.N_out_channels, x, name="last", pad_out=cfg.pad_out_channels)
    out = keras.layers.Activation("tanh", dtype="float32", name="tanh")(x)
    return keras.Model(inputs, out, name="unet")


def kit_conv(cfg: Config, kind: str, features: int, x, *, pad_out: int = 0, **kwargs):
    """A :class:`DownConv` or :class:`UpConv` (``kind``) of ``features`` outputs applied to ``x``, in
    the formulation ``cfg`` chooses for ``x``'s side (:func:`shared_data.model.unet_spec.conv_method`)."""
    n = inputs_of(x)[0].shape[1]
    if kind == "down":
        method = conv_method("down", n, cfg.downconv, cfg.downconv_strided_below)
        return DownConv(features, method, cfg.kernel_regroup, **kwargs)(x)
    method = conv_method("up", n, cfg.upconv, cfg.upconv_transpose_below)
    return UpConv(features, method, cfg.kernel_regroup, pad_out, cfg.conv_pad, **kwargs)(x)


def stock_conv(cfg: Config, kind: str, features: int, x, *, pad_out: int = 0, **kwargs):
    """Keras' ``Conv3D`` (``kind`` ``down``) or ``Conv3DTranspose`` (``up``), kernel 4, stride 2, of
    ``features`` outputs applied to ``x`` (``cfg`` and ``pad_out``: unused, :func:`kit_conv`'s)."""
    layer = keras.layers.Conv3D if kind == "down" else keras.layers.Conv3DTranspose
    return layer(features, KERNEL, strides=2, padding="same", kernel_initializer=KERNEL_INIT, **kwargs)(x)


#: The conv layers of a model: the kit's, or Keras' own (``stock_layers``).
CONV_LAYERS = (_Conv, keras.layers.Conv3D, keras.layers.Conv3DTranspose)


def conv_layers(model: keras.Model) -> dict[str, keras.layers.Layer]:
    """The model's conv layers by canonical name (``down1`` ... ``last``)."""
    return {layer.name: layer for layer in model.layers if isinstance(layer, CONV_LAYERS)}


def kernel_layout(layer: keras.layers.Layer, kernel):
    """A canonical (4, 4, 4, C_in, C_out) ``kernel`` in ``layer``'s layout and back: Keras'
    ``Conv3DTranspose`` holds (4, 4, 4, C_out, C_in) (the swap is its own inverse)."""
    return np.swapaxes(kernel, 3, 4) if isinstance(layer, keras.layers.Conv3DTranspose) else kernel


def params_from_canonical(model: keras.Model, weights: dict[str, np.ndarray]) -> keras.Model:
    """Load canonical arrays (``"down1/kernel"`` ...) into the model's variables; return the model."""
    for name, layer in conv_layers(model).items():
        layer.kernel.assign(kernel_layout(layer, weights[f"{name}/kernel"]))
        layer.bias.assign(weights[f"{name}/bias"])
    return model


def params_to_canonical(model: keras.Model) -> dict[str, np.ndarray]:
    """The model's variables as canonical float32 arrays."""
    out = {}
    for name, layer in conv_layers(model).items():
        out[f"{name}/kernel"] = np.asarray(kernel_layout(layer, layer.kernel.numpy()), np.float32)
        out[f"{name}/bias"] = np.asarray(layer.bias.numpy(), np.float32)
    return out
