"""Tiling: how ``predict`` cuts a volume into overlapping windows and stitches the network's outputs.

Side: the network halves the volume ``levels`` times, so a side must be a multiple of
``align = 2**levels`` (:func:`alignment`). Another side is zero-padded at the high end of each axis
up to the next multiple (:func:`padded_side`; zero is the stored value of mean density and rest: the
transforms of :mod:`shared_data.data.generate`) and the prediction is cropped back. Voxels within
the receptive margin of the padded faces then see the padding instead of the (absent) volume beyond.

Tiling: a U-Net output voxel depends on the input within ``receptive_margin(cfg)`` = 3 (2**levels - 1)
voxels per side (:func:`shared_data.model.unet_spec.receptive_margin`), and the network's arithmetic is
periodic with period ``align``. A window whose origin is a multiple of ``align`` therefore computes
the whole-volume result exactly (to float round-off) at every voxel whose distance to the window's
inner faces is at least the margin; at a face shared with the volume the window's zero padding is the
volume's. :func:`axis_plan` places equal windows so that each voxel is taken from one such position:
the tiled prediction equals the whole-volume prediction everywhere, not just away from the faces.
An ``overlap`` of the margin is seamless; a smaller one leaves seams (tiles of the training crop
size with overlap 0 reproduce crop-wise prediction, seams included). :func:`choose_window` picks the
window side for a memory budget, :func:`predict_volume` runs the plan and stitches.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import numpy as np

from shared_data.core.config import Config
from shared_data.core.errors import ConfigError
from shared_data.model import unet_spec
from shared_data.runtime.logs import progress as progress_bar

#: The activation budget in GiB that :func:`choose_window` fits a window into unless told otherwise.
DEFAULT_MEMORY_GB = 16.0

#: An ``apply`` function: NDHWC float32 windows (B, w, w, w, N_in) -> (B, w, w, w, N_out) float32.
Apply = Callable[[np.ndarray], np.ndarray]


def alignment(cfg: Config) -> int:
    """``2**levels``: every side the network takes, and every window origin, is a multiple of it."""
    return 2 ** len(unet_spec.encoder_widths(cfg))


def padded_side(size: int, align: int) -> int:
    """``size`` rounded up to a multiple of ``align``."""
    return -(-size // align) * align


def min_window(overlap: int, align: int) -> int:
    """The smallest window side (a multiple of ``align``) with which :func:`axis_plan` always makes
    progress: ``window >= 2 overlap + align`` (a window origin rounds down by up to ``align - 1``)."""
    return padded_side(2 * overlap + align, align)


def axis_plan(size: int, window: int, overlap: int, align: int) -> list[tuple[int, int, int]]:
    """The windows along one axis of a (padded) side ``size``: ``(start, lo, hi)`` per window, the
    window covering ``[start, start + window)`` and giving the output voxels ``[lo, hi)``.

    The ``[lo, hi)`` partition ``[0, size)``. Each ``start`` is a multiple of ``align`` and lies at
    least ``overlap`` below ``lo`` unless it is 0; each window ends at least ``overlap`` above ``hi``
    unless it ends at ``size``. ``window >= size`` gives one window, the whole side.

    Raises:
        ValueError: ``size`` or ``window`` is not a multiple of ``align``, or ``window`` is below
            :func:`min_window` and less than ``size``.
    """
    if size % align or window % align:
        raise ValueError(f"size {size} and window {window} must be multiples of {align}")
    if window >= size:
        return [(0, 0, size)]
    if window < min_window(overlap, align):
        raise ValueError(f"window {window} is below the smallest {min_window(overlap, align)} for overlap {overlap}")
    plan, lo = [], 0
    while lo < size:
        start = min(max((lo - overlap) // align * align, 0), size - window)
        hi = size if start + window == size else start + window - overlap
        plan.append((start, lo, hi))
        lo = hi
    return plan


@dataclasses.dataclass(frozen=True)
class Tile:
    """One window of a 3-D plan: origin ``start`` (voxels, x y z), output box ``[lo, hi)`` per axis."""

    start: tuple[int, int, int]
    lo: tuple[int, int, int]
    hi: tuple[int, int, int]


def tile_plan(size: int, window: int, overlap: int, align: int) -> list[Tile]:
    """The 3-D plan of a cubic (padded) side: the product of :func:`axis_plan` over x, y, z."""
    axis = axis_plan(size, window, overlap, align)
    return [Tile(*zip(*parts)) for parts in itertools.product(axis, axis, axis)]


def activation_bytes(cfg: Config, side: int, batch: int = 1, precision: str = "float32") -> int:
    """Estimated device memory of a forward pass of ``batch`` windows of ``side``^3: the input
    (float32) plus, in the compute type, twice every conv layer's output (its intermediates, the
    decoder's concatenations), as if all were alive at once. An upper-side estimate for choosing
    a tile size, not a measurement."""
    item = 2 if precision == "bfloat16" else 4
    acts = sum(2 * s.out_size**3 * s.c_out for s in unet_spec.layer_specs(cfg, side))
    return batch * (4 * side**3 * cfg.N_in_channels + item * acts)


def choose_window(cfg: Config, side: int, tile: int | None, overlap: int, precision: str, memory_gb: float) -> int:
    """The window side for a padded volume side ``side``: ``tile`` when given (0 or >= ``side``: the
    whole volume), else the whole volume if :func:`activation_bytes` fits in ``memory_gb``, else the
    largest window that fits.

    Raises:
        ConfigError: ``tile`` is not a multiple of the alignment or is too small for ``overlap``;
            no window fits in ``memory_gb``.
    """
    align = alignment(cfg)
    smallest = min_window(overlap, align)
    if tile is not None:
        if tile == 0 or tile >= side:
            return side
        if tile % align or tile < smallest:
            raise ConfigError(
                f"--tile {tile}: a tile side must be a multiple of 2**levels = {align} and at least "
                f"{smallest} (2 x overlap {overlap} + {align}, rounded up), or 0 for the whole volume"
            )
        return tile
    budget = memory_gb * 2**30
    if activation_bytes(cfg, side, 1, precision) <= budget:
        return side
    for window in range(side - align, smallest - 1, -align):
        if activation_bytes(cfg, window, 1, precision) <= budget:
            return window
    need = activation_bytes(cfg, min(smallest, side), 1, precision) / 2**30
    raise ConfigError(
        f"--memory_gb {memory_gb:g}: even the smallest seamless tile ({smallest}^3, overlap {overlap}) needs "
        f"~{need:.1f} GiB; raise --memory_gb or give --tile and a smaller --overlap (seams)"
    )


def predict_volume(
    x: np.ndarray,
    apply: Apply,
    n_out: int,
    window: int,
    overlap: int,
    align: int,
    batch_size: int = 1,
    progress: bool = False,
) -> tuple[np.ndarray, int]:
    """Predict a (padded) volume ``x`` (L, L, L, N_in) float32 with ``apply``, window by window of
    :func:`tile_plan`, batches of ``batch_size`` windows (the last one padded with zeros, so every
    call has one shape); return the stitched (L, L, L, n_out) float32 and the number of windows.
    ``progress``: a progress bar over the batches of windows on a terminal (none in a log)."""
    size = x.shape[0]
    plan = tile_plan(size, min(window, size), overlap, align)
    w = min(window, size)
    out = np.empty((size, size, size, n_out), np.float32)
    starts = range(0, len(plan), batch_size)
    for i in progress_bar(starts, len(starts), f"{len(plan)} windows, batches of {batch_size}", progress):
        tiles = plan[i : i + batch_size]
        batch = np.zeros((batch_size, w, w, w, x.shape[-1]), np.float32)
        for b, t in enumerate(tiles):
            batch[b] = x[tuple(slice(s, s + w) for s in t.start)]
        y = np.asarray(apply(batch), np.float32)
        for b, t in enumerate(tiles):
            src = tuple(slice(lo - s, hi - s) for s, lo, hi in zip(t.start, t.lo, t.hi))
            out[tuple(slice(lo, hi) for lo, hi in zip(t.lo, t.hi))] = y[b][src]
    return out, len(plan)
