"""The benchmark command: IO / SYNTHETIC / FULL for one framework and loader (the tutorial's "benchy").

    python -m dlas_compare.benchmark --framework jax --mode synthetic --config short_opt
    python -m dlas_compare.benchmark --framework torch --mode full --config short_opt --data_loader_config dali-npy

Warm-up steps first (compilation, autotuning, pipeline start), then ``--windows`` timed windows of
``--steps`` steps, each ended by a device sync; with ``--window_sec S`` windows hold at most as many
steps as one synced step says fit in S seconds and end once a step returns S seconds or more into
them, so slow input pipelines and fast steps take about the same time.
Reports samples/s (median over windows), step time (p50 / p90 over windows), MFU (analytic model
FLOPs x samples/s / peak), compile seconds, peak device memory, device, versions and the command
line, as JSON (``--out``) and a table printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_data.core import config as config_mod
from shared_data.core.commands import make_parser
from shared_data.core.config import Config
from shared_data.core.errors import UserError, run_cli
from shared_data.model import unet_spec

MODES = ("io", "synthetic", "full")
FRAMEWORKS = ("jax", "tf", "torch")
# Peak bf16 dense rate used as the MFU denominator, by device name. H200: the rate of a bf16 8192^3
# matrix product measured on the H200 the kit's results come from; the datasheet's 989 would give
# 20% lower MFU.
PEAK_TFLOPS = {"H200": 788.0, "H100": 989.0}


def make_bench(framework: str, cfg: Config, mode: str, num_devices: int | None = None):
    """The framework's ``Bench`` (``jax_impl.bench``, ``tf_impl.bench`` or ``dlas_compare.torch_ref``)."""
    if framework == "jax":
        from jax_impl.bench import Bench
    elif framework == "tf":
        from tf_impl.bench import Bench
    elif framework == "torch":
        from dlas_compare.torch_ref import Bench
    else:
        raise UserError(f"--framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    return Bench(cfg, mode, num_devices)


def peak_tflops(device: str) -> float | None:
    for key, value in PEAK_TFLOPS.items():
        if key in device:
            return value
    return None


def timed_windows(
    call, sync, warmup: int, steps: int, windows: int, window_sec: float | None = None
) -> tuple[float, list[float], list[int]]:
    """``warmup`` untimed calls of ``call()``, then ``windows`` windows of ``steps`` calls, each ended
    by ``sync(last result)``.

    With ``window_sec`` (seconds) windows last about that long: one more untimed call, synced, gives
    the seconds of a step, and a window holds ``min(steps, ceil(window_sec / that))`` calls; a window
    also ends after the first call that returns ``window_sec`` or more after it began (an input
    pipeline that blocks). The first rule bounds asynchronous steps, whose calls return at once.

    Returns the warm-up seconds, the seconds per call of each window and the calls of each window.
    """
    t0 = time.perf_counter()
    out = None
    for _ in range(warmup):
        out = call()
    sync(out)
    if window_sec is not None:
        t1 = time.perf_counter()
        sync(call())
        steps = min(steps, max(1, math.ceil(window_sec / max(time.perf_counter() - t1, 1e-9))))
    warm_sec = time.perf_counter() - t0
    per_call, counts = [], []
    for _ in range(windows):
        t0 = time.perf_counter()
        n = 0
        while n < steps:
            out = call()
            n += 1
            if window_sec is not None and time.perf_counter() - t0 >= window_sec:
                break
        sync(out)
        per_call.append((time.perf_counter() - t0) / n)
        counts.append(n)
    return warm_sec, per_call, counts


def measure(bench, warmup: int, steps: int, windows: int, window_sec: float | None = None) -> dict:
    """Run the warm-up and the timed windows (:func:`timed_windows`); return timing statistics
    (seconds, samples/s; ``window_steps`` the steps each window held)."""
    warm_sec, per_step, counts = timed_windows(bench.step, lambda _: bench.sync(), warmup, steps, windows, window_sec)
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
        "window_steps": counts,
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
) -> dict:
    """Benchmark one (framework, config, mode); return the result record. One line on stderr per stage
    (set-up and compilation, timing, result), since a large config takes minutes."""
    what = f"[benchmark] {framework} {mode}"
    source = "one cached batch" if mode == "synthetic" else f"{cfg.data_loader_config} loader"
    stage(f"{what}: setting up ({source}, batch {cfg.global_batch_size}) and compiling the step")
    bench = make_bench(framework, cfg, mode, num_devices)
    ready = "input pipeline ready" if mode == "io" else f"compiled in {bench.compile_sec:.1f} s"
    stage(f"{what}: {ready}; warm-up, then {windows} timed windows of up to {steps} steps")
    record = run_bench(bench, cfg, mode, warmup, steps, windows, label, window_sec)
    stage(f"{what}: {record['samples_per_sec']:.1f} samples/s")
    return record


