"""The ``lowmem`` loader's worker processes: the synchronous batches bit for bit whatever the worker
count, workers started once for every epoch, nothing left after a close (early or by collection),
and a worker's failure ends the iteration with one error naming the file, without a hang."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import assert_one_error_line, process_ended, run_in_process

from shared_data.core import config as config_mod
from shared_data.core.config import REPO_ROOT
from shared_data.core.errors import DatasetError, UserError
from shared_data.data import crop_readers, crop_workers, host_batches
from shared_data.data.sampler import TRAIN, VAL
from shared_data.runtime import launch


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
        assert len(workers.slot_names) <= num_workers + 1  # reused: one per batch in flight (the prefetch)
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


class _HangingReader(crop_readers.H5LowMemReader):
    """A reader whose reads hang (a stalled file system), for the bounded wait."""

    def read(self, start, out_in, out_tar):
        time.sleep(60)


@pytest.mark.slow  # seconds of real waiting: the fast tier stays under a minute
def test_a_hanging_worker_ends_in_an_error_within_the_bound_and_is_stopped(tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(crop_workers, "BATCH_TIMEOUT_S", 1.0)
    monkeypatch.setattr(crop_workers, "JOIN_S", 0.5)
    cfg, reader, _ = _setup(tiny_cfg, tmp_path, 1)
    workers = crop_workers.CropWorkers(_HangingReader(cfg.train_path, 4, 5, 16), cfg, 1)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    seen: list[int] = []
    timer = threading.Timer(0.3, lambda: seen.extend(workers.pids))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=f"reading {cfg.train_path} took more than 1 s for one batch"):
        workers.batch(plan.draws[0])
    assert time.monotonic() - t0 < 10
    timer.join()
    assert len(seen) == 1 and _gone(seen[0]) and workers.pids == []  # stopped: the exit will not wait on it
    with pytest.raises(RuntimeError, match="are closed"):
        workers.batch(plan.draws[0])


def test_too_little_shared_memory_is_one_clear_error(tiny_cfg, tmp_path, monkeypatch):
    cfg, reader, workers = _setup(tiny_cfg, tmp_path, 1)
    free = os.statvfs_result((4096, 4096, 0, 0, 100, 0, 0, 0, 0, 255))  # 100 blocks of 4 KiB: 0.4 MiB
    monkeypatch.setattr(crop_workers.os, "statvfs", lambda path: free)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    with pytest.raises(UserError, match=r"^/dev/shm has 0 MiB free; a lowmem batch needs 1 MiB there per data worker"):
        workers.batch(plan.draws[0])
    workers.close()


_CHILD = """
import sys
from shared_data.core import config as config_mod
from shared_data.data import crop_readers, host_batches
from shared_data.data.sampler import TRAIN
cfg = config_mod.load_config("cpu_tiny", overrides=dict(train_path=sys.argv[1], num_data_workers=2))
reader = crop_readers.make_reader(cfg)
workers = host_batches.crop_workers(reader, cfg)
plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
next(iter(host_batches.NumpyLoader(reader, plan, cfg, workers=workers)))
print(*workers.pids, *workers.slot_names, flush=True)
raise ValueError("the training step failed")
"""


def test_an_exception_that_ends_the_interpreter_leaves_nothing(tiny_cfg):
    """A run that ends by an exception, with the loader neither closed nor exhausted."""
    cmd = [sys.executable, "-c", _CHILD, str(tiny_cfg.train_path)]
    res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "ValueError: the training step failed" in res.stderr, res.stderr[-2000:]
    pids = [int(w) for w in res.stdout.split() if w.isdigit()]
    slots = [w for w in res.stdout.split() if not w.isdigit()]
    assert len(pids) == 2 and 1 <= len(slots) <= 3, res.stdout
    assert all(_gone(p) for p in pids) and not any(os.path.exists(f"/dev/shm/{s}") for s in slots)
    assert "leaked" not in res.stderr, res.stderr[-2000:]  # the resource tracker had nothing to clean up


def test_closing_a_benchmarks_endless_batches_stops_the_inputs_workers(tiny_cfg, tmp_path):
    """``host_batches.forever`` (the benchmarks' batches): closing it closes the input, so a lowmem
    input's worker processes end then, not at its collection."""
    from jax_impl import data as jax_data
    from jax_impl import distribute

    cfg, _, _ = _setup(tiny_cfg, tmp_path, 2, data_loader_config="lowmem")
    inp = jax_data.make_input(cfg, "train", distribute.make_mesh(1))
    batches = host_batches.forever(inp)
    next(batches)
    pids = inp.workers.pids
    assert len(pids) == 2
    batches.close()
    assert inp.workers.pids == [] and all(_gone(p) for p in pids)


_ORPHAN_CHILD = """
import sys, time
from shared_data.core import config as config_mod
from shared_data.data import crop_readers, host_batches
from shared_data.data.sampler import TRAIN
cfg = config_mod.load_config("cpu_tiny", overrides=dict(train_path=sys.argv[1], num_data_workers=2))
reader = crop_readers.make_reader(cfg)
workers = host_batches.crop_workers(reader, cfg)
plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
next(iter(host_batches.NumpyLoader(reader, plan, cfg, workers=workers)))
print(*workers.pids, *workers.slot_names, flush=True)
time.sleep(120)
"""


def test_a_killed_parent_leaves_no_worker_behind(tiny_cfg):
    """kill -9 of the process that owns the workers (a trainer killed by the OOM killer or a batch
    system) ends its workers too: they do not run on holding the file open. Its resource tracker
    unlinks the shared memory and the semaphores left, without a word (its "leaked ... objects"
    warnings in a job's output are not the kit's lines)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_CHILD, str(tiny_cfg.train_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        words = child.stdout.readline().split()
        pids, slots = [int(w) for w in words if w.isdigit()], [w for w in words if not w.isdigit()]
        assert len(pids) == 2 and slots, words
    finally:
        child.kill()
        child.wait()  # reaped, as a batch system's step daemon reaps it (a zombie still answers kill(pid, 0))
        _, err = child.communicate(timeout=60)  # its stderr's end: the tracker's too, once it has cleaned up
    alive = [p for p in pids if not process_ended(p)]
    for p in alive:  # not ours to leave running whatever the outcome
        os.kill(p, signal.SIGKILL)
    assert not alive
    assert not any(os.path.exists(f"/dev/shm/{s}") for s in slots)
    assert err == "", err[-2000:]


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def test_sigterm_to_the_process_group_is_left_to_the_parent(tiny_cfg, tmp_path):
    """``scancel`` (another process) signals every process of the job: the workers and the fork
    server that forked them (whose end would end them) leave SIGTERM (like SIGINT) to the parent,
    which stops them when it stops, so a batch under way still completes; the parent's own SIGTERM
    (its close) ends them. The fork server starts with both signals blocked, so a Ctrl-C while it
    imports (before its own SIGINT handling) is no traceback in the run's console."""
    cfg, reader, workers = _setup(tiny_cfg, tmp_path, 2)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    loader = iter(host_batches.NumpyLoader(reader, plan, cfg, workers=workers))
    next(loader)
    pids = workers.pids
    server = _parent_pid(pids[0])
    assert server != os.getpid() and _parent_pid(pids[1]) == server
    assert {signal.SIGINT, signal.SIGTERM} <= launch.status_signals(server, "SigBlk")
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # blocked only while it started
    subprocess.run(["kill", "-TERM", str(server), *map(str, pids)], check=True)  # sent by another process
    time.sleep(0.2)
    batch = next(loader)
    assert np.isfinite(batch["inputs"]).all() and workers.pids == pids
    workers.close()
    assert all(_gone(p) for p in pids)


_DALI_CHILD = """
import sys
from shared_data.core import config as config_mod
from shared_data.data import dali_pipelines as dp
from shared_data.data.sampler import TRAIN

cfg = config_mod.load_config(
    "cpu_tiny", overrides=dict(train_path=sys.argv[1], data_loader_config="dali-h5", num_data_workers=2)
)
plans = dp.EpochPlans(cfg, TRAIN, [0], 1, 32)
pipe = dp.build_pipeline(cfg, "train", 4, None, plans, dp.crop_sources(plans, sys.argv[1], cfg))
pipe.build()
for line in sys.stdin:  # one batch per line read, its mask's sum printed
    print(int(sum(pipe.run()[2].as_array())), flush=True)
"""


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in os.scandir("/proc") if p.name.isdigit() and _ppid_or_none(int(p.name)) == pid]


