"""The 48 symmetries of the cube: one table, used by every reader (NumPy, tf.data, DALI).

A symmetry ``g`` is a signed permutation matrix ``M`` (3 x 3, entries 0/+1/-1) acting on positions
about the volume's centre c: ``x' = M (x - c) + c``. Row ``i`` of ``M`` has one non-zero entry,
``M[i, perm[i]] = sign[i]``. On an array in spatial-axis order (x, y, z) = axes (0, 1, 2) this is

    out = a.transpose(perm), then flip every axis i with sign[i] == -1.

A scalar field only moves: ``B(x') = A(x)``. A vector field also turns with the grid:
``B_vec(x') = M A_vec(x)``, i.e. output component ``i`` is ``sign[i]`` times input component
``perm[i]``. (The NERSC tutorial rotates grids but leaves velocity components untouched; here
they transform correctly.) The 24 proper rotations have ``det M = +1``; the other 24 add a
reflection (``det M = -1``) and are the central inversion ``-I`` followed by a rotation.

The device loaders apply the same elements from :func:`gather_tables`: axis order, flips, and each
output channel's source channel and sign. The DALI pipelines (:mod:`shared_data.data.dali_pipelines`)
take the channel part from it and the axis order and flips as one affine map per symmetry
(:func:`shared_data.data.dali_pipelines.warp_tables`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np

from shared_data.core.errors import ConfigError

GROUPS = {"cube48": 48, "rotations24": 24, "none": 1}


@functools.cache
def _table() -> tuple[np.ndarray, np.ndarray]:
    perms, signs = [], []
    for perm in itertools.permutations(range(3)):
        for sign in itertools.product((1, -1), repeat=3):
            perms.append(perm)
            signs.append(sign)
    perms_a, signs_a = np.array(perms, np.int64), np.array(signs, np.int64)
    dets = np.array([round(np.linalg.det(_matrix(p, s))) for p, s in zip(perms_a, signs_a)])
    # identity first, then the other proper rotations, then the improper ones: a group of size 24
    # is then the prefix [:24], and "none" is the prefix [:1].
    is_identity = np.array([tuple(p) == (0, 1, 2) and tuple(s) == (1, 1, 1) for p, s in zip(perms_a, signs_a)])
    order = np.lexsort((~is_identity, -dets))
    perms_a, signs_a = perms_a[order], signs_a[order]
    perms_a.setflags(write=False)
    signs_a.setflags(write=False)
    return perms_a, signs_a


def _matrix(perm: Sequence[int], sign: Sequence[int]) -> np.ndarray:
    m = np.zeros((3, 3), np.int64)
    m[np.arange(3), list(perm)] = sign
    return m


def num_symmetries(group: str) -> int:
    """Number of elements of ``group`` (``"cube48"``: 48, ``"rotations24"``: 24, ``"none"``: 1).

    Raises:
        ConfigError: unknown group name.
    """
    if group not in GROUPS:
        raise ConfigError(f"symmetry_group {group!r}: expected one of {', '.join(GROUPS)}")
    return GROUPS[group]


def perm_and_sign(index: int) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, sign)`` of symmetry ``index`` in 0..47; both int64 arrays of shape (3,)."""
    perms, signs = _table()
    return perms[index], signs[index]


def matrix(index: int) -> np.ndarray:
    """The 3 x 3 signed permutation matrix ``M`` of symmetry ``index`` (int64)."""
    return _matrix(*perm_and_sign(index))


def index_of(m: np.ndarray) -> int:
    """Index in the table of the signed permutation matrix ``m``; ``ValueError`` if not one."""
    for i in range(48):
        if np.array_equal(matrix(i), m):
            return i
    raise ValueError(f"not a cube symmetry: {m.tolist()}")


def apply_spatial(a: np.ndarray, index: int, spatial_axes: Sequence[int] = (0, 1, 2)) -> np.ndarray:
    """Move the voxels of ``a`` by symmetry ``index``; ``spatial_axes`` name the x, y, z axes of ``a``.

    Returns a view where possible (transpose + flips), shape permuted accordingly.
    """
    perm, sign = perm_and_sign(index)
    axes = list(range(a.ndim))
    new_axes = list(axes)
    for i, ax in enumerate(spatial_axes):
        new_axes[ax] = spatial_axes[perm[i]]
    out = a.transpose(new_axes)
    flip_axes = tuple(spatial_axes[i] for i in range(3) if sign[i] < 0)
    return np.flip(out, flip_axes) if flip_axes else out


