"""Epoch plans and the threaded NumPy loader: order, reproducibility, shards, validation padding."""

import numpy as np

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
    # batches 0 and 1 come from the two workers' distinct streams
    assert not np.array_equal(plan.draws[0].starts, plan.draws[1].starts)


def test_shards_split_the_global_batch_and_differ(tiny_cfg):
    r = crop_readers.make_reader(tiny_cfg)
    both = host_batches.make_plan(tiny_cfg, TRAIN, 0, [0, 1], 2, r.size)
    s0 = host_batches.make_plan(tiny_cfg, TRAIN, 0, [0], 2, r.size)
    s1 = host_batches.make_plan(tiny_cfg, TRAIN, 0, [1], 2, r.size)
    assert len(both) == len(s0) == 4 and len(both.draws[0]) == 4 and len(s0.draws[0]) == 2
    np.testing.assert_array_equal(both.draws[0].starts, np.concatenate([s0.draws[0].starts, s1.draws[0].starts]))
    assert not np.array_equal(s0.draws[0].starts, s1.draws[0].starts)


def test_validation_pads_and_masks_the_last_batch(tiny_cfg):
    cfg = config_mod.replace(tiny_cfg, Nsamples_val=5)  # global batch 4: 2 steps, 3 padded samples
    r = crop_readers.make_reader(cfg, "val")
    plan = host_batches.make_plan(cfg, VAL, 3, [0, 1], 2, r.size)
    assert [m.tolist() for m in plan.masks] == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert (np.concatenate([d.symmetries for d in plan.draws]) == 0).all()
    halves = [host_batches.make_plan(cfg, VAL, 0, [s], 2, r.size).masks for s in (0, 1)]
    assert [h[1].tolist() for h in halves] == [[1, 0], [0, 0]]
