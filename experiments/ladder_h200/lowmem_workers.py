"""Does the ``lowmem`` loader scale with ``num_data_workers``? Batches per second of the kit's NumPy
loader with 1 and 2 workers (``--workers``) as threads sharing one h5py handle (``NumpyLoader``
alone) and as the ``lowmem`` worker processes, each with its own handle
(``host_batches.crop_workers``, batches through shared memory); and of its two
parts alone in as many threads: the h5py ``read_direct`` of the crops and the NumPy symmetry copies;
and, for comparison, the same reads in as many processes (each with its own handle, as the
tutorial's PyTorch DataLoader workers). The control, a pure Python loop in 2 processes, says how
many cores the machine gives while it runs (a shared machine may give fewer than it has).

    python experiments/ladder_h200/lowmem_workers.py --data /tmp/train_128.h5 --crop 32 --batch 8

A table is printed last: one line per variant, batches/s per worker count and the last's speed-up
over the first. On the 16-core GPU host, after setup.sh: ``--data data/train_256.h5 --crop 64
--batch 8 --workers 1 4 8``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import time

import numpy as np

from shared_data.core import config as config_mod
from shared_data.data import crop_readers, host_batches
from shared_data.data.sampler import TRAIN


def rate(fn, jobs: int, workers: int, pool_cls) -> float:
    """Jobs per second of ``fn(i)`` for ``jobs`` jobs on ``workers`` of ``pool_cls``."""
    with pool_cls(workers) as pool:
        list(pool.map(fn, range(workers)))  # start the workers, open their handles
        t0 = time.perf_counter()
        list(pool.map(fn, range(jobs)))
        return jobs / (time.perf_counter() - t0)


_STATE = {}


def _setup(cfg):
    reader = crop_readers.make_reader(cfg)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    return reader, plan


def read_only(i: int) -> None:
    """The h5py reads of batch ``i`` (no symmetry)."""
    reader, plan, cfg = _STATE["reader"], _STATE["plan"], _STATE["cfg"]
    s = cfg.crop_size
    buf_in = np.empty((cfg.N_in_channels, s, s, s), np.float32)
    buf_tar = np.empty((cfg.N_out_channels, s, s, s), np.float32)
    draws = plan.draws[i % len(plan)]
    for start in draws.starts:
        reader.read(start, buf_in, buf_tar)


def sym_only(i: int) -> None:
    """The NumPy symmetry copies of batch ``i`` on one cached crop (no reads)."""
    cfg, plan = _STATE["cfg"], _STATE["plan"]
    s = cfg.crop_size
    crop_in = _STATE.setdefault("crop_in", np.random.default_rng(0).random((cfg.N_in_channels, s, s, s), np.float32))
    crop_tar = _STATE.setdefault("crop_tar", np.random.default_rng(1).random((cfg.N_out_channels, s, s, s), np.float32))
    for sym in plan.draws[i % len(plan)].symmetries:
        crop_readers.make_sample(crop_in, crop_tar, int(sym), cfg)


def whole(i: int) -> None:
    """What one loader worker does for batch ``i``: reads and symmetry (``NumpyLoader.load``)."""
    cfg, plan = _STATE["cfg"], _STATE["plan"]
    crop_readers.make_batch(_STATE["reader"], plan.draws[i % len(plan)], cfg)


def busy(i: int) -> None:
    """Pure Python arithmetic (holds the GIL): the control of how many cores this machine gives now."""
    sum(k * k for k in range(300_000))


def phil_wait(seconds: float = 2.0) -> tuple[float, float]:
    """While one thread reads crops without pause, the mean milliseconds another thread waits for
    h5py's process-wide lock (``phil``), against the mean milliseconds of one crop read: about half
    a read when every read holds the lock (a core-count-free sign that threads serialize reads)."""
    import threading

    from h5py._objects import phil

    stop, reads = threading.Event(), []

    def reader():
        while not stop.is_set():
            t0 = time.perf_counter()
            read_only(0)
            reads.append((time.perf_counter() - t0) / _STATE["cfg"].global_batch_size)

    thread = threading.Thread(target=reader)
    thread.start()
    waits, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        with phil:
            waits.append(time.perf_counter() - t0)
        time.sleep(0.003)
    stop.set()
    thread.join()
    return 1e3 * float(np.mean(waits)), 1e3 * float(np.mean(reads))


def init(cfg) -> None:
    _STATE.clear()
    _STATE["cfg"] = cfg
    _STATE["reader"], _STATE["plan"] = _setup(cfg)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="HDF5 file of the dataset contract")
    p.add_argument("--crop", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--jobs", type=int, default=24, help="batches per measurement")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (the first is the base)")
    args = p.parse_args()
    cfg = config_mod.load_config(
        "cpu_tiny",
        overrides={
            "train_path": args.data,
            "crop_size": args.crop,
            "global_batch_size": args.batch,
            "base_batch_size": args.batch,
            "Nsamples": args.batch * args.jobs,
            "data_loader_config": "lowmem",
        },
    )
    init(cfg)
    processes = lambda n: cf.ProcessPoolExecutor(n, initializer=init, initargs=(cfg,))
    rows = [("control: Python loop, processes", [rate(busy, args.jobs, w, processes) for w in args.workers])]
    parts = [
        ("Python loop", busy),
        ("h5py reads", read_only),
        ("symmetry copies", sym_only),
        ("reads + symmetry", whole),
    ]
    for name, fn in parts:
        rows.append((f"{name}, threads", [rate(fn, args.jobs, w, cf.ThreadPoolExecutor) for w in args.workers]))
    rows.append(("reads + symmetry, processes", [rate(whole, args.jobs, w, processes) for w in args.workers]))
    for name, processes in [("threads", False), ("processes", True)]:
        loader = []
        for w in args.workers:
            wcfg = config_mod.replace(cfg, num_data_workers=w)
            reader, plan = _setup(wcfg)
            workers = host_batches.crop_workers(reader, wcfg) if processes else None
            it = iter(host_batches.NumpyLoader(reader, plan, wcfg, workers=workers))
            next(it)  # the workers start
            t0 = time.perf_counter()
            n = sum(1 for _ in it)
            loader.append(n / (time.perf_counter() - t0))
            if workers is not None:
                workers.close()
        rows.append((f"NumpyLoader, {name}", loader))
    wait_ms, read_ms = phil_wait()
    print(f"crop {args.crop}^3, batch {args.batch}, {args.data}")
    print(
        f"h5py's lock (phil) while another thread reads: waited {wait_ms:.2f} ms on average; one crop read "
        f"(both volumes) {read_ms:.2f} ms"
    )
    head = "".join(f"{f'{w} workers':>11}" for w in args.workers)
    print(f"{'batches/s':<34}{head}   x (last / first)")
    for name, rates in rows:
        print(f"{name:<34}" + "".join(f"{r:>11.1f}" for r in rates) + f"   {rates[-1] / rates[0]:.2f}")


if __name__ == "__main__":
    main()
