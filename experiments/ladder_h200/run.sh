#!/usr/bin/env bash
# The tutorial's ladder on one H200 in JAX, TensorFlow and the PyTorch reference, in one 10-minute call:
# short_opt (64^3 crops, batch 64, the full 117 M-parameter net), rungs 1-6 for JAX and TF, 1-4 for
# PyTorch (the reference has no compilation switch and no GPU-resident loader), data parallel skipped
# on one GPU. Each framework's rungs run in as few processes as its settings allow (JAX 1-4 and 5-6,
# TF 1-6, PyTorch 1-4), so imports, GPU set-up and compiled steps carry over. Before the timed windows
# of every IO and FULL mode the benchmark drains what the loader read ahead. Timed windows hold at
# least 5 steps (a slow lowmem rung's window is ~4 s); the ladder prints its schedule first (its
# processes, each rung's modes and estimated seconds, the total, and the rungs the budget is expected
# to stop if the total is over it), trims the fast rungs' windows to fit, and stops at DEADLINE
# seconds after this script starts (BUDGET at most). The set-up (TF unpacked, the DALI TF plugin, the
# data) is setup.sh's, in a call before on the same warm machine, so the ladder has this whole call.
# A later call with RESUME=<this call's jsonl, copied into the checkout> runs only the rungs this one
# did not finish. Writes 4 files under $OUT: timeline.txt, ladder_$CONFIG.{jsonl,log,png}.
#
# On nvidia-h200, in the call after experiments/ladder_h200/setup.sh's, $OUT set:
#   bash experiments/ladder_h200/run.sh
# The same commands on CPU with a tiny config (a smoke test, ~2.5 min on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_tiny BUDGET=150 bash experiments/ladder_h200/run.sh
set -uo pipefail
[[ -n ${OUT:-} ]] || { echo "error: ${0##*/}: set OUT to the results folder, e.g. OUT=results/ladder_h200 bash experiments/ladder_h200/run.sh (on a GPU machine after bash experiments/ladder_h200/setup.sh; on a CPU add CONFIG=cpu_tiny BUDGET=150)" >&2; exit 2; }
CONFIG=${CONFIG:-short_opt}
PY=${PY:-python3}
BUDGET=${BUDGET:-570}
DEADLINE=${DEADLINE:-585}
RESUME=${RESUME:-}
mkdir -p "$OUT"
if [[ $CONFIG == short_opt ]]; then
  command -v nvidia-smi >/dev/null || { echo "error: ${0##*/} needs an NVIDIA GPU (nvidia-smi not found)" >&2; exit 2; }
  for f in /tmp/tf-env.sh data/train_256_Nbody.npy data/val_128.h5; do
    [[ -e $f ]] || { echo "error: $f not found: run bash experiments/ladder_h200/setup.sh in a call before this one" >&2; exit 2; }
  done
  export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6  # as scripts/gpu/common.sh
  source /tmp/tf-env.sh
  export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
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
