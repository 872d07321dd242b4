#!/usr/bin/env bash
# A/B of the quality check's background warm-up (Monitor.warm) in one call, in JAX or, with FRAMEWORK=tf,
# in TensorFlow (carry [".tf/last"] after staging TF): for each seed in SEEDS (default "0 1"), one
# time-to-quality run of config `quality` with the warm-up (the trainer as it is) and one without it
# (without_warm.py), each from an empty compilation cache, stopped at the target or at the first epoch
# end past BUDGET seconds (default 600), or killed after TIMEOUT (default 150). The table printed last
# gives each run's time to quality and each epoch's parts (read epoch 1's "quality check": the forward's
# compile on the training path, or not).
#
# On the GPU machine, from the checkout's root, $OUT set (JAX ~8 min; TF ~5 min a seed, so one seed a call):
#   bash experiments/ttq_two_minutes/warm_ab.sh
#   FRAMEWORK=tf SEEDS=0 TIMEOUT=170 bash experiments/ttq_two_minutes/warm_ab.sh
# The same on CPU with a tiny config (a smoke test, ~2 min on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_tiny SEEDS=0 bash experiments/ttq_two_minutes/warm_ab.sh
set -uo pipefail
source experiments/time_to_quality/setup.sh
BUDGET=${BUDGET:-600}
TIMEOUT=${TIMEOUT:-150}
if [[ $CONFIG == short ]]; then
  TRAIN_CONFIG=quality
  RECIPE=(--set "quality_budget_sec=$BUDGET")
else
  RECIPE=("${TINY_QUALITY[@]}" --num_epochs 2)
fi
CACHE=$(xla_cache)
framework=${FRAMEWORK:-jax}
rc=0
for seed in ${SEEDS:-0 1}; do
  for variant in warm without_warm; do
    rm -rf "$CACHE" "${JAX_COMPILATION_CACHE_DIR:-/nonexistent}"
    py=$PY
    [[ $variant == without_warm ]] && py="$PY experiments/ttq_two_minutes/without_warm.py"
    name="seed-${seed}_$variant"
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "$TIMEOUT" bash -c "$(declare -f ttq); PY='$py'; $(declare -p CONFIG TRAIN_CONFIG TRAIN WORK OUT); \
      ttq '$name' $framework $(printf '%q ' "${RECIPE[@]}" --set "seed=$seed")" || rc=$?
  done
done
$PY experiments/time_to_quality/table.py "$WORK/records" --plot "$OUT/curve.png" | tee "$OUT/table.txt"
exit $rc
