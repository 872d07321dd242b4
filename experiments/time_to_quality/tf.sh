#!/usr/bin/env bash
# The TensorFlow time-to-quality run on one H200 in one call (<= 9.5 min): run.sh's recipe (config
# `quality`: short_opt, `device` loader, bf16, the loss in physical units with the Fourier-space L1, epochs of
# 65536 crops, a quality evaluation after each, EMA 0.999) with TF's staged runtime; the budget is
# 390 s over 13 epochs, as TF's set-up (its runtime unpacked when missing), its cold compile (~40 s)
# and its step take longer than JAX's. EXTRA adds flags, as in run.sh.
#
# On nvidia-h200, after TF (.tf/p0-p5) is staged, in one call that carries [".tf/last"], $OUT set:
#   bash experiments/time_to_quality/tf.sh
# The same on CPU with a tiny config (a smoke test, ~1 min on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_tiny bash experiments/time_to_quality/tf.sh
set -uo pipefail
FRAMEWORK=tf
source experiments/time_to_quality/setup.sh
if [[ $CONFIG == short ]]; then
  TRAIN_CONFIG=quality  # run.sh's recipe as a named config (configs/UNet.yaml), 13 epochs here
  RECIPE=(--num_epochs 13 --set quality_budget_sec=390)
else
  RECIPE=("${TINY_QUALITY[@]}" --num_epochs 2)
fi
# shellcheck disable=SC2086
ttq tf_ttq tf "${RECIPE[@]}" ${EXTRA:-}
rc=$?
$PY experiments/time_to_quality/table.py "$WORK/records" --plot "$OUT/curve.png" --spectra "$OUT/spectra.png" | tee "$OUT/table.txt"
exit $rc
