"""The records of run.sh as one table and the issue's ratios, all from the same file (one call).

python experiments/tf_on_h200/table.py results/compare.jsonl
"""

from __future__ import annotations

import json
import sys

from dlas_compare.benchmark import table


def main(path: str) -> None:
    records = [json.loads(line) for line in open(path) if line.strip()]
    print(table(records))
    rate = {(r["framework"], r["mode"], r["loader"]): r["samples_per_sec"] for r in records}
    syn = {fw: rate.get((fw, "synthetic", "cached device batch")) for fw in ("tf", "jax", "torch")}

    def best_dali(fw):
        rows = [(v, k[2]) for k, v in rate.items() if k[0] == fw and k[1] == "full" and k[2].startswith("dali")]
        return max(rows) if rows else (None, None)

    lines = []
    if syn["tf"] and syn["jax"]:
        lines.append(f"TF SYNTHETIC / JAX SYNTHETIC: {syn['tf'] / syn['jax']:.3f} (target >= 0.97)")
    if syn["tf"] and syn["torch"]:
        lines.append(f"TF SYNTHETIC / PyTorch SYNTHETIC: {syn['tf'] / syn['torch']:.2f}")
    for fw in ("tf", "jax"):
        full = rate.get((fw, "full", "device"))
        if full and syn[fw]:
            lines.append(
                f"{fw} FULL device / its SYNTHETIC: {full / syn[fw]:.3f}" + (" (target >= 0.95)" * (fw == "tf"))
            )
        value, loader = best_dali(fw)
        if value and syn[fw]:
            lines.append(f"{fw} best DALI FULL ({loader}) / its SYNTHETIC: {value / syn[fw]:.3f}")
    cold = [r["compile_sec"] for r in records if r["framework"] == "tf" and r["mode"] == "synthetic"]
    if cold:
        lines.append(f"TF cold train-step compile: {cold[0]:.1f} s (target <= 30)")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