def stage(line: str) -> None:
    """Say on stderr what the benchmark is doing (the table on stdout stays the result)."""
    print(line, file=sys.stderr, flush=True)


def prefetch_depth(cfg: Config) -> int:
    """The batches an input pipeline can hold ready: the host loaders' read-ahead (workers + 1), the
    transfer queue (2) and DALI's prefetch queue."""
    return cfg.num_data_workers + 1 + 2 + cfg.dali_prefetch_queue_depth


def run_bench(
    bench,
    cfg: Config,
    mode: str,
    warmup: int,
    steps: int,
    windows: int,
    label: str | None = None,
    window_sec: float | None = None,
) -> dict:
    """Time a ready ``bench`` (``step``/``sync``/``global_batch``/...; see :func:`make_bench`); return the
    result record. In IO and FULL modes the warm-up is at least :func:`prefetch_depth` steps: the
    batches the loaders read ahead while the step compiled are consumed before the timing starts, so
    a slow loader is not hidden behind its own queue."""
    framework = bench.framework
    if mode != "synthetic":
        warmup = max(warmup, prefetch_depth(cfg))
    stats = measure(bench, warmup, steps, windows, window_sec)
    stats["warmup_steps"] = warmup
    device = bench.device_name()
    flops = unet_spec.train_flops_per_sample(cfg)
    peak = peak_tflops(device)
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
        "mfu": (flops * stats["samples_per_sec"] / (peak * 1e12 * replicas)) if (peak and mode != "io") else None,
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
    """One line per record: label, mode, loader, precision, batch, samples/s, step ms, MFU, compile, memory."""
    head = (
        f"{'run':<34}{'mode':<10}{'loader':<14}{'prec':<9}{'batch':>6}{'samples/s':>11}{'step ms p50/p90':>17}"
        f"{'MFU':>7}{'compile s':>10}{'mem GiB':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "-"
        loader = r["loader"] if r["mode"] != "synthetic" else "-"
        lines.append(
            f"{r['label'][:33]:<34}{r['mode']:<10}{loader[:13]:<14}{r['precision'][:8]:<9}{r['global_batch']:>6}"
            f"{r['samples_per_sec']:>11.1f}{r['step_ms_p50']:>9.1f}/{r['step_ms_p90']:<7.1f}{mfu:>7}"
            f"{r['compile_sec']:>10.1f}{mem:>9}"
        )
    return "\n".join(lines)


def append_records(path: str | Path, records: list[dict]) -> None:
    """Append ``records`` to the JSON-lines file ``path`` (one record per line; folders made)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


def run_process(
    cmd: Sequence[str], out: Path, timeout: float, env: dict | None = None
) -> tuple[list[dict], str | None, str]:
    """Run a benchmark command line ``cmd`` that appends its records to ``out`` in a subprocess;
    return the records it appended, why it failed (``exit N: <last line>``, ``timed out after T s``;
    None when it did not) and its output (stderr, else stdout)."""
    import subprocess

    before = out.read_text().count("\n") if out.exists() else 0
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)
        output = res.stderr.strip() or res.stdout.strip() or "no output"
        failure = f"exit {res.returncode}: {output.splitlines()[-1]}" if res.returncode else None
    except subprocess.TimeoutExpired:
        output, failure = "", f"timed out after {timeout:.0f} s"
    lines = out.read_text().splitlines()[before:] if out.exists() else []
    return [json.loads(line) for line in lines if line], failure, output


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
    config_mod.add_config_args(p)
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
    p.add_argument("--num_devices", type=int, help="data parallel over the first N devices (default: all)")
    p.add_argument("--label", help="name of this run in the table")
    p.add_argument("--out", help="append the JSON records to this file (JSON lines)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_mod.config_from_args(args)
    records = [
        run(
            args.framework,
            cfg,
            mode,
            args.warmup,
            args.steps,
            args.windows,
            args.num_devices,
            args.label,
            args.window_sec,
        )
        for mode in args.mode
    ]
    if args.out:
        append_records(args.out, records)
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
