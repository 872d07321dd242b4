#!/usr/bin/env bash
# The JAX time-to-quality run on one H200 in one call (<= 9.5 min), config `quality` (configs/UNet.yaml):
# short_opt with the `device` loader, bf16, the loss levers' winner (the loss in physical units with the
# Fourier-space L1: levers.sh's first round, README.md here), epochs of 65536 crops (~18 s of steps with
# the Fourier term) each followed by a quality evaluation of the whole 128^3 validation volume, the
# cosine schedule over 17 epochs (about what fits: ~18 s of steps, ~4 s of checkpoint and evaluation
# and ~1 s of weight average an epoch), EMA of the weights (ema_decay 0.999, ~1000 steps = one epoch:
# the evaluated model is the average of the last epoch's weights, not the last step's). The budget is
# 450 s from the trainer's start here (the config's 600 s would not fit one call with the set-up).
# EXTRA adds flags (EXTRA="--set start_lr=5e-4").
#
# On nvidia-h200, from the checkout's root, $OUT set:
#   bash experiments/time_to_quality/run.sh
# The same on CPU with a tiny config (a smoke test, ~1 min on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_tiny bash experiments/time_to_quality/run.sh
set -uo pipefail
source experiments/time_to_quality/setup.sh
if [[ $CONFIG == short ]]; then
  TRAIN_CONFIG=quality  # the recipe above as a named config (configs/UNet.yaml)
  RECIPE=(--set quality_budget_sec=450)
else
  RECIPE=("${TINY_QUALITY[@]}" --num_epochs 2)
fi
# shellcheck disable=SC2086
ttq jax_ttq jax "${RECIPE[@]}" ${EXTRA:-}
rc=$?
$PY experiments/time_to_quality/table.py "$WORK/records" --plot "$OUT/curve.png" --spectra "$OUT/spectra.png" | tee "$OUT/table.txt"
exit $rc
