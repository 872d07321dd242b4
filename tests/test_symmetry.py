"""The 48-element table: a group, equal to np.rot90/np.flip compositions, turning vectors correctly."""

from __future__ import annotations

import numpy as np
import pytest

from shared_data.data import symmetry

RNG = np.random.default_rng(0)


def test_table_is_a_group_with_identity_first_and_rotations_prefix():
    mats = [symmetry.matrix(i) for i in range(48)]
    assert len({m.tobytes() for m in mats}) == 48
    assert np.array_equal(mats[0], np.eye(3, dtype=np.int64))
    dets = [round(np.linalg.det(m)) for m in mats]
    assert dets[:24] == [1] * 24 and dets[24:] == [-1] * 24
    for i in range(48):
        inverses = [j for j in range(48) if symmetry.compose(i, j) == 0]
        assert len(inverses) == 1
        for j in range(48):
            assert 0 <= symmetry.compose(i, j) < 48  # closed (index_of raises otherwise)
    # the 24 rotations are a subgroup
    assert all(symmetry.compose(i, j) < 24 for i in range(24) for j in range(24))


def _rot90_flip_closure(a):
    """All arrays reachable from ``a`` by np.rot90 in the three planes and np.flip of axis 0 (BFS)."""
    gens = [lambda x: np.rot90(x, 1, (0, 1)), lambda x: np.rot90(x, 1, (1, 2)), lambda x: np.flip(x, 0)]
    seen, todo = {a.tobytes(): a}, [a]
    while todo:
        x = todo.pop()
        for g in gens:
            y = np.ascontiguousarray(g(x))
            if y.tobytes() not in seen:
                seen[y.tobytes()] = y
                todo.append(y)
    return seen


def test_scalar_transforms_equal_rot90_flip_compositions():
    a = RNG.standard_normal((5, 5, 5))
    closure = _rot90_flip_closure(a)
    ours = {np.ascontiguousarray(symmetry.apply_spatial(a, i)).tobytes() for i in range(48)}
    assert len(closure) == 48
    assert ours == set(closure)
    rotations_only = {np.ascontiguousarray(symmetry.apply_spatial(a, i)).tobytes() for i in range(24)}
    proper = {
        np.ascontiguousarray(np.rot90(np.rot90(a, k1, (0, 1)), k2, ax)).tobytes()
        for k1 in range(4)
        for k2 in range(4)
        for ax in ((1, 2), (0, 2))
    }
    assert rotations_only <= set(closure) and rotations_only == proper


@pytest.mark.parametrize("index", range(48))
def test_scalar_transform_moves_voxels_by_matrix_about_centre(index):
    n = 4
    a = RNG.standard_normal((n, n, n))
    b = symmetry.apply_spatial(a, index)
    m, c = symmetry.matrix(index), (n - 1) / 2
    for x in np.ndindex(n, n, n):
        xp = m @ (np.array(x) - c) + c
        assert b[tuple(np.rint(xp).astype(int))] == a[x]


def _grad(phi):
    """Periodic central-difference gradient, components stacked last (x, y, z)."""
    return np.stack([(np.roll(phi, -1, ax) - np.roll(phi, 1, ax)) / 2 for ax in range(3)], axis=-1)


@pytest.mark.parametrize("index", range(48))
def test_vector_field_transforms_like_gradient(index):
    phi = RNG.standard_normal((6, 6, 6))
    v = _grad(phi)  # (6, 6, 6, 3): channels 0..2 are a vector
    sample = np.concatenate([phi[..., None], v], axis=-1)  # channel 0 scalar, 1..3 vector
    out = symmetry.apply(sample, index, [[1, 2, 3]], channel_axis=-1)
    phi_t = np.ascontiguousarray(symmetry.apply_spatial(phi, index))
    np.testing.assert_array_equal(out[..., 0], phi_t)
    np.testing.assert_allclose(out[..., 1:], _grad(phi_t), rtol=0, atol=1e-12)


def test_channel_first_and_last_agree_and_channel_matrix():
    s = RNG.standard_normal((5, 4, 4, 4)).astype(np.float32)
    for i in (0, 7, 30, 47):
        cf = symmetry.apply(s, i, [[2, 3, 4]], channel_axis=0)
        cl = symmetry.apply(np.moveaxis(s, 0, -1), i, [[2, 3, 4]], channel_axis=-1)
        np.testing.assert_array_equal(np.moveaxis(cf, 0, -1), cl)
        c = symmetry.channel_matrix(i, 5, [[2, 3, 4]])
        moved = np.ascontiguousarray(symmetry.apply_spatial(np.moveaxis(s, 0, -1), i))
        np.testing.assert_allclose(moved @ c.T, cl, atol=1e-6)
    assert symmetry.num_symmetries("rotations24") == 24 and symmetry.num_symmetries("none") == 1


def test_gather_tables_reproduce_the_channel_matrices():
    """Gathering channel src[g, d] times chan_sign[g, d] equals multiplying by channel_matrix(g)."""
    vectors = [[1, 2, 3], [5, 6, 7]]
    perms, signs, src, chan_sign = symmetry.gather_tables(9, vectors)
    t_perms, t_signs, mats = symmetry.tables(9, vectors)
    np.testing.assert_array_equal(perms, t_perms)
    np.testing.assert_array_equal(signs, t_signs)
    x = np.random.default_rng(0).standard_normal(9)
    for g in range(48):
        np.testing.assert_array_equal(chan_sign[g] * x[src[g]], mats[g] @ x)
    assert set(np.unique(chan_sign)) == {-1.0, 1.0}
