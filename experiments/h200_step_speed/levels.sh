#!/usr/bin/env bash
# On nvidia-h200 (DALI staged in /tmp/site, see ../shared/device/README.md), call 1 of 2: the
# PyTorch reference and the JAX formulations per level (SYNTHETIC, batch 64, bf16) in one call, and
# the GPU-resident DALI input (dali-device, IO and FULL). Writes the fastest JAX variant's --set
# arguments to /tmp/best_jax_args for call 2 (scripts/gpu/h200_compare.sh). Results under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site  # DALI, staged by experiments/gpu_machine/stage_dali.sh
source scripts/gpu/common.sh
python3 experiments/h200_step_speed/suites.py h200-levels --out $OUT/levels.jsonl --timeout 120 2>&1 | tee $OUT/levels.log
python3 - "$OUT/levels.jsonl" > /tmp/best_jax_args <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
jax = [r for r in rows if r["framework"] == "jax" and r["mode"] == "synthetic"]
best = max(jax, key=lambda r: r["samples_per_sec"])
args = best["command"].split()
print(" ".join(a for i, a in enumerate(args) if a == "--set" or (i and args[i - 1] == "--set")))
PY
echo "fastest JAX variant: --set args [$(cat /tmp/best_jax_args)]" | tee -a $OUT/levels.log