def channel_matrix(index: int, num_channels: int, vector_triplets: Sequence[Sequence[int]]) -> np.ndarray:
    """Matrix ``C`` (num_channels x num_channels, float32) with ``out_channels = C @ in_channels``.

    Scalar channels map to themselves; each vector triplet ``(cx, cy, cz)`` maps by ``M`` (the
    rows are :func:`channel_sources`).
    """
    src, sgn = channel_sources(index, num_channels, vector_triplets)
    c = np.zeros((num_channels, num_channels), np.float32)
    c[np.arange(num_channels), src] = sgn
    return c


def channel_sources(
    index: int, num_channels: int, vector_triplets: Sequence[Sequence[int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel, the input channel it comes from and its sign (the rows of
    :func:`channel_matrix`): scalars map to themselves, vector component ``i`` of a triplet comes
    from component ``perm[i]`` times ``sign[i]``."""
    src, sgn = np.arange(num_channels), np.ones(num_channels, np.int64)
    perm, sign = perm_and_sign(index)
    for triplet in vector_triplets:
        for i in range(3):
            src[triplet[i]], sgn[triplet[i]] = triplet[perm[i]], sign[i]
    return src, sgn


def apply(
    sample: np.ndarray,
    index: int,
    vector_triplets: Sequence[Sequence[int]],
    channel_axis: int = -1,
    out_channel_axis: int | None = None,
) -> np.ndarray:
    """Apply symmetry ``index`` to one sample: voxels move, vector channels turn with the grid.

    Args:
        sample: float array with three spatial axes (x, y, z order) and one channel axis, e.g.
            DHWC (channel_axis=-1) or CDHW (channel_axis=0).
        index: symmetry index in 0..47.
        vector_triplets: channel indices of each vector field's (x, y, z) components.
        out_channel_axis: channel axis of the result (default: ``channel_axis``), so a channel-first
            crop becomes a channels-last sample in the same single pass.

    Returns:
        A new contiguous array of the same dtype (shape permuted like the voxels).
    """
    ch = channel_axis % sample.ndim
    moved = apply_spatial(np.moveaxis(sample, ch, 0), index, (1, 2, 3))  # a view, channels first
    n = moved.shape[0]
    out_ch = ch if out_channel_axis is None else out_channel_axis % sample.ndim
    shape = list(moved.shape[1:])
    shape.insert(out_ch, n)
    out = np.empty(shape, sample.dtype)
    out_cf = np.moveaxis(out, out_ch, 0)
    src, sgn = channel_sources(index, n, vector_triplets)
    for c in range(n):  # one strided copy per channel
        if sgn[c] > 0:
            out_cf[c] = moved[src[c]]
        else:
            np.negative(moved[src[c]], out=out_cf[c])
    return out


def tables(num_channels: int, vector_triplets: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole table as arrays for in-graph use: ``perms`` int32 (48, 3), ``signs`` int32 (48, 3)
    and the channel matrices float32 (48, C, C) of :func:`channel_matrix`."""
    perms, signs = _table()
    mats = np.stack([channel_matrix(i, num_channels, vector_triplets) for i in range(48)])
    return perms.astype(np.int32), signs.astype(np.int32), mats


def gather_tables(num_channels: int, vector_triplets: Sequence[Sequence[int]]) -> tuple[np.ndarray, ...]:
    """The table for in-graph gathers: ``perms``, ``signs`` int32 (48, 3) as in :func:`tables`, and
    per output channel its source channel ``src`` int32 (48, C) and sign ``chan_sign`` float32
    (48, C) (:func:`channel_sources`): output channel d of symmetry g is
    ``chan_sign[g, d] * input[..., src[g, d]]``."""
    perms, signs = _table()
    src, sgn = zip(*(channel_sources(i, num_channels, vector_triplets) for i in range(48)))
    return (
        perms.astype(np.int32),
        signs.astype(np.int32),
        np.stack(src).astype(np.int32),
        np.stack(sgn).astype(np.float32),
    )


def compose(i: int, j: int) -> int:
    """Index of ``g_i o g_j`` (apply ``j`` first, then ``i``): matrix ``M_i @ M_j``."""
    return index_of(matrix(i) @ matrix(j))
