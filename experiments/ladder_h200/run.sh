#!/usr/bin/env bash
# The tutorial's ladder on one H200: JAX and the PyTorch reference (no TF on that machine) on
# short_opt (64^3 crops, batch 64, the full 117 M-parameter net). Rungs 1-6 for JAX, 1-4 for
# PyTorch (the reference has no compilation switch and no GPU-resident loader), data parallel
# skipped on one GPU; the DALI rung needs DALI staged (experiments/gpu_machine/stage_dali.sh), else it is
# skipped with the reason. Timed windows last about 1 s, so slow host loaders take 1-2 steps and
# fast steps up to 40; --budget_sec stops the ladder at 7 minutes, so set-up (data ~1 min) and
# ladder fit one 10-minute device call. Results under $OUT.
#   bash experiments/ladder_h200/run.sh
set -uo pipefail
export PYTHONPATH=/tmp/site  # DALI, staged by experiments/gpu_machine/stage_dali.sh
source scripts/gpu/common.sh
python3 -m dlas_compare.ladder --frameworks jax torch --config short_opt \
  --warmup 2 --steps 40 --windows 3 --window_sec 1 --timeout 150 --budget_sec 420 \
  --out $OUT/ladder_short_opt.jsonl --figure $OUT/ladder_short_opt.png 2>&1 | tee $OUT/ladder_short_opt.log
