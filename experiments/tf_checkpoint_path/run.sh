#!/usr/bin/env bash
# TensorFlow's checkpoint save on the training path, one GPU, one call (~1-2 min once TensorFlow is on
# the machine): probe.py for config `quality` (and CONFIGS), records and table under $OUT.
#   bash experiments/tf_checkpoint_path/run.sh
# The same on CPU (a smoke test; a CPU's host copies are shallow, so its seconds say nothing of a GPU's):
#   OUT=/tmp/o PY=.venv/bin/python CONFIGS=cpu_tiny bash experiments/tf_checkpoint_path/run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
PY=${PY:-python3}
[[ -f /tmp/tf-env.sh ]] && source /tmp/tf-env.sh
export PYTHONPATH=${PYTHONPATH:-.}:. TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1 || echo "no GPU" > "$OUT/device.txt"
for config in ${CONFIGS:-quality}; do
  $PY experiments/tf_checkpoint_path/probe.py --config "$config" --out "$OUT/$config.jsonl" 2>"$OUT/$config.log" | tail -5
done
