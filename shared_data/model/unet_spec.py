"""Framework-neutral facts about the U-Net: layer names and shapes, the canonical weights file, the
analytic FLOP count, and the float64 NumPy reference of the transposed convolution.

Architecture (the kit's model contract, the NERSC tutorial's ``networks/UNet.py``), channels-last NDHWC:
``down1..downN``: Conv3D(k=4, s=2, p=1) + LeakyReLU(0.01), widths ``unet_widths`` (64^3 -> 1^3 for 6
levels); ``up{N-1}..up1``: ConvTranspose3d(k=4, s=2, p=1) + ReLU, widths mirroring the encoder, each
concatenated with the encoder skip of the same size; ``last``: ConvTranspose3d to N_out channels, tanh.
``full_scale: false`` drops the last encoder level.

Canonical weights file (``.npz``): for every layer name ``L`` two arrays, ``L/kernel`` float32 of
shape (4, 4, 4, C_in, C_out) and ``L/bias`` float32 (C_out,). For ``down*`` the kernel is a
cross-correlation kernel in (kd, kh, kw, in, out) order (TF/Flax ``DHWIO``). For ``up*`` and
``last`` it is the transposed-convolution kernel in the same order, with the meaning of
:func:`conv_transpose_reference`: ``out[2 i - 1 + k] += in[i] * W[k]`` per spatial axis
(PyTorch's ``ConvTranspose3d`` weight (in, out, kd, kh, kw) transposed to (kd, kh, kw, in, out)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from shared_data.core.config import Config

KERNEL = 4

# Sub-pixel form of ConvTranspose(k=4, s=2, p=1), per axis: output 2m + r sees the inputs at window
# positions a = 0, 1 of [m - 1, m] (r = 0) or [m, m + 1] (r = 1) through kernel tap PHASE_TAPS[r, a]
# (jax_impl/model.py derives it).
PHASE_TAPS = np.array([[3, 1], [2, 0]])


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One conv layer: ``name``, channels in/out, input side (voxels) and kind (``down`` or ``up``)."""

    name: str
    c_in: int
    c_out: int
    in_size: int
    kind: str

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        return (KERNEL, KERNEL, KERNEL, self.c_in, self.c_out)

    @property
    def out_size(self) -> int:
        return self.in_size // 2 if self.kind == "down" else self.in_size * 2


def encoder_widths(cfg: Config) -> tuple[int, ...]:
    """Widths of the encoder levels actually built (``full_scale`` False drops the last)."""
    return tuple(cfg.unet_widths) if cfg.full_scale else tuple(cfg.unet_widths[:-1])


def layer_specs(cfg: Config, crop_size: int | None = None) -> list[LayerSpec]:
    """All conv layers in forward order, with their channel counts and input sizes."""
    size = crop_size or cfg.crop_size
    enc = encoder_widths(cfg)
    specs, c_in, s = [], cfg.N_in_channels, size
    for i, w in enumerate(enc):
        specs.append(LayerSpec(f"down{i + 1}", c_in, w, s, "down"))
        c_in, s = w, s // 2
    dec = enc[-2::-1]  # decoder widths mirror the encoder: 512, 512, 256, 128, 64 for the full net
    n = len(enc)
    for j, w in enumerate(dec):
        c = c_in if j == 0 else 2 * c_in  # after the first up-conv every input is [up, skip]
        specs.append(LayerSpec(f"up{n - 1 - j}", c, w, s, "up"))
        c_in, s = w, s * 2
    specs.append(LayerSpec("last", c_in * (2 if n > 1 else 1), cfg.N_out_channels, s, "up"))
    return specs


def num_params(cfg: Config) -> int:
    """Trainable parameter count (kernels and biases)."""
    return sum(int(np.prod(s.kernel_shape)) + s.c_out for s in layer_specs(cfg))


def _down_window(lo: int, hi: int) -> tuple[int, int]:
    """Input indices (per axis, inclusive) that outputs ``lo..hi`` of Conv3D(k=4, s=2, p=1) read:
    ``out[o] = sum_k x[2 o - 1 + k]``, k = 0..3."""
    return 2 * lo - 1, 2 * hi + 2


