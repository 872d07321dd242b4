"""The table of experiments/async_saves: per framework and mode (sync, async), from each run's
``out.log`` and ``metrics.jsonl``, the epochs after the first (the first holds the loaders' start):
the mean seconds of the steps, the mean epoch wall time minus its steps, the mean checkpoint seconds on
the training path (the log's "Checkpoint time" line), their epoch wall time (steps plus the rest: a
write in the background may slow the steps it overlaps), and the whole run's seconds.

The synchronous code logs no epoch wall time; its wall time minus steps is the validation plus the
checkpoint line (its loop does nothing else between epochs without a quality check). The asynchronous
code's is its "on the training path" line's total minus its steps.

    python experiments/async_saves/parts.py experiments/async_saves/results
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

CHECKPOINT = re.compile(r"Checkpoint time: ([0-9.]+) sec")
PARTS = re.compile(r"epoch (\d+) on the training path: ([0-9.]+) s = steps ([0-9.]+) s")


def run_parts(folder: Path) -> dict:
    """The means over epochs 2.. of one run folder's records (see the module docstring)."""
    log = (folder / "out.log").read_text()
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    checkpoint = [float(x) for x in CHECKPOINT.findall(log)][1:]
    parts = {int(e): float(w) - float(s) for e, w, s in PARTS.findall(log)}
    later = metrics[1:]
    if parts:
        off_steps = [parts[m["epoch"]] for m in later]
    else:
        off_steps = [m["val_sec"] + c for m, c in zip(later, checkpoint)]
    mean = lambda xs: sum(xs) / len(xs)
    return {
        "epochs": len(metrics),
        "steps_sec": mean([m["epoch_sec"] for m in later]),
        "wall_minus_steps_sec": mean(off_steps),
        "checkpoint_on_path_sec": mean(checkpoint),
        "run_sec": json.loads((folder / "run_sec.json").read_text())["run_sec"],
    }


def main(root: str) -> None:
    print(
        "| framework | saves | epochs | steps s/epoch | wall - steps s/epoch | checkpoint on path s/epoch "
        "| epoch wall s | run s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for framework in ("jax", "tf"):
        for mode in ("sync", "async"):
            folder = Path(root) / f"{framework}_{mode}"
            if not folder.is_dir():
                continue
            p = run_parts(folder)
            wall = p["steps_sec"] + p["wall_minus_steps_sec"]
            print(
                f"| {framework} | {mode} | {p['epochs']} | {p['steps_sec']:.2f} | {p['wall_minus_steps_sec']:.2f} "
                f"| {p['checkpoint_on_path_sec']:.2f} | {wall:.2f} | {p['run_sec']:.1f} |"
            )


if __name__ == "__main__":
    main(sys.argv[1])
