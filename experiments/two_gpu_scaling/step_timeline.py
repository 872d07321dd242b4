"""Timeline of the data-parallel JAX train step on the GPUs: when the gradient all-reduce kernels
run, how much of them overlaps compute kernels, and how long the compute streams sit idle.

Traces ``--steps`` SYNTHETIC steps with ``jax.profiler.trace(create_perfetto_trace=True)`` (JAX's
profiling guide), then reads the Perfetto JSON: per GPU, kernels on its ``Stream`` threads, NCCL
kernels (names containing ``nccl``) as communication, everything else as compute.

    PYTHONPATH=. python3 experiments/two_gpu_scaling/step_timeline.py \
        --config short_opt --num_devices 2 --local_batch_size 64 --trace_to DIR

On a CPU the trace has no GPU threads and the report says so.
"""

import argparse
import gzip
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dlas_compare.benchmark import int_at_least
from shared_data.core import config_cli
from shared_data.core.errors import run_cli


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted (start, end) intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in union(intervals))


def intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two interval sets."""
    x, y, i, j, total = union(x), union(y), 0, 0, 0.0
    while i < len(x) and j < len(y):
        total += max(0.0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(events: list[dict], steps: int) -> list[dict]:
    """Per GPU of a Chrome/Perfetto trace (``traceEvents``; times in microseconds): milliseconds per
    step of compute kernels (union over streams), NCCL kernels, their overlap, NCCL time not hidden
    by compute, and compute-stream idle time inside the traced span of kernels."""
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    report = []
    for pid, pname in sorted(procs.items(), key=lambda kv: kv[1]):
        if not pname.startswith("/device:GPU"):
            continue
        comm, comp = [], []
        for e in events:
            if e.get("ph") == "X" and e.get("pid") == pid and threads.get((pid, e.get("tid")), "").startswith("Stream"):
                (comm if "nccl" in e["name"].lower() else comp).append((e["ts"], e["ts"] + e.get("dur", 0)))
        if not comp:
            continue
        span = max(b for _, b in comm + comp) - min(a for a, _ in comm + comp)
        both = intersect(comm, comp)
        per = lambda us: us / 1000 / steps
        report.append(
            {
                "device": pname,
                "compute_ms": per(length(comp)),
                "nccl_ms": per(length(comm)),
                "overlap_ms": per(both),
                "nccl_exposed_ms": per(length(comm) - both),
                "idle_ms": per(span - length(comp + comm)),
                "span_ms": per(span),
            }
        )
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="experiments/two_gpu_scaling/step_timeline.py", description=__doc__.split("\n\n")[0]
    )
    config_cli.add_config_args(p)
    p.add_argument("--num_devices", type=int_at_least(1), default=2)
    p.add_argument("--steps", type=int_at_least(1), default=5, help="traced steps (after 5 untraced)")
    p.add_argument("--trace_to", help="keep the trace directory here (default: a temporary one)")
    p.add_argument(
        "--no_all_reduce",
        action="store_true",
        help="trace scaling_gap.py's 'shard_map local' step (per device, no gradient all-reduce)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_cli.config_from_args(args)
    import jax
    from study_bench import StudyBench

    if args.no_all_reduce:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from scaling_gap import shard_map_bench

        bench = shard_map_bench(cfg, args.num_devices, all_reduce=False)
    else:
        bench = StudyBench(cfg, args.num_devices)  # UserError if there are too few devices
    for _ in range(5):
        bench.step()
    bench.sync()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.trace_to or tmp)
        with jax.profiler.trace(str(root), create_perfetto_trace=True):
            for _ in range(args.steps):
                bench.step()
            bench.sync()
        trace = sorted(root.glob("plugins/profile/*/perfetto_trace.json.gz"))[-1]
        events = json.load(gzip.open(trace))["traceEvents"]
    report = summarize(events, args.steps)
    if not report:
        print("no GPU kernels in the trace")
    print(f"{'device':<16}{'compute':>9}{'nccl':>8}{'overlap':>9}{'exposed':>9}{'idle':>7}{'span':>8}   ms per step")
    for r in report:
        print(
            f"{r['device']:<16}{r['compute_ms']:>9.2f}{r['nccl_ms']:>8.2f}{r['overlap_ms']:>9.2f}{r['nccl_exposed_ms']:>9.2f}"
            f"{r['idle_ms']:>7.2f}{r['span_ms']:>8.2f}"
        )
    nccl_kernels(events)
    return 0


def nccl_kernels(events: list[dict]) -> None:
    """Print GPU 0's NCCL kernels: start (ms after its first kernel), duration, name."""
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    gpu0 = [pid for pid, name in procs.items() if name == "/device:GPU:0"]
    kernels = sorted(
        (e for e in events if e.get("ph") == "X" and gpu0 and e.get("pid") == gpu0[0]), key=lambda e: e["ts"]
    )
    if not kernels:
        return
    t0 = kernels[0]["ts"]
    for e in kernels:
        if "nccl" in e["name"].lower():
            print(f"  nccl at {(e['ts'] - t0) / 1000:8.2f} ms  {e.get('dur', 0) / 1000:6.3f} ms  {e['name'][:60]}")


if __name__ == "__main__":
    sys.exit(run_cli(main))
