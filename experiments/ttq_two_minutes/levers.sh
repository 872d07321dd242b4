#!/usr/bin/env bash
# Time-to-quality levers on config `quality` (configs/UNet.yaml), one H200, one call (<= 9.5 min), in JAX
# or, with FRAMEWORK=tf, in TensorFlow (carry [".tf/last"] after staging TF: ../shared/device/README.md):
# each entry of LEVERS (';'-separated, each a space-separated list of KEY=VALUE config overrides, "base"
# for none) is one time-to-quality run of the full protocol (epochs of 65536 crops, the quality evaluation
# of the whole 128^3 validation volume after each, checkpoints), stopped at the target or at the first
# epoch end past BUDGET seconds from the trainer's start (default 150), or killed after TIMEOUT (180).
# The compilation cache is emptied before the first run only (COLD=all empties it before each): the
# first run's time is a cold start, the others' compile comes from the cache (their curves compare
# on train_time_sec). The table printed last gives each run's metrics and time to quality.
#
# Default LEVERS: the schedule sized to the budget (num_epochs 5 instead of 17: the cosine decay ends
# where the run must stop), the Fourier-space L1 on the two scored channels (2/5 of its FFTs), and the
# learning rate at 2e-4 (the config's), 5e-4 and 1e-3.
#
# On nvidia-h200, from the checkout's root, $OUT set:
#   bash experiments/ttq_two_minutes/levers.sh
# The same on CPU with a tiny config (a smoke test, ~2 min on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_tiny bash experiments/ttq_two_minutes/levers.sh
# The time to quality of config `quality` with asynchronous saves and the overlapped quality check: three
# seeds, each from an empty cache, one call per framework (the table ends with their median and each
# epoch's parts: steps, validation, checkpoint and quality check on the training path):
#   LEVERS="seed=0;seed=1;seed=2" COLD=all BUDGET=600 TIMEOUT=185 bash experiments/ttq_two_minutes/levers.sh
#   FRAMEWORK=tf LEVERS="seed=0;seed=1;seed=2" COLD=all BUDGET=600 TIMEOUT=185 bash experiments/ttq_two_minutes/levers.sh
set -uo pipefail
source experiments/time_to_quality/setup.sh
SHORT="num_epochs=5 fourier_channels=scored"
LEVERS=${LEVERS:-$SHORT;$SHORT start_lr=5e-4;$SHORT start_lr=1e-3}
BUDGET=${BUDGET:-150}
TIMEOUT=${TIMEOUT:-180}
if [[ $CONFIG == short ]]; then
  TRAIN_CONFIG=quality
  RECIPE=(--set "quality_budget_sec=$BUDGET")
else
  RECIPE=("${TINY_QUALITY[@]}" --num_epochs 2)
fi
CACHE=$(xla_cache)
run_levers "${FRAMEWORK:-jax}" "$TIMEOUT"
rc=$?
$PY experiments/time_to_quality/table.py "$WORK/records" --plot "$OUT/curve.png" | tee "$OUT/table.txt"
exit $rc
