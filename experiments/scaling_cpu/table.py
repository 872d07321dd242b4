"""``python experiments/scaling_cpu/table.py RUNS``: the losses of the runs of ``run.sh`` in ``RUNS``
(folders ``FW-N-device(s)``, ``FW-N-processes``, ``FW-N-tasks``) as a Markdown table: per run the
replicas, the epoch-2 train and validation losses and the largest relative difference of any
epoch's losses from the framework's 1-device run."""

import sys
from pathlib import Path

import numpy as np

from shared_data.runtime.records import read_metrics

KINDS = (("processes", "processes"), ("tasks", "SLURM tasks"))
LAUNCHES = [("1-device", "1 device"), ("2-devices", "2 devices, 1 process")]
LAUNCHES += [(f"{n}-{kind}", f"{n} {label}") for n in (2, 4) for kind, label in KINDS]


def losses(folder: Path) -> np.ndarray:
    """Train then validation loss of every epoch, float64."""
    hist = read_metrics(folder)
    return np.array([h["train_loss"] for h in hist] + [h["val_loss"] for h in hist], np.float64)


def main(runs: Path) -> None:
    print("| framework | run | replicas | train loss, epoch 2 | val loss, epoch 2 | max rel. diff. vs 1 device |")
    print("|---|---|---:|---:|---:|---:|")
    worst = {}
    for fw in ("jax", "tf"):
        ref = losses(runs / f"{fw}-1-device")
        for name, label in LAUNCHES:
            got = losses(runs / f"{fw}-{name}")
            diff = float(np.max(np.abs(got - ref) / np.abs(ref)))
            worst[fw] = max(worst.get(fw, 0.0), diff)
            replicas = int(name.split("-")[0])
            train, val = got[len(got) // 2 - 1], got[-1]
            print(f"| {fw} | {label} | {replicas} | {train:.6f} | {val:.6f} | {diff:.1e} |")
    print()
    print("max relative difference from 1 device: " + ", ".join(f"{fw} {d:.1e}" for fw, d in worst.items()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
