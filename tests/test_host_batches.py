"""Epoch plans and the threaded NumPy loader: order, reproducibility, shards, validation padding."""

import numpy as np
import pytest

from shared_data.core import config as config_mod
from shared_data.data import crop_readers, host_batches
from shared_data.data.sampler import TRAIN, VAL


def test_threaded_loader_yields_the_plan_in_order_reproducibly(tiny_cfg):
    cfg = config_mod.replace(tiny_cfg, num_data_workers=2, Nsamples=24)
    r = crop_readers.make_reader(cfg)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, r.size)
    assert len(plan) == 6
    threaded = list(host_batches.NumpyLoader(r, plan, cfg))
    again = list(host_batches.NumpyLoader(r, host_batches.make_plan(cfg, TRAIN, 0, [0], 1, r.size), cfg))
    for step, (a, b) in enumerate(zip(threaded, again)):
        sequential = host_batches.NumpyLoader(r, plan, cfg).load(step)
        for k in a:
            np.testing.assert_array_equal(a[k], sequential[k])
            np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(plan.draws[0].starts, plan.draws[1].starts)


def test_the_global_batch_is_the_same_on_any_world_size_and_worker_count(tiny_cfg):
    """The process batches of 1, 2 and 4 replicas (one process holding all, or one per shard) and of
    1 or 3 data workers concatenate to the same global batch of crops, element by element."""
    r = crop_readers.make_reader(tiny_cfg)
    one = host_batches.make_plan(tiny_cfg, TRAIN, 1, [0], 1, r.size)
    assert len(one) == 4 and len(one.draws[0]) == 4
    for replicas in (2, 4):
        together = host_batches.make_plan(tiny_cfg, TRAIN, 1, range(replicas), replicas, r.size)
        apart = [host_batches.make_plan(tiny_cfg, TRAIN, 1, [s], replicas, r.size) for s in range(replicas)]
        for t in range(len(one)):
            for plan in (together.draws[t], host_batches._concat([a.draws[t] for a in apart])):
                np.testing.assert_array_equal(plan.starts, one.draws[t].starts)
                np.testing.assert_array_equal(plan.symmetries, one.draws[t].symmetries)
    three = host_batches.make_plan(config_mod.replace(tiny_cfg, num_data_workers=3), TRAIN, 1, [0], 1, r.size)
    for a, b in zip(three.draws, one.draws):
        np.testing.assert_array_equal(a.starts, b.starts)
    batch_1 = host_batches.NumpyLoader(r, one, tiny_cfg).load(2)
    shard_plans = [host_batches.make_plan(tiny_cfg, TRAIN, 1, [s], 2, r.size) for s in (0, 1)]
    halves = [host_batches.NumpyLoader(r, p, tiny_cfg).load(2) for p in shard_plans]
    for k in ("inputs", "targets"):
        np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), batch_1[k])


def test_a_plan_from_a_data_cursor_is_the_rest_of_the_epoch(tiny_cfg):
    r = crop_readers.make_reader(tiny_cfg)
    full = host_batches.make_plan(tiny_cfg, TRAIN, 3, [1], 2, r.size)
    rest = host_batches.make_plan(tiny_cfg, TRAIN, 3, [1], 2, r.size, first_step=3)
    assert len(rest) == 1
    np.testing.assert_array_equal(rest.draws[0].starts, full.draws[3].starts)
    with pytest.raises(ValueError, match="first_step 4"):
        host_batches.make_plan(tiny_cfg, TRAIN, 3, [1], 2, r.size, first_step=4)


def test_validation_pads_and_masks_the_last_batch(tiny_cfg):
    cfg = config_mod.replace(tiny_cfg, Nsamples_val=5)  # global batch 4: 2 steps, 3 padded samples
    r = crop_readers.make_reader(cfg, "val")
    plan = host_batches.make_plan(cfg, VAL, 3, [0, 1], 2, r.size)
    assert [m.tolist() for m in plan.masks] == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert (np.concatenate([d.symmetries for d in plan.draws]) == 0).all()
    halves = [host_batches.make_plan(cfg, VAL, 0, [s], 2, r.size).masks for s in (0, 1)]
    assert [h[1].tolist() for h in halves] == [[1, 0], [0, 0]]
