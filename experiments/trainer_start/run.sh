#!/usr/bin/env bash
# Where each trainer's start goes before its first epoch, config `quality` as the time-to-quality runs
# use it (experiments/ttq_two_minutes), one GPU, one call (~1 min JAX, ~1.5 min TF): phases.py around
# one epoch of the trainer, from an empty compilation cache, for each framework in FRAMEWORKS (default
# "jax"; "jax tf" after staging TF, carry [".tf/last"]); records $OUT/start_FRAMEWORK.json, the table last.
#   FRAMEWORKS="jax tf" bash experiments/trainer_start/run.sh
# The same on CPU with a tiny config (a smoke test, ~30 s on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_tiny PY=.venv/bin/python FRAMEWORKS="jax tf" bash experiments/trainer_start/run.sh
set -uo pipefail
FRAMEWORK=$([[ ${FRAMEWORKS:-jax} == *tf* ]] && echo tf || echo jax)  # setup.sh stages TF's runtime for tf
source experiments/time_to_quality/setup.sh
if [[ $CONFIG == short ]]; then
  TRAIN_CONFIG=quality
  RECIPE=()
else
  RECIPE=("${TINY_QUALITY[@]}")
fi
CACHE=$(xla_cache)
rc=0
for framework in ${FRAMEWORKS:-jax}; do
  rm -rf "$CACHE" "${JAX_COMPILATION_CACHE_DIR:-/nonexistent}"
  echo "== $framework ($(date -u +%H:%M:%S))"
  $PY experiments/trainer_start/phases.py "$framework" "$OUT/start_$framework.json" -- --config "$TRAIN_CONFIG" \
    "${TRAIN[@]}" "${RECIPE[@]}" --set quality_every_epochs=1 --num_epochs 1 --workdir "$WORK/$framework" --overwrite \
    > "$OUT/start_$framework.log" 2>&1 || { rc=$?; tail -5 "$OUT/start_$framework.log"; }
done
$PY experiments/trainer_start/table.py "$OUT"/start_*.json | tee "$OUT/table.txt"
exit $rc