def _ppid_or_none(pid: int) -> int | None:
    try:
        return _parent_pid(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None


def test_dali_parallel_workers_leave_signals_to_the_run_and_end_with_it(tiny_cfg):
    """DALI's ``parallel`` external source runs the crop source in spawned worker processes, whose
    imports start threads before the source is unpickled there: a SIGTERM or Ctrl-C to the process
    group (sent here to the workers by another process, as ``scancel`` does) leaves them running,
    so the run's next batch comes (a worker killed by it left DALI's next batch waiting forever),
    and a kill -9 of the run ends them."""
    pytest.importorskip("nvidia.dali")
    child = subprocess.Popen(
        [sys.executable, "-c", _DALI_CHILD, str(tiny_cfg.train_path)],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    workers = []
    try:
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "4"
        workers = [p for p in _children(child.pid) if b"spawn_main" in open(f"/proc/{p}/cmdline", "rb").read()]
        assert len(workers) == 2
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
            for p in workers:
                with contextlib.suppress(ProcessLookupError):  # the worker it killed before
                    os.kill(p, signum)
            time.sleep(0.1)
        assert not [p for p in workers if process_ended(p, within=0.3)], "a worker died of the signal"
        ready = threading.Timer(60, child.kill)
        ready.start()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "4"
        ready.cancel()
    finally:
        child.kill()
        child.wait()
    alive = [p for p in workers if not process_ended(p, within=6.0)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive
