"""The benchmark command: IO / SYNTHETIC / FULL for one framework and loader (the tutorial's "benchy").

    python -m dlas_compare.benchmark --framework jax --mode synthetic --config short_opt
    python -m dlas_compare.benchmark --framework torch --mode full --config short_opt --data_loader_config dali-npy

Warm-up steps first (compilation, autotuning, pipeline start), in IO and FULL a drain of what the
input read ahead (steps until one waits on the loader, :func:`drain`), then ``--windows`` timed windows of
``--steps`` steps, each ended by a device sync; with ``--window_sec S`` windows hold at most as many
steps as one synced step says fit in S seconds and end once a step returns S seconds or more into
them, so slow input pipelines and fast steps take about the same time, but never fewer than
``--min_window_steps`` steps (a window of one slow step measures when one batch happened to arrive,
not the pipeline's rate). The modes of one command run in one process, SYNTHETIC first: FULL takes
over SYNTHETIC's compiled step and IO's input pipeline (:class:`Session`); ``--rungs`` runs a list of
such benchmarks (the ladder's rungs of one framework) in one process.
Reports samples/s (median over windows), step time (p50 / p90 over windows), MFU (analytic model
FLOPs x samples/s over the datasheet's dense peak of the compute dtype, and the fraction of the measured
matmul rate beside it: :mod:`dlas_compare.peaks`), compile seconds, peak device memory, device, versions and the command
line, as JSON (``--out``) and a table printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shlex
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from dlas_compare import peaks
from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.commands import make_parser
from shared_data.core.config import Config
from shared_data.core.errors import UserError, run_cli
from shared_data.core.files import check_not_input
from shared_data.model import unet_spec
from shared_data.runtime import sizing
from shared_data.runtime.checks import check_data_files

MODES = ("io", "synthetic", "full")
FRAMEWORKS = ("jax", "tf", "torch")


def make_bench(framework: str, cfg: Config, mode: str, num_devices: int | None = None, step_from=None, input_from=None):
    """The framework's ``Bench`` (``jax_impl.bench``, ``tf_impl.bench`` or ``dlas_compare.torch_ref``);
    ``step_from``: a bench of the same framework whose train step and state it takes over (a config
    that differs only in the input, :data:`INPUT_KEYS`), ``input_from``: one whose input pipeline it
    takes over (the same config)."""
    return bench_class(framework)(cfg, mode, num_devices, step_from=step_from, input_from=input_from)


def bench_class(framework: str):
    """The ``Bench`` class of ``framework``; its first call imports the framework (seconds)."""
    if framework == "jax":
        from jax_impl.bench import Bench
    elif framework == "tf":
        from tf_impl.bench import Bench
    elif framework == "torch":
        from dlas_compare.torch_ref import Bench
    else:
        raise UserError(f"--framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    return Bench


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


def run(
    framework: str,
    cfg: Config,
    mode: str,
    warmup: int,
    steps: int,
    windows: int,
    num_devices: int | None = None,
    label: str | None = None,
    window_sec: float | None = None,
    min_steps: int = 1,
) -> dict:
    """Benchmark one (framework, config, mode) in a bench of its own; return the result record."""
    return Session(framework, num_devices).run(cfg, [mode], warmup, steps, windows, label, window_sec, min_steps)[0]


#: the config keys of the input pipeline: a rung that changes only these keeps the compiled train step
INPUT_KEYS = ("data_loader_config", "num_data_workers")


class Session:
    """Benchmarks of one framework run one after another in this process, sharing what carries over:
    the framework's import and device set-up; the train step (compiled, autotuned, its state) while
    the config differs only in :data:`INPUT_KEYS`; and, within one :meth:`run`, the input pipeline of
    IO, which FULL takes over. A run measures SYNTHETIC first (building the step), then IO (a new
    pipeline), then FULL; IO and FULL drain what their pipeline read ahead before timing
    (:func:`run_bench`), except a FULL whose IO outran the step's SYNTHETIC (measured in this session
    for the same step): its queue cannot lift FULL above the step, and a drain would only add steps.
    Its pipelines are closed when it ends, so their workers do not read during
    the next run.
    """

    def __init__(self, framework: str, num_devices: int | None = None):
        self.framework, self.num_devices = framework, num_devices
        self.step_from = None  # the bench that stepped last: its train step and state (JAX donates it)
        self.step_key: dict | None = None
        self.step_rate: float | None = None  # SYNTHETIC samples/s of that train step, once measured

    def run(
        self,
        cfg: Config,
        modes: Sequence[str],
        warmup: int,
        steps: int,
        windows: int,
        label: str | None = None,
        window_sec: float | None = None,
        min_steps: int = 1,
    ) -> list[dict]:
        """Benchmark ``cfg`` in ``modes``; return the records in the order of ``modes``. One line on
        stderr per stage (set-up and compilation, timing, result), since a large config takes minutes."""
        key = {k: v for k, v in config_mod.config_dict(cfg).items() if k not in INPUT_KEYS}
        if key != self.step_key:
            self.step_from, self.step_key, self.step_rate = None, key, None
        records, input_from, pipelines = {}, None, []
        for mode in [m for m in ("synthetic", "io", "full") if m in modes]:
            what = f"[benchmark] {self.framework} {mode}"
            reuses_step = mode != "io" and self.step_from is not None
            reuses_input = mode == "full" and input_from is not None
            if mode == "io" and "full" in modes and self.step_from is None:
                stage(f"{what}: compiling the train step for FULL before its input pipeline starts")
                self.step_from = make_bench(self.framework, cfg, "synthetic", self.num_devices)
            source = "one cached batch" if mode == "synthetic" else f"{cfg.data_loader_config} loader"
            taken = [name for name, yes in (("train step", reuses_step), ("input pipeline", reuses_input)) if yes]
            stage(f"{what}: setting up ({source}, batch {cfg.global_batch_size}{', taking over the ' if taken else ''}"
                  f"{' and the '.join(taken)})")  # fmt: skip
            if mode != "io" and not reuses_step:  # the framework's import, then a compilation
                t0 = time.perf_counter()
                bench_class(self.framework)
                imported = f"{self.framework} imported in {time.perf_counter() - t0:.1f} s"
                stage(f"{what}: {imported}; building the model and compiling its train step")
            bench = make_bench(
                self.framework,
                cfg,
                mode,
                self.num_devices,
                step_from=self.step_from,  # IO takes only its device set-up (TF's strategy)
                input_from=input_from if mode == "full" else None,
            )
            # a taken-over step is compiled again where this mode's batch differs (a device loader's crop plans)
            reused = [name for name in taken if name != "train step" or not bench.compiled_step]
            ready = (
                "input pipeline ready"
                if mode == "io"
                else "the train step reused"
                if "train step" in reused
                else f"step compiled in {bench.compile_sec:.1f} s"
            )
            stage(f"{what}: {ready}; warm-up, then {windows} timed windows of up to {steps} steps")
            # a loader that outruns the step cannot lift FULL above the step, whatever it read ahead
            outrun = (
                mode == "full" and "io" in records and (self.step_rate or math.inf) <= records["io"]["samples_per_sec"]
            )
            record = run_bench(bench, cfg, mode, warmup, steps, windows, label, window_sec, min_steps, not outrun)
            record["reused"] = reused
            if mode == "synthetic":
                self.step_rate = record["samples_per_sec"]
            stage(f"{what}: {record['samples_per_sec']:.1f} samples/s")
            records[mode] = record
            if mode != "io":
                self.step_from = bench
            if mode == "io":
                input_from = bench
            if mode != "synthetic":
                pipelines.append(bench.batches)
        for batches in pipelines:  # stop reading now, not in the next rung's windows
            batches.close()
        return [records[m] for m in modes]


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
    """Time a ready ``bench`` (``step``/``sync``/``global_batch``/...; see :func:`make_bench`); return the
    result record. With ``drain``, in IO and FULL modes the warm-up is followed by a :func:`drain` of
    at most :func:`prefetch_depth` + :data:`DRAIN_EXTRA` steps: whatever the pipeline read ahead
    before the timing starts (its workers read whenever nobody consumes) is consumed first, so a
    slow loader is not hidden behind its own queue; ``drained_steps`` in the record."""
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


def table(records: list[dict]) -> str:
    """One line per record: label, mode, loader, precision, batch, samples/s, step ms, MFU (of the
    datasheet peak), the fraction of the measured matmul rate, compile, memory. The compile column
    says ``-`` for IO (no step) and ``reused`` for a step compiled by an earlier mode of the session
    (its seconds are in that mode's line)."""
    head = (
        f"{'run':<34}{'mode':<10}{'loader':<14}{'prec':<9}{'batch':>6}{'samples/s':>11}{'step ms p50/p90':>17}"
        f"{'MFU':>7}{'of matmul':>10}{'compile s':>10}{'mem GiB':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        of_matmul = f"{100 * r['mfu_of_measured_matmul']:.1f}%" if r.get("mfu_of_measured_matmul") else "-"
        mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "-"
        loader = r["loader"] if r["mode"] != "synthetic" else "-"
        compiled = (
            "-" if r["mode"] == "io" else "reused" if "train step" in r.get("reused", ()) else f"{r['compile_sec']:.1f}"
        )
        lines.append(
            f"{r['label'][:33]:<34}{r['mode']:<10}{loader[:13]:<14}{r['precision'][:8]:<9}{r['global_batch']:>6}"
            f"{r['samples_per_sec']:>11.1f}{r['step_ms_p50']:>9.1f}/{r['step_ms_p90']:<7.1f}{mfu:>7}"
            f"{of_matmul:>10}{compiled:>10}{mem:>9}"
        )
    return "\n".join(lines)


def append_records(path: str | Path, records: list[dict]) -> None:
    """Append ``records`` to the JSON-lines file ``path`` (one record per line; folders made), all or
    none: an append that fails (a full disk) cuts the file back to its earlier end, or removes it
    where this call made it, so no partial line is left for a reader or a ``--resume``.

    Raises:
        OSError: the append failed (the file is as before).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    size = path.stat().st_size if path.exists() else None
    try:
        with open(path, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    except OSError:
        if path.is_file():  # a device such as /dev/full has no end to cut back to
            try:
                path.unlink() if size is None else os.truncate(path, size)
            except OSError:
                pass  # the append's own error (say, no space left) is the one to report
        raise


def run_process(
    cmd: Sequence[str], out: Path, timeout: float, env: dict | None = None, echo: str | None = None, progress=None
) -> tuple[list[dict], str | None, str]:
    """Run a benchmark command line ``cmd`` that appends its records to ``out`` in a subprocess;
    return the records it appended, why it failed (``exit N: <last line>``, ``timed out after T s``;
    None when it did not) and its output (stderr, else stdout). With ``echo`` (a prefix), each line
    the process writes on stderr (its stages and progress) is also printed on this one's stderr as it
    comes, so a long benchmark is not minutes of silence. ``progress`` (optional) is called with the
    records appended so far each time the process appends one or more whole lines, while it runs, so
    a caller can keep each one as it comes."""
    import subprocess
    import threading

    before = out.read_text().count("\n") if out.exists() else 0

    def appended() -> list[dict]:
        text = out.read_text() if out.exists() else ""
        whole = text[: text.rfind("\n") + 1]  # a line still being written is not read
        return [json.loads(line) for line in whole.splitlines()[before:] if line]

    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    said: dict[str, list[str]] = {"stdout": [], "stderr": []}

    def read(name: str) -> None:
        for line in getattr(proc, name):
            said[name].append(line)
            if echo is not None and name == "stderr":
                print(f"{echo}{line}", end="", file=sys.stderr, flush=True)

    readers = [threading.Thread(target=read, args=(name,), daemon=True) for name in said]
    for reader in readers:
        reader.start()
    deadline, failure, seen = time.monotonic() + timeout, None, 0
    while True:
        try:
            code = proc.wait(timeout=0.5 if progress else max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            code = None
        if progress is not None and len(got := appended()) > seen:
            seen = len(got)
            progress(got)
        if code is not None:
            break
        if time.monotonic() >= deadline:
            proc.kill()
            proc.wait()
            failure = f"timed out after {timeout:.0f} s"
            break
    for reader in readers:
        reader.join(timeout=10)
    output = ("".join(said["stderr"]).strip() or "".join(said["stdout"]).strip()) or ("" if failure else "no output")
    if failure is None and code:
        failure = f"exit {code}: {output.splitlines()[-1]}"
    return appended(), failure, output


def int_at_least(minimum: int):
    """An argparse ``type`` accepting integers >= ``minimum`` (counts of steps, windows, ...)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type`` accepting numbers > 0 (durations in seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("dlas_compare.benchmark", __doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument(
        "--framework", choices=FRAMEWORKS, default="jax", help="implementation to run (default: %(default)s)"
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        nargs="+",
        default=["synthetic"],
        help="io: the input pipeline alone; synthetic: train steps on one cached batch; full: both "
        "(default: %(default)s)",
    )
    p.add_argument("--warmup", type=int_at_least(0), default=5, help="untimed steps first")
    p.add_argument("--steps", type=int_at_least(1), default=10, help="steps per timed window")
    p.add_argument("--windows", type=int_at_least(1), default=5, help="timed windows")
    p.add_argument(
        "--window_sec",
        type=positive_float,
        help="end a window early once it has lasted this many seconds (--steps is then the most per window)",
    )
    p.add_argument(
        "--min_window_steps",
        type=int_at_least(1),
        default=1,
        help="with --window_sec, the fewest steps a window holds however long they take (default: %(default)s)",
    )
    p.add_argument("--num_devices", type=int, help="data parallel over the first N devices (default: all)")
    p.add_argument("--label", help="name of this run in the table")
    p.add_argument(
        "--replica_check",
        type=int_at_least(1),
        metavar="STEPS",
        help="with --num_devices N > 1: then train STEPS steps from the initial weights on 1 device and on N "
        "at the same global batch, and record both losses per step and whether they agree (replica_check)",
    )
    p.add_argument(
        "--rungs",
        metavar="JSON",
        help="run several benchmarks in this process, in order (see run_rungs); needs --out",
    )
    p.add_argument("--out", help="append the JSON records to this file (JSON lines)")
    return p


#: relative difference of a step's loss on one device and on several at which the two count as equal:
#: the same crops, weights and arithmetic summed in another order (float32) differ by ~1e-6
SAME_LOSS_RTOL = 1e-5


def replica_check(framework: str, cfg: Config, num_devices: int, steps: int) -> dict:
    """The data-parallel correctness check: ``steps`` FULL train steps of ``cfg`` from its initial
    weights (seed ``cfg.seed``), once on one device and once on ``num_devices`` replicas, at the same
    global batch (``num_devices`` x the local batch of ``cfg``, the data-parallel rung's); the loss
    of each step on each, and whether every pair agrees within :data:`SAME_LOSS_RTOL` (relative).
    The losses agree only where the input gives step t the same crops whatever the number of replicas.

    Returns:
        ``{"replicas", "global_batch", "steps", "losses_one_device", "losses_replicas",
        "max_rel_diff", "rtol", "equal"}``.
    """
    _, local = config_mod.batch_sizes(cfg, num_devices)
    same = config_mod.replace(cfg, global_batch_size=local * num_devices, local_batch_size=None)
    losses = {}
    for devices in (1, num_devices):
        what = f"{steps} steps on {devices} device(s), global batch {local * num_devices}"
        stage(f"[benchmark] {framework} replica check: {what}")
        bench = make_bench(framework, same, "full", devices)
        got = []
        for _ in range(steps):
            bench.step()
            got.append(bench.loss())
        bench.batches.close()
        losses[devices] = got
    one, many = losses[1], losses[num_devices]
    diff = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(one, many))
    return {
        "replicas": num_devices,
        "global_batch": local * num_devices,
        "steps": steps,
        "losses_one_device": one,
        "losses_replicas": many,
        "max_rel_diff": diff,
        "rtol": SAME_LOSS_RTOL,
        "equal": diff <= SAME_LOSS_RTOL,
    }


def run_rungs(argv: list[str], path: str, out: str) -> list[dict]:
    """``--rungs``: the benchmarks of the JSON file ``path``, a list of ``{"args": [...], "record":
    {...}}``, one after another in one :class:`Session` (one per ``--num_devices``), each with the
    command line ``argv`` (less ``--rungs``) plus its ``args``; each one's records, with its
    ``record`` keys and ``rung_sec`` (seconds it took in this process), are appended to ``out`` as it
    ends, so a later one that fails loses none of them. Returns all records.

    Raises:
        UserError: ``path`` is not such a list.
    """
    expected = f'--rungs {path}: expected a JSON list of {{"args": [...], "record": {{...}}}}'
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{expected} ({err})") from None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("args"), list) for e in entries
    ):
        raise UserError(expected)
    i = argv.index("--rungs")
    base = argv[:i] + argv[i + 2 :]
    sessions, everything = {}, []
    for entry in entries:
        t0 = time.perf_counter()
        args = build_parser().parse_args([*base, *entry["args"]])
        cfg = config_cli.config_from_args(args)
        session = sessions.setdefault(args.num_devices, Session(args.framework, args.num_devices))
        records = session.run(
            cfg, args.mode, args.warmup, args.steps, args.windows, args.label, args.window_sec, args.min_window_steps
        )
        if args.replica_check:
            records[-1]["replica_check"] = replica_check(args.framework, cfg, args.num_devices, args.replica_check)
        for r in records:
            r.update(entry.get("record", {}), rung_sec=time.perf_counter() - t0)
        append_records(out, records)
        stage(f"[benchmark] {args.label or args.framework}: done in {time.perf_counter() - t0:.0f} s")
        everything += records
    return everything


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.replica_check and (args.num_devices or 1) < 2:
        raise UserError("--replica_check needs --num_devices N with N >= 2 (it compares N replicas with one device)")
    if args.rungs:
        if not args.out:
            raise UserError("--rungs needs --out (its records are appended there as each benchmark ends)")
        print(table(run_rungs(argv, args.rungs, args.out)))
        return 0
    cfg = config_cli.config_from_args(args)
    if args.framework == "torch":  # what the reference cannot run, before the hours a GPU config takes here
        from dlas_compare import torch_ref

        for mode in args.mode:
            torch_ref.check_input(cfg, mode)
        torch_ref.require_torch()
    warning = sizing.oversized_warning(cfg, len(args.mode) * (args.warmup + args.windows * args.steps), "the benchmark")
    if warning:
        stage(f"warning: {warning}")
    check_not_input({"--out": args.out}, cfg.data_inputs(), "records")
    if {"io", "full"} & set(args.mode):  # before a step compiles: IO and FULL read the training file
        check_data_files(cfg, ("train",))
    session = Session(args.framework, args.num_devices)
    records = session.run(
        cfg, args.mode, args.warmup, args.steps, args.windows, args.label, args.window_sec, args.min_window_steps
    )
    if args.replica_check:
        records[-1]["replica_check"] = replica_check(args.framework, cfg, args.num_devices, args.replica_check)
    if args.out:
        append_records(args.out, records)
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
