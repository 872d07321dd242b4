"""Manual PGLE for the data-parallel JAX train step (NVIDIA's PGLE recipe, JAX's GPU performance
tips): profile the step with XLA's latency-hiding scheduler off and the all-reduces synchronous, so
each op's measured time is its own; recompile the step with that profile (``fdo_profile``) so the
scheduler plans the overlap with real costs; time both, same process, same flags otherwise.

    PYTHONPATH=. python3 experiments/two_gpu_scaling/manual_pgle.py \
        --config short_opt --num_devices 2 --local_batch_size 64 --out r.jsonl

On a CPU the profile is empty (JAX fills it only on NVIDIA GPUs) and both rows time the same step.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from study_bench import StudyBench

from dlas_compare import benchmark
from dlas_compare.benchmark import int_at_least
from dlas_compare.benchmark_timing import run_bench
from shared_data.core import config_cli
from shared_data.core.errors import run_cli

NO_OVERLAP = "--xla_gpu_enable_latency_hiding_scheduler=false --xla_gpu_disable_async_collectives=allreduce"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="experiments/two_gpu_scaling/manual_pgle.py", description=__doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument("--num_devices", type=int_at_least(1), default=2)
    p.add_argument("--steps", type=int_at_least(1), default=10, help="steps per timed window (and profiled steps)")
    p.add_argument("--windows", type=int_at_least(1), default=5)
    p.add_argument("--out", help="append the two records (JSON lines) here")
    p.add_argument("--profile_to", help=argparse.SUPPRESS)  # internal: the profiling child writes here
    return p


def write_profile(cfg, num_devices: int, steps: int, path: str) -> None:
    """Child process (started with NO_OVERLAP): run ``steps`` traced steps, save the profile proto."""
    import jax
    from jax.experimental import profiler as exp_profiler

    bench = StudyBench(cfg, num_devices)
    for _ in range(3):
        bench.step()
    bench.sync()
    with tempfile.TemporaryDirectory() as trace:
        with jax.profiler.trace(trace):
            for _ in range(steps):
                bench.step()
            bench.sync()
        runs = sorted(Path(trace).glob("plugins/profile/*"))
        Path(path).write_bytes(exp_profiler.get_profiled_instructions_proto(str(runs[-1])) if runs else b"")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_cli.config_from_args(args)
    if args.profile_to:
        write_profile(cfg, args.num_devices, args.steps, args.profile_to)
        return 0
    argv = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "profile.pb")
        env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + NO_OVERLAP).strip()}
        subprocess.run([sys.executable, __file__, *argv, "--profile_to", path], env=env, check=True)
        profile = Path(path).read_bytes()
    print(f"PGLE profile: {len(profile)} bytes")
    records = []
    for label, options in (
        (f"jax {args.num_devices} GPUs, default", None),
        (f"jax {args.num_devices} GPUs, manual PGLE", {"fdo_profile": profile}),
    ):
        bench = StudyBench(cfg, args.num_devices, compiler_options=options)
        records.append(run_bench(bench, cfg, "synthetic", 5, args.steps, args.windows, label))
    print(benchmark.table(records))
    if args.out:
        benchmark.append_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
