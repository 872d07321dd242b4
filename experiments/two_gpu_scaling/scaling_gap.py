"""Where the 2-GPU JAX step loses time against 1 GPU (weak scaling, SYNTHETIC), one process:

  1 device          the 1-GPU step (batch = local batch)
  sharded           the production step: global batch sharded over a ``data`` mesh, XLA's SPMD
                    partitioner inserts the gradient all-reduce
  shard_map pmean   the same step written per device in ``shard_map`` with an explicit
                    ``lax.pmean`` of loss and gradients (a DDP-like program)
  shard_map local   per device with no all-reduce at all: replicas drift apart, timing only; the
                    2-device cost of everything but the gradient exchange
  sharded barrier   the sharded step with the summed loss and gradients passed through one
                    ``lax.optimization_barrier`` before Adam, so no parameter update can be scheduled
                    between the all-reduces and the backward pass (XLA may then finish each
                    all-reduce late instead of right after it starts)

    PYTHONPATH=. python3 experiments/two_gpu_scaling/scaling_gap.py \
        --config short_opt --local_batch_size 64 --out r.jsonl

Runs on CPU host devices too (XLA_FLAGS=--xla_force_host_platform_device_count=2), for the smoke test.
"""

import argparse
import sys
from collections.abc import Sequence

from study_bench import StudyBench

from dlas_compare import benchmark
from dlas_compare.benchmark import int_at_least
from dlas_compare.benchmark_timing import run_bench
from shared_data.core import config_cli
from shared_data.core.errors import run_cli

from jax_impl import distribute

VARIANTS = ("1device", "sharded", "pmean", "local", "barrier")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="experiments/two_gpu_scaling/scaling_gap.py", description=__doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument("--num_devices", type=int_at_least(2), default=2)
    p.add_argument("--steps", type=int_at_least(1), default=10)
    p.add_argument("--windows", type=int_at_least(1), default=5)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS[:4], help="steps to time, in this order")
    p.add_argument("--label_suffix", default="", help="appended to each record's label (e.g. the XLA flags)")
    p.add_argument("--out", help="append the records (JSON lines) here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_cli.config_from_args(args)
    distribute.make_mesh(args.num_devices)  # UserError now, before any variant runs, if there are too few devices
    n = args.num_devices
    make = {
        "1device": lambda: StudyBench(cfg, 1),
        "sharded": lambda: StudyBench(cfg, n),
        "pmean": lambda: StudyBench(cfg, n, "pmean"),
        "local": lambda: StudyBench(cfg, n, "local"),
        "barrier": lambda: StudyBench(cfg, n, "barrier"),
    }
    labels = {
        "1device": "jax 1 device",
        "sharded": f"jax {n} devices, sharded",
        "pmean": f"jax {n} devices, shard_map pmean",
        "local": f"jax {n} devices, shard_map local",
        "barrier": f"jax {n} devices, sharded barrier",
    }
    records = [
        run_bench(make[v](), cfg, "synthetic", 5, args.steps, args.windows, labels[v] + args.label_suffix)
        for v in args.variants
    ]
    print(benchmark.table(records))
    if args.out:
        benchmark.append_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
