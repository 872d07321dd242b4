#!/usr/bin/env bash
# The tutorial's ladder on one H200 in JAX, TensorFlow and the PyTorch reference, in one 10-minute call:
# short_opt (64^3 crops, batch 64, the full 117 M-parameter net), rungs 1-6 for JAX and TF, 1-4 for
# PyTorch (the reference has no compilation switch and no GPU-resident loader), data parallel skipped
# on one GPU. Each framework's rungs run in as few processes as its settings allow (JAX 1-4 and 5-6,
# TF 1-6, PyTorch 1-4), so imports, GPU set-up and compiled steps carry over. Timed windows hold at
# least 5 steps (a slow lowmem rung's window is ~5 s); the ladder prints its schedule first (its
# processes, each rung's modes and estimated seconds, the total, and the rungs the budget is expected
# to stop if the total is over it), trims the fast rungs' windows to fit, and stops at DEADLINE
# seconds after this script starts (BUDGET at most), so set-up (TF unpacked, data ~35 s) and ladder
# end inside the call's 600 s. A later call with RESUME=<this call's jsonl, copied into the checkout>
# runs only the rungs this one did not finish.
#
# On nvidia-h200, after DALI (.dali/p0-p2) and TF (.tf/p0-p5) are staged by their calls
# (../shared/device/README.md), in one call that carries [".tf/last", ".daltf"], $OUT set:
#   bash experiments/ladder_h200/run.sh
# The same commands on CPU with a tiny config (a smoke test, ~1.5 min on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_tiny BUDGET=150 bash experiments/ladder_h200/run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short_opt}
PY=${PY:-python3}
BUDGET=${BUDGET:-540}
DEADLINE=${DEADLINE:-570}
RESUME=${RESUME:-}
mkdir -p "$OUT"
if [[ $CONFIG == short_opt ]]; then
  export PYTHONPATH=/tmp/site  # DALI, staged by ../shared/device/stage-dali.sh
  source scripts/gpu/common.sh  # a GPU (else one error line), the environment, device record, data
  if [[ ! -f /tmp/tf-env.sh ]]; then
    bash .tf/last/tf-on-device.sh > "$OUT/tf_unpack.log" 2>&1 || { tail -5 "$OUT/tf_unpack.log"; exit 1; }
  fi
  source /tmp/tf-env.sh
  export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
  bash experiments/tf_on_h200/plugin.sh  # the DALI TF plugin carried in .daltf/
  $PY -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)" | tee -a "$OUT/device.txt"
  DATA=()
else
  export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
  WORK=${WORK:-/tmp/ladder_h200}
  mkdir -p "$WORK"
  $PY -m shared_data.data.generate --out "$WORK/train_32.h5" --size 32 --seed 1 --chunk 16 --npy --if-missing > /dev/null
  $PY -m shared_data.data.generate --out "$WORK/val_32.h5" --size 32 --seed 2 --chunk 16 --if-missing > /dev/null
  DATA=(--set "train_path=$WORK/train_32.h5" --set "val_path=$WORK/val_32.h5" --set "xla_cache_dir=$WORK/xla")
fi
left=$((DEADLINE - SECONDS))
budget=$((left < BUDGET ? left : BUDGET))
echo "set-up took ${SECONDS} s; the ladder's budget: ${budget} s" | tee "$OUT/timeline.txt"
$PY -m dlas_compare.ladder --frameworks jax tf torch --config "$CONFIG" "${DATA[@]}" \
  --warmup 2 --steps 40 --windows 3 --window_sec 1 --min_window_steps 5 --timeout 150 --budget_sec "$budget" ${RESUME:+--resume "$RESUME"} \
  --out "$OUT/ladder_$CONFIG.jsonl" --figure "$OUT/ladder_$CONFIG.png" 2>&1 | grep --line-buffered -v "^W0000\|^I0000" \
  | tee "$OUT/ladder_$CONFIG.log"
status=${PIPESTATUS[0]}
echo "done at ${SECONDS} s, exit $status" | tee -a "$OUT/timeline.txt"
exit "$status"