def _up_window(lo: int, hi: int) -> tuple[int, int]:
    """Input indices that outputs ``lo..hi`` of ConvTranspose3d(k=4, s=2, p=1) read: output
    ``2m + r`` sees inputs ``m - 1, m`` (r = 0) or ``m, m + 1`` (r = 1), i.e. ``(j - 1) // 2 .. (j + 1) // 2``."""
    return (lo - 1) // 2, (hi + 1) // 2


def input_window(cfg: Config, o: int) -> tuple[int, int]:
    """The input voxels (per axis, inclusive ``(lo, hi)``) that output voxel ``o`` of the U-Net of
    ``cfg`` depends on, in a volume large enough that no face is reached.

    Follows every path of the network: ``last`` reads the decoder level 1, each decoder level
    ``k`` is ``[up(level k + 1), skip k]``, a skip of level ``k`` reads the input through ``k``
    down-convolutions. The per-axis window is the same for the three axes (the kernels are cubes)
    and periodic in ``o`` with period ``2**levels``.
    """
    levels = len(encoder_widths(cfg))

    def through_encoder(level: int, lo: int, hi: int) -> tuple[int, int]:
        for _ in range(level):
            lo, hi = _down_window(lo, hi)
        return lo, hi

    def decoder(level: int, lo: int, hi: int) -> tuple[int, int]:
        if level == levels:  # the bottleneck: the deepest encoder output, no skip
            return through_encoder(level, lo, hi)
        skip = through_encoder(level, lo, hi)
        deeper = decoder(level + 1, *_up_window(lo, hi))
        return min(skip[0], deeper[0]), max(skip[1], deeper[1])

    return decoder(1, *_up_window(o, o))


def receptive_margin(cfg: Config) -> int:
    """The receptive-field radius of the U-Net of ``cfg`` in input voxels: the largest distance, on
    either side and over all output positions, between an output voxel and an input voxel it
    depends on (:func:`input_window`). It equals ``3 (2**levels - 1)``: 21 for ``cpu_tiny``'s 3
    levels, 189 for the 6-level net (a 379-voxel window, wider than the 64^3 training crop).

    Two computations of an output voxel agree when the input around it agrees within this margin
    and the inputs are aligned alike to ``2**levels`` (:mod:`shared_data.inference.tiling` tiles by it).
    """
    period = 2 ** len(encoder_widths(cfg))
    margin = 0
    for o in range(period, 2 * period):
        lo, hi = input_window(cfg, o)
        margin = max(margin, o - lo, hi - o)
    return margin


def conv_method(kind: str, n: int | None, method: str, plain_below: int) -> str:
    """The formulation of a ``kind`` (``"down"`` / ``"up"``) layer whose input has ``n`` voxels per
    side: the plain form (``"strided"`` / ``"transpose"``) when ``n < plain_below``, else ``method``
    (config keys ``downconv``, ``downconv_strided_below``, ``upconv``, ``upconv_transpose_below``). The
    per-layer times on the H200 (``dlas_compare.layer_bench``, experiments/perf_notes.md) favour the plain forms
    at the small levels. A side not known when the model is built (``None``, an export for any side)
    takes ``method``."""
    if n is not None and n < plain_below:
        return "strided" if kind == "down" else "transpose"
    return method


def split_sum(conv, xs: tuple, wk):
    """``conv(concatenate(xs, -1), wk)`` for a ``conv`` linear in its input, as the sum of
    ``conv(x_i, wk_i)`` over the slices ``wk_i`` of ``wk``'s input-channel axis 3: no concatenated
    input is built (``skip_concat: split``). ``xs`` NDHWC arrays or tensors of either framework (only
    slicing and ``+`` are used); ``wk`` (k, k, k, sum of the inputs' channels, C_out)."""
    out, start = None, 0
    for x in xs:
        c = x.shape[-1]
        y = conv(x, wk[:, :, :, start : start + c])
        out, start = (y if out is None else out + y), start + c
    return out


