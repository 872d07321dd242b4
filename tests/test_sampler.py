import numpy as np

from shared_data.data.sampler import VAL, CropStream, StreamKey, epoch_draws


def test_same_key_same_stream_and_bounds():
    a = CropStream(StreamKey(seed=3, epoch=1, shard=0, worker=0), 40, 16, "cube48")
    b = CropStream(StreamKey(seed=3, epoch=1, shard=0, worker=0), 40, 16, "cube48")
    da, db = a.next_batch(500), b.next_batch(500)
    np.testing.assert_array_equal(da.starts, db.starts)
    np.testing.assert_array_equal(da.symmetries, db.symmetries)
    assert da.starts.min() == 0 and da.starts.max() == 40 - 16  # every start lies inside the volume
    assert set(np.unique(da.symmetries)) == set(range(48))
    rot = CropStream(StreamKey(3, 1), 40, 16, "rotations24").next_batch(500)
    assert rot.symmetries.max() == 23


def test_workers_shards_epochs_seeds_differ():
    base = StreamKey(seed=3, epoch=1, shard=0, worker=0)
    first = CropStream(base, 64, 16, "cube48").next_batch(8).starts
    for other in (
        StreamKey(3, 1, 0, 1),
        StreamKey(3, 1, 1, 0),
        StreamKey(3, 2, 0, 0),
        StreamKey(4, 1, 0, 0),
        StreamKey(3, 1, 0, 0, VAL),
    ):
        assert not np.array_equal(CropStream(other, 64, 16, "cube48").next_batch(8).starts, first)


def test_epoch_draws_interleave_workers():
    draws = epoch_draws(
        seed=1, epoch=0, shard=0, num_workers=2, steps=4, batch=3, volume_size=32, crop_size=8, symmetry_group="cube48"
    )
    w0 = CropStream(StreamKey(1, 0, 0, 0), 32, 8, "cube48")
    w1 = CropStream(StreamKey(1, 0, 0, 1), 32, 8, "cube48")
    expect = [w0.next_batch(3), w1.next_batch(3), w0.next_batch(3), w1.next_batch(3)]
    for got, want in zip(draws, expect):
        np.testing.assert_array_equal(got.starts, want.starts)
    val = epoch_draws(1, 5, 0, 1, 2, 3, 32, 8, "cube48", split=VAL)
    assert all((d.symmetries == 0).all() for d in val)
    np.testing.assert_array_equal(val[0].starts, epoch_draws(1, 0, 0, 1, 2, 3, 32, 8, "cube48", split=VAL)[0].starts)
