"""Where the gradient all-reduces of the data-parallel JAX train step sit in XLA's schedule (run on
a machine with 2+ GPUs): for each all-reduce, its dtype and bytes, and how many convolutions XLA
scheduled between its start and its done (work it can hide behind; 0 = exposed).

    PYTHONPATH=. python3 experiments/two_gpu_scaling/allreduce_schedule.py \
        --config short_opt --num_devices 2 [--set KEY=VALUE]
"""

import argparse
import re
import sys
from collections.abc import Sequence

import numpy as np

from dlas_compare.benchmark import int_at_least
from shared_data.core import config_cli
from shared_data.core.errors import run_cli

BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="experiments/two_gpu_scaling/allreduce_schedule.py")
    config_cli.add_config_args(p)
    p.add_argument("--num_devices", type=int_at_least(1), default=2)
    args = p.parse_args(argv)
    cfg = config_cli.config_from_args(args)
    from study_bench import StudyBench

    text = StudyBench(cfg, args.num_devices).train_fn.as_text()
    entry = text[text.index("ENTRY") :]
    lines = entry.splitlines()
    conv = [i for i, l in enumerate(lines) if "__cudnn$conv" in l or "convolution(" in l]
    print(f"grad_allreduce_dtype={cfg.grad_allreduce_dtype}: {len(lines)} scheduled ops, {len(conv)} convolutions")
    total = 0
    for i, line in enumerate(lines):
        m = re.match(r"\s*%(\S+) = (.*?) all-reduce(-start)?\(", line)
        if not m:
            continue
        shapes = re.findall(r"(f32|bf16|f16|s32)\[([\d,]*)\]", m.group(2))
        if m.group(3):  # an async start's shape lists its operands, then its results
            shapes = shapes[: len(shapes) // 2]
        nbytes = sum(BYTES[t] * int(np.prod([int(d) for d in dims.split(",") if d] or [1])) for t, dims in shapes)
        total += nbytes
        done = next((j for j in range(i + 1, len(lines)) if f"all-reduce-done(%{m.group(1)})" in lines[j]), i)
        hidden = sum(i < c < done for c in conv)
        dtypes = sorted({t for t, _ in shapes})
        print(
            f"  op {i:5d} {m.group(1)}: {len(shapes)} tensors {'/'.join(dtypes)} {nbytes / 2**20:8.1f} MiB, "
            f"{hidden} convolutions before its done"
        )
    print(f"total all-reduced: {total / 2**20:.1f} MiB per step")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
