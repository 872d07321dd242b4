#!/usr/bin/env bash
# The closing record of this study, in one call of ~4 minutes: JAX, the PyTorch reference and TF's own
# runtime, SYNTHETIC bf16 at batch 64 on short_opt, each framework's baseline forms beside the chosen
# combination (results/best.json, the forms short_opt carries), every compile cold, all records in one
# file ($OUT/final.jsonl), the table printed last.
#
# On nvidia-h200 with TF staged (.tf/p0-p5 by their calls), in a call that carries [".tf/last"], $OUT set:
#   bash experiments/h200_mfu/final.sh
# The same on CPU (a smoke test, ~1 min; TORCH=0 where PyTorch is not installed):
#   OUT=/tmp/final CONFIG=cpu_tiny PY=/work/main/.venv/bin/python TORCH=0 bash experiments/h200_mfu/final.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short_opt}
PY=${PY:-python3}
TORCH=${TORCH:-1}
STUDY=experiments/h200_mfu
WINDOWS=(--warmup 3 --steps 30 --windows 3)
SETS=(--set xla_cache_dir=/tmp/h200_mfu_final_xla)
mkdir -p "$OUT"
if [[ $CONFIG == short_opt ]]; then
  export PYTHONPATH=.:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/final_device.txt"
  [[ -f /tmp/tf-env.sh ]] || bash .tf/last/tf-on-device.sh > /tmp/tf_unpack.log 2>&1 || { tail -5 /tmp/tf_unpack.log; exit 1; }
else
  export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
  SETS=(--set xla_cache_dir=/tmp/h200_mfu_final_xla_cpu --set global_batch_size=2)
  WINDOWS=(--warmup 1 --steps 2 --windows 2)
fi
rm -rf /tmp/h200_mfu_final_xla /tmp/h200_mfu_final_xla_cpu  # every compile in this call is a cold one
quiet() { grep --line-buffered -v "^W0000\|^I0000\|^WARNING: All log messages"; }
levers() { $PY $STUDY/levers.py run --config "$CONFIG" "${SETS[@]}" "${WINDOWS[@]}" --best $STUDY/results/best.json \
  --variants baseline best --out "$OUT/final.jsonl" "$@" 2>&1 | quiet | grep "^\[levers\]\|^error"; }
levers --framework jax
if [[ $TORCH == 1 ]]; then
  $PY -m dlas_compare.benchmark --framework torch --mode synthetic --config "$CONFIG" "${SETS[@]}" "${WINDOWS[@]}" \
    --label "torch reference" --out "$OUT/final.jsonl" 2>&1 | quiet | tail -1
fi
(
  if [[ $CONFIG == short_opt ]]; then
    source /tmp/tf-env.sh
    export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
    $PY -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)" | tee -a "$OUT/final_device.txt"
  fi
  levers --framework tf
)
$PY $STUDY/levers.py table "$OUT/final.jsonl" | tee "$OUT/final_table.txt"
