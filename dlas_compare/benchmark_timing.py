"""The timing of one benchmark: warm-up, a drain of what an input pipeline read ahead, timed windows
each ended by a device sync, their statistics, and the result record.

:func:`timed_windows` times any call (the benchmark's steps, :mod:`dlas_compare.layer_bench`'s layers);
:func:`waiting` keeps a long sync from being minutes of silence; :func:`drain` consumes the batches a
pipeline queued while nobody read; :func:`measure` turns the windows into samples/s (median over
windows) and step time (p50 / p90); :func:`run_bench` times a ready ``Bench`` and writes the record:
those, MFU (analytic model FLOPs x samples/s over the datasheet's dense peak of the compute dtype, and
the fraction of the measured matmul rate: :mod:`dlas_compare.peaks`), compile seconds, peak device
memory, device, versions, host, command line and date. The modes' order and what they share are
:mod:`dlas_compare.benchmark_session`'s, the command line and the table :mod:`dlas_compare.benchmark`'s.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import platform
import shlex
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np

from dlas_compare import peaks
from shared_data.core import config as config_mod
from shared_data.core.config import Config
from shared_data.model import unet_spec

#: Seconds between two progress lines of :func:`timed_windows`.
REPORT_SEC = 10.0
#: Seconds between two lines while :func:`timed_windows` waits for queued steps (:func:`waiting`).
WAIT_REPORT_SEC = 30.0


@contextlib.contextmanager
def waiting(report, text: str) -> Iterator[None]:
    """While the block runs (a sync that waits for the steps dispatched before it: minutes where a step
    of a GPU-sized config runs on a CPU), ``report(f"{text}, N s so far")`` every :data:`WAIT_REPORT_SEC`
    seconds from another thread; nothing without ``report``."""
    if report is None:
        yield
        return
    done, t0 = threading.Event(), time.perf_counter()

    def beat() -> None:
        while not done.wait(WAIT_REPORT_SEC):
            report(f"{text}, {time.perf_counter() - t0:.0f} s so far")

    beats = threading.Thread(target=beat, daemon=True)
    beats.start()
    try:
        yield
    finally:
        done.set()
        beats.join()


def timed_windows(
    call,
    sync,
    warmup: int,
    steps: int,
    windows: int,
    window_sec: float | None = None,
    min_steps: int = 1,
    before_timing=None,
    report=None,
) -> tuple[float, list[float], list[int]]:
    """``warmup`` untimed calls of ``call()``, then ``windows`` windows of ``steps`` calls, each ended
    by ``sync(last result)``. ``before_timing()``, when given, runs after the warm-up and before the
    windows are sized (e.g. :func:`drain`); its seconds count in the warm-up's.

    With ``window_sec`` (seconds) windows last about that long, and hold at least ``min_steps`` calls
    (a slow step's window holds enough steps to mean something): the last warm-up call (one more
    call without warm-up), synced, gives the seconds of a step, and a window holds
    ``min(steps, max(min_steps, ceil(window_sec / that)))`` calls; a window also ends after the first
    call that returns ``window_sec`` or more after it began, once it holds ``min_steps`` calls (an
    input pipeline that blocks). The first rule bounds asynchronous steps, whose calls return at once.

    ``report(text)``, when given, hears where the calls are (``warm-up step 2/3``, ``window 1/5, step
    4/10``) at most every :data:`REPORT_SEC` seconds, so a slow step is not minutes of silence.

    Returns the warm-up seconds, the seconds per call of each window and the calls of each window.
    """
    t0 = time.perf_counter()
    said = [t0]

    def tick(text: str) -> None:
        if report is not None and time.perf_counter() - said[0] >= REPORT_SEC:
            report(text)
            said[0] = time.perf_counter()

    out = None
    timed = window_sec is not None
    n_warm = warmup - 1 if timed and warmup else warmup
    for i in range(n_warm):
        out = call()
        tick(f"warm-up step {i + 1}/{n_warm}")
    with waiting(report, f"warm-up: waiting for its {n_warm} step(s)"):
        sync(out)
    if before_timing is not None:
        before_timing()
    if timed:
        t1 = time.perf_counter()
        with waiting(report, "timing one step to size the windows"):
            sync(call())
        steps = min(steps, max(min_steps, math.ceil(window_sec / max(time.perf_counter() - t1, 1e-9))))
    min_steps = min(min_steps, steps)
    warm_sec = time.perf_counter() - t0
    per_call, counts = [], []
    for w in range(windows):
        t0 = time.perf_counter()
        n = 0
        while n < steps:
            out = call()
            n += 1
            tick(f"window {w + 1}/{windows}, step {n}/{steps}")
            if timed and n >= min_steps and time.perf_counter() - t0 >= window_sec:
                break
        with waiting(report, f"window {w + 1}/{windows}: waiting for its {n} step(s)"):
            sync(out)
        per_call.append((time.perf_counter() - t0) / n)
        counts.append(n)
    return warm_sec, per_call, counts


#: a drain's call that takes more than this many times its fastest call (and :data:`DRAIN_FLOOR_SEC`)
#: waited on the input's producer: what the pipeline had read ahead is consumed
DRAIN_WAIT_RATIO = 3.0
DRAIN_FLOOR_SEC = 1e-3
#: calls a drain may take beyond :func:`prefetch_depth` (an estimate of the queues' depth: tf.data's
#: autotuned prefetch and a worker's batch under way hold a few more)
DRAIN_EXTRA = 4


def drain(call, sync, cap: int) -> int:
    """Consume the batches an input pipeline read ahead (while a step compiled, a previous mode ran,
    anything paused): synced calls of ``call()`` until one waits on the producer, or ``cap`` calls.

    A call waits when it takes more than :data:`DRAIN_WAIT_RATIO` times the fastest so far (and
    :data:`DRAIN_FLOOR_SEC`): the queued batches were fast, the next is not. An empty queue makes
    every call alike slow, so the drain pauses as long as its first call took: when the next call
    is then :data:`DRAIN_WAIT_RATIO` times faster, it took the batch made during the pause, nothing
    was queued, and the drain ends (a full queue's fast calls are as fast after the pause; so are a
    slow consumer's, whose queue never empties and never inflates a rate). A full queue costs its
    depth in fast calls and one wait, an empty one two calls and the pause.

    Returns the calls made (the last one included)."""
    fastest = first = math.inf
    for n in range(1, cap + 1):
        t0 = time.perf_counter()
        sync(call())
        took = time.perf_counter() - t0
        if took > DRAIN_WAIT_RATIO * max(fastest, DRAIN_FLOOR_SEC):
            return n
        if n == 1:
            first = took
            time.sleep(took)
        elif n == 2 and DRAIN_WAIT_RATIO * max(took, DRAIN_FLOOR_SEC) < first:
            return n
        fastest = min(fastest, took)
    return cap


def measure(
    bench,
    warmup: int,
    steps: int,
    windows: int,
    window_sec: float | None = None,
    min_steps: int = 1,
    drain_cap: int = 0,
    report=None,
) -> dict:
    """Run the warm-up, a :func:`drain` of at most ``drain_cap`` calls (0: none) and the timed
    windows (:func:`timed_windows`, which tells ``report`` its progress); return timing statistics
    (seconds, samples/s; ``window_steps`` the steps each window held, ``drained_steps`` the drain's calls)."""
    sync = lambda _: bench.sync()
    drained = [0]

    def before_timing():
        drained[0] = drain(bench.step, sync, drain_cap) if drain_cap else 0

    warm_sec, per_step, counts = timed_windows(
        bench.step, sync, warmup, steps, windows, window_sec, min_steps, before_timing, report
    )
    per_step = np.array(per_step)
    rates = bench.global_batch / per_step
    return {
        "samples_per_sec": float(np.median(rates)),
        "samples_per_sec_min": float(rates.min()),
        "samples_per_sec_max": float(rates.max()),
        "step_ms_p50": float(np.percentile(per_step, 50) * 1e3),
        "step_ms_p90": float(np.percentile(per_step, 90) * 1e3),
        "warmup_sec": warm_sec,
        "windows": windows,
        "steps_per_window": steps,
        "window_sec": window_sec,
        "min_window_steps": min_steps,
        "window_steps": counts,
        "drained_steps": drained[0],
    }


def stage(line: str) -> None:
    """Say on stderr what the benchmark is doing (the table on stdout stays the result)."""
    print(line, file=sys.stderr, flush=True)


def prefetch_depth(cfg: Config, framework: str = "jax") -> int:
    """The batches an input pipeline can hold ready: the host workers' read-ahead (workers + 1; the
    native host loaders' threads and ``dali-h5``'s Python workers; DALI's own readers and the
    device-resident loaders have none), the transfer queue of JAX and TF (2; the PyTorch reference
    copies in its loader) and, for a DALI loader, DALI's prefetch queue."""
    from shared_data.core import loader_kinds

    kind = loader_kinds.loader_kind(cfg)
    host_workers = not kind.device_volumes and (not kind.dali or kind.crops_outside_dali)
    transfer = 0 if framework == "torch" else 2
    dali = cfg.dali_prefetch_queue_depth if kind.dali else 0
    return (cfg.num_data_workers + 1 if host_workers else 0) + transfer + dali


def run_bench(
    bench,
    cfg: Config,
    mode: str,
    warmup: int,
    steps: int,
    windows: int,
    label: str | None = None,
    window_sec: float | None = None,
    min_steps: int = 1,
    drain: bool = True,
) -> dict:
    """Time a ready ``bench`` (``step``/``sync``/``global_batch``/...; see
    :func:`dlas_compare.benchmark_session.make_bench`); return the result record. With ``drain``, in
    IO and FULL modes the warm-up is followed by a :func:`drain` of at most :func:`prefetch_depth` +
    :data:`DRAIN_EXTRA` steps: whatever the pipeline read ahead before the timing starts (its workers
    read whenever nobody consumes) is consumed first, so a slow loader is not hidden behind its own
    queue; ``drained_steps`` in the record."""
    framework = bench.framework
    cap = prefetch_depth(cfg, framework) + DRAIN_EXTRA if mode != "synthetic" and drain else 0
    report = lambda text: stage(f"[benchmark] {framework} {mode}: {text}")
    stats = measure(bench, warmup, steps, windows, window_sec, min_steps, cap, report)
    stats["warmup_steps"] = warmup
    device = bench.device_name()
    flops = unet_spec.train_flops_per_sample(cfg)
    replicas = getattr(bench, "replicas", 1)
    record = {
        "label": label or f"{framework} {mode}",
        "framework": framework,
        "mode": mode,
        "config": cfg.name,
        "loader": cfg.data_loader_config if mode != "synthetic" else "cached device batch",
        "precision": cfg.precision,
        "global_batch": bench.global_batch,
        "crop_size": cfg.crop_size,
        **stats,
        "compile_sec": bench.compile_sec,
        "train_gflop_per_sample": flops / 1e9,
        **dict.fromkeys(peaks.UTILISATION_KEYS),
        **(peaks.utilisation(flops, stats["samples_per_sec"], device, cfg.precision, replicas) if mode != "io" else {}),
        "peak_memory_gib": (bench.peak_memory_bytes() or 0) / 2**30 or None,
        "device": device,
        "versions": bench.versions(),
        "host": platform.node(),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "config_values": config_mod.config_dict(cfg),
        "notes": getattr(bench, "notes", None),
    }
    return record