def forward_flops(cfg: Config, crop_size: int | None = None, count_padding: bool = True) -> float:
    """Multiply-add FLOPs (2 per MAC) of one sample's forward pass through the conv layers.

    Dense count (``count_padding=True``, the usual convention of FLOP counters and of MFU, and what
    an implicit-GEMM convolution executes): a strided conv computes ``out_voxels x k^3 x C_in x C_out``
    MACs, a transposed conv ``in_voxels x k^3 x C_in x C_out`` (each input voxel scatters one k^3
    kernel). With ``count_padding=False`` only taps that meet real voxels count: per axis, of the
    4 m taps of m positions (outputs of a strided conv, inputs of a transposed conv) 2 fall on the
    padding, a factor ((4 m - 2) / (4 m))^3; this is what XLA's HLO cost analysis reports. Bias,
    activation and concatenation are neglected (< 0.1%).
    """
    total = 0.0
    for s in layer_specs(cfg, crop_size):
        m = s.out_size if s.kind == "down" else s.in_size
        valid = 1.0 if count_padding else ((4 * m - 2) / (4 * m)) ** 3
        total += 2.0 * m**3 * KERNEL**3 * s.c_in * s.c_out * valid
    return total


def train_flops_per_sample(cfg: Config, crop_size: int | None = None) -> float:
    """Model FLOPs of one training step per sample: forward + backward = 3 x forward (the
    backward pass computes gradients for inputs and weights, 2 x forward; Kaplan et al. 2020 /
    the usual MFU convention), with the first layer's input gradient counted too."""
    return 3.0 * forward_flops(cfg, crop_size)


def conv_transpose_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Float64 reference of ConvTranspose3d(kernel 4, stride 2, padding 1) on NDHWC input.

    Definition (PyTorch ``ConvTranspose3d``): for every input voxel i and kernel tap k per axis,
    ``out[2 i - 1 + k] += x[i] @ w[k]`` wherever ``0 <= 2 i - 1 + k < 2 n``. ``x`` (B, n, n, n, C_in),
    ``w`` (4, 4, 4, C_in, C_out), ``b`` (C_out,); returns (B, 2n, 2n, 2n, C_out) float64.
    """
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    bsz, n = x.shape[0], x.shape[1]
    out = np.zeros((bsz, 2 * n, 2 * n, 2 * n, w.shape[-1]))
    i = np.arange(n)
    for k0 in range(KERNEL):
        for k1 in range(KERNEL):
            for k2 in range(KERNEL):
                o = [2 * i - 1 + k for k in (k0, k1, k2)]
                ok = [(oo >= 0) & (oo < 2 * n) for oo in o]
                contrib = np.einsum("bxyzc,cd->bxyzd", x[:, ok[0]][:, :, ok[1]][:, :, :, ok[2]], w[k0, k1, k2])
                out[np.ix_(np.arange(bsz), o[0][ok[0]], o[1][ok[1]], o[2][ok[2]])] += contrib
    if b is not None:
        out += np.asarray(b, np.float64)
    return out


def conv_transpose_reference_grads(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float64 gradients of ``sum(g * conv_transpose_reference(x, w))`` with respect to ``x`` and ``w``.

    From the definition ``out[2 i - 1 + k] += x[i] @ w[k]`` (per axis, where the output index is in
    range): ``dx[i] = sum_k g[2 i - 1 + k] @ w[k].T`` and ``dw[k] = sum_i x[i].T @ g[2 i - 1 + k]``
    (summed over the batch). ``x`` (B, n, n, n, C_in), ``w`` (4, 4, 4, C_in, C_out), ``g`` (B, 2n, 2n,
    2n, C_out); returns ``(dx, dw)`` of the shapes of ``x`` and ``w``, float64.
    """
    x, w, g = (np.asarray(a, np.float64) for a in (x, w, g))
    n = x.shape[1]
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    i = np.arange(n)
    for k0 in range(KERNEL):
        for k1 in range(KERNEL):
            for k2 in range(KERNEL):
                o = [2 * i - 1 + k for k in (k0, k1, k2)]
                ok = [(oo >= 0) & (oo < 2 * n) for oo in o]
                gk = g[:, o[0][ok[0]]][:, :, o[1][ok[1]]][:, :, :, o[2][ok[2]]]
                xk = x[:, ok[0]][:, :, ok[1]][:, :, :, ok[2]]
                dw[k0, k1, k2] += np.einsum("bxyzc,bxyzd->cd", xk, gk)
                sel = np.ix_(np.arange(x.shape[0]), i[ok[0]], i[ok[1]], i[ok[2]])
                dx[sel] += np.einsum("bxyzd,cd->bxyzc", gk, w[k0, k1, k2])
    return dx, dw


def conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Float64 reference of Conv3D(kernel 4, stride 2, padding 1), NDHWC, cross-correlation:
    ``out[o] = sum_k x[2 o - 1 + k] @ w[k]`` (zero outside the volume)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    bsz, n = x.shape[0], x.shape[1]
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (1, 1), (0, 0)))
    m = n // 2
    out = np.zeros((bsz, m, m, m, w.shape[-1]))
    for k0 in range(KERNEL):
        for k1 in range(KERNEL):
            for k2 in range(KERNEL):
                patch = xp[:, k0 : k0 + 2 * m : 2, k1 : k1 + 2 * m : 2, k2 : k2 + 2 * m : 2]
                out += np.einsum("bxyzc,cd->bxyzd", patch, w[k0, k1, k2])
    if b is not None:
        out += np.asarray(b, np.float64)
    return out


def init_weights(cfg: Config, seed: int) -> dict[str, np.ndarray]:
    """Canonical weights drawn as the contract says: kernels N(0, 0.02), biases 0 (float32)."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in layer_specs(cfg):
        out[f"{s.name}/kernel"] = (0.02 * rng.standard_normal(s.kernel_shape)).astype(np.float32)
        out[f"{s.name}/bias"] = np.zeros(s.c_out, np.float32)
    return out


def check_finite_weights(weights: Mapping[str, np.ndarray], source: str) -> None:
    """Check that every array of ``weights`` is finite: a NaN or inf weight makes every output
    NaN, so such weights are neither loaded nor written.

    Raises:
        UserError: ``<source>: array '<name>' holds <nan|inf> at index (...)`` for the first such
            array (in the file's order).
    """
    from shared_data.core.errors import UserError

    for name, array in weights.items():
        array = np.asarray(array)
        if array.size and not np.isfinite(array).all():
            index = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
            raise UserError(
                f"{source}: array {name!r} holds {array[index]} at index {index} "
                f"(and {int((~np.isfinite(array)).sum())} non-finite value(s) in all); expected finite weights"
            )


def save_weights(path: str | Path, weights: Mapping[str, np.ndarray]) -> None:
    """Write canonical weights to ``path`` (``.npz``) atomically.

    Raises:
        UserError: an array holds NaN or inf (:func:`check_finite_weights`); nothing is written.
    """
    check_finite_weights(weights, f"cannot write weights file {path}")
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{k: np.asarray(v, np.float32) for k, v in weights.items()})
    tmp.replace(path)


def load_weights(path: str | Path, cfg: Config) -> dict[str, np.ndarray]:
    """Read and check a canonical weights file against ``cfg``'s layers.

    Raises:
        UserError: missing file, a damaged or truncated file, missing or extra array, a shape
            that does not match ``cfg``, or an array holding NaN or inf (:func:`check_finite_weights`).
    """
    import zipfile
    import zlib

    from shared_data.core.errors import UserError

    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file {path} not found")
    try:
        with np.load(path) as f:
            weights = {k: f[k] for k in f.files}
    except (ValueError, OSError, AttributeError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise UserError(
            f"weights file {path} is damaged (truncated?) or not a canonical .npz weights file "
            f"({str(err).splitlines()[0]})"
        ) from None
    expected = {}
    for s in layer_specs(cfg):
        expected[f"{s.name}/kernel"], expected[f"{s.name}/bias"] = s.kernel_shape, (s.c_out,)
    for key, shape in expected.items():
        if key not in weights:
            raise UserError(f"weights file {path}: missing array {key!r} of shape {shape}")
        if weights[key].shape != shape:
            raise UserError(
                f"weights file {path}: {key!r} has shape {weights[key].shape}, expected {shape} for config {cfg.name!r}"
            )
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise UserError(f"weights file {path}: unexpected array {extra[0]!r} for config {cfg.name!r}")
    check_finite_weights(weights, f"weights file {path}")
    return weights


def starting_weights(cfg: Config, path: str | Path | None = None) -> dict[str, np.ndarray]:
    """The canonical weights a run starts from: the file ``path`` (``--init_weights``, checked by
    :func:`load_weights`) or the contract's init from ``cfg.seed`` (:func:`init_weights`)."""
    return load_weights(path, cfg) if path else init_weights(cfg, cfg.seed)
