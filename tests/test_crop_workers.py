"""The ``lowmem`` loader's worker processes: the synchronous batches bit for bit whatever the worker
count, workers started once for every epoch, nothing left after a close (early or by collection),
and a worker's failure ends the iteration with one error naming the file, without a hang."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import time

import numpy as np
import pytest
from conftest import assert_one_error_line, run_in_process

from shared_data.core import config as config_mod
from shared_data.core.errors import DatasetError
from shared_data.data import crop_readers, crop_workers, host_batches
from shared_data.data.sampler import TRAIN, VAL


def _gone(pid: int, within: float = 5.0) -> bool:
    """Process ``pid`` has ended and been reaped within ``within`` seconds."""
    t_end = time.monotonic() + within
    while time.monotonic() < t_end:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.02)
    return False


def _setup(tiny_cfg, tmp_path, workers: int, **overrides):
    path = tmp_path / "train.h5"
    shutil.copy(tiny_cfg.train_path, path)
    cfg = config_mod.replace(tiny_cfg, train_path=str(path), num_data_workers=workers, **overrides)
    reader = crop_readers.make_reader(cfg)
    return cfg, reader, host_batches.crop_workers(reader, cfg)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_worker_batches_equal_the_synchronous_ones_bit_for_bit(tiny_cfg, tmp_path, num_workers):
    cfg, reader, workers = _setup(tiny_cfg, tmp_path, num_workers, Nsamples=24, Nsamples_val=6)
    assert isinstance(workers, crop_workers.CropWorkers) and workers.pids == []  # started lazily
    try:
        pids = None
        for split, epoch in [(TRAIN, 0), (TRAIN, 1), (VAL, 0)]:
            plan = host_batches.make_plan(cfg, split, epoch, [0], 1, reader.size)
            got = list(host_batches.NumpyLoader(reader, plan, cfg, workers=workers))
            assert len(got) == len(plan) == (6 if split == TRAIN else 2)
            for step, batch in enumerate(got):
                want = host_batches.NumpyLoader(reader, plan, cfg).load(step)  # in this process, no workers
                assert batch.keys() == want.keys()
                for k in want:
                    assert batch[k].dtype == np.float32 and batch[k].flags.owndata
                    np.testing.assert_array_equal(batch[k], want[k], err_msg=f"{split} {epoch} {step} {k}")
            assert len(workers.pids) == num_workers and pids in (None, workers.pids)  # the same processes
            pids = workers.pids
        assert got[-1]["mask"].tolist() == [1, 1, 0, 0]
        assert len(workers.slot_names) <= num_workers  # slots reused, one per batch under way
    finally:
        workers.close()


def test_early_close_leaves_no_process_and_no_shared_memory(tiny_cfg, tmp_path):
    cfg, reader, workers = _setup(tiny_cfg, tmp_path, 2, Nsamples=40)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    it = iter(host_batches.NumpyLoader(reader, plan, cfg, workers=workers))
    first = next(it)
    np.testing.assert_array_equal(first["inputs"], host_batches.NumpyLoader(reader, plan, cfg).load(0)["inputs"])
    it.close()  # 9 steps not read
    pids, names = workers.pids, workers.slot_names
    assert len(pids) == 2 and names and all(os.path.exists(f"/dev/shm/{n}") for n in names)
    workers.close()
    workers.close()  # idempotent
    assert all(_gone(p) for p in pids)
    assert not any(os.path.exists(f"/dev/shm/{n}") for n in names)
    np.testing.assert_array_equal(first["targets"], host_batches.NumpyLoader(reader, plan, cfg).load(0)["targets"])
    with pytest.raises(RuntimeError, match="are closed"):
        workers.batch(plan.draws[0])


def test_a_dropped_loader_frees_its_workers(tiny_cfg, tmp_path):
    cfg, reader, workers = _setup(tiny_cfg, tmp_path, 1)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    next(iter(host_batches.NumpyLoader(reader, plan, cfg, workers=workers)))
    pids, names = workers.pids, workers.slot_names
    del workers
    gc.collect()
    assert all(_gone(p) for p in pids) and not any(os.path.exists(f"/dev/shm/{n}") for n in names)


def test_a_file_removed_after_the_loader_started_is_one_error_line(tiny_cfg, tmp_path):
    cfg, reader, workers = _setup(tiny_cfg, tmp_path, 2)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    os.remove(cfg.train_path)  # after the reader checked it, before the workers open it
    try:
        res = run_in_process(lambda argv: len(list(host_batches.NumpyLoader(reader, plan, cfg, workers=workers))), [])
        assert_one_error_line(res, f"error: dataset file {cfg.train_path} not found")
    finally:
        workers.close()


def test_a_file_truncated_after_the_loader_started_names_the_file(tiny_cfg, tmp_path):
    cfg, reader, workers = _setup(tiny_cfg, tmp_path, 2)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    os.truncate(cfg.train_path, 4096)  # after the reader checked it, before the workers open it
    try:
        t0 = time.monotonic()
        with pytest.raises(DatasetError, match=f"^dataset file {cfg.train_path} is not a readable HDF5 file"):
            list(host_batches.NumpyLoader(reader, plan, cfg, workers=workers))
        assert time.monotonic() - t0 < 10
    finally:
        workers.close()


def test_a_killed_worker_ends_the_iteration_with_an_error_naming_the_file(tiny_cfg, tmp_path):
    cfg, reader, workers = _setup(tiny_cfg, tmp_path, 2)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    try:
        list(host_batches.NumpyLoader(reader, plan, cfg, workers=workers))
        os.kill(workers.pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=f"a lowmem worker reading {cfg.train_path} ended unexpectedly"):
            list(host_batches.NumpyLoader(reader, plan, cfg, workers=workers))
        assert time.monotonic() - t0 < 10
    finally:
        pids = workers.pids
        workers.close()
    assert all(_gone(p) for p in pids)


def test_inmem_and_synthetic_readers_keep_threads(tiny_cfg):
    for kind in ("inmem", "synthetic"):
        cfg = config_mod.replace(tiny_cfg, data_loader_config=kind)
        assert host_batches.crop_workers(crop_readers.make_reader(cfg), cfg) is None
