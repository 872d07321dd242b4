import numpy as np
import pytest

from shared_data.data.sampler import VAL, CropStream, StreamKey, epoch_draws, global_batch_draws


def test_same_key_same_stream_and_bounds():
    a = CropStream(StreamKey(seed=3, epoch=1, step=0), 40, 16, "cube48")
    b = CropStream(StreamKey(seed=3, epoch=1, step=0), 40, 16, "cube48")
    da, db = a.next_batch(500), b.next_batch(500)
    np.testing.assert_array_equal(da.starts, db.starts)
    np.testing.assert_array_equal(da.symmetries, db.symmetries)
    assert da.starts.min() == 0 and da.starts.max() == 40 - 16  # every start lies inside the volume
    assert set(np.unique(da.symmetries)) == set(range(48))
    rot = CropStream(StreamKey(3, 1), 40, 16, "rotations24").next_batch(500)
    assert rot.symmetries.max() == 23


def test_steps_epochs_seeds_splits_differ():
    first = CropStream(StreamKey(seed=3, epoch=1, step=0), 64, 16, "cube48").next_batch(8).starts
    for other in (StreamKey(3, 1, 1), StreamKey(3, 2, 0), StreamKey(4, 1, 0), StreamKey(3, 1, 0, VAL)):
        assert not np.array_equal(CropStream(other, 64, 16, "cube48").next_batch(8).starts, first)


@pytest.mark.parametrize("num_shards", [2, 4])
def test_shards_are_slices_of_the_one_global_batch(num_shards):
    """World size 1 and ``num_shards``: shard r's step t is rows [r B, (r+1) B) of the one-shard
    global batch of step t, element by element (starts and symmetries), for every step."""
    args = dict(seed=7, epoch=2, steps=3, global_batch=8, volume_size=32, crop_size=8, symmetry_group="cube48")
    whole = epoch_draws(shard=0, num_shards=1, **args)
    parts = [epoch_draws(shard=r, num_shards=num_shards, **args) for r in range(num_shards)]
    local = 8 // num_shards
    for t in range(3):
        assert len(whole[t]) == 8
        for r in range(num_shards):
            assert len(parts[r][t]) == local
            np.testing.assert_array_equal(parts[r][t].starts, whole[t].starts[r * local : (r + 1) * local])
            np.testing.assert_array_equal(parts[r][t].symmetries, whole[t].symmetries[r * local : (r + 1) * local])
    # each step draws from its own stream: step t's batch is the generator of key (seed, split, epoch, t)
    rng = np.random.default_rng(np.random.SeedSequence([7, 0, 2, 1]))
    np.testing.assert_array_equal(whole[1].starts, rng.integers(0, 32 - 8 + 1, size=(8, 3)))
    np.testing.assert_array_equal(whole[1].symmetries, rng.integers(0, 48, size=8))


def test_first_step_is_the_tail_of_the_epoch():
    args = dict(seed=1, epoch=0, shard=1, num_shards=2, steps=5, global_batch=4, volume_size=32, crop_size=8)
    full = epoch_draws(symmetry_group="cube48", **args)
    tail = epoch_draws(symmetry_group="cube48", first_step=3, **args)
    assert len(tail) == 2
    for got, want in zip(tail, full[3:]):
        np.testing.assert_array_equal(got.starts, want.starts)
        np.testing.assert_array_equal(got.symmetries, want.symmetries)


def test_validation_is_the_same_every_epoch_without_symmetry():
    val = global_batch_draws(1, 5, 0, 6, 32, 8, "cube48", split=VAL)
    assert (val.symmetries == 0).all()
    np.testing.assert_array_equal(val.starts, global_batch_draws(1, 0, 0, 6, 32, 8, "cube48", split=VAL).starts)


def test_a_batch_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="global batch 6 must divide"):
        epoch_draws(1, 0, 0, 4, 2, 6, 32, 8, "cube48")
