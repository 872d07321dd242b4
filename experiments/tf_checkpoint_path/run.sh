#!/usr/bin/env bash
# TensorFlow's checkpoint save on the training path, one GPU, one call (~2-3 min once TensorFlow is on
# the machine): probe.py for config `quality` (and CONFIGS), each variant in VARIANTS in its own process
# (TensorFlow's host memory pools live as long as the process), SAVES saves each ("before s": the
# pre-grow's or the round trip's seconds before them); records in
# $OUT/CONFIG.jsonl, logs in $OUT/CONFIG.log, the table last.
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
rc=0
for config in ${CONFIGS:-quality}; do
  rm -f "$OUT/$config.jsonl"
  for variant in ${VARIANTS:-copy alias pregrow start_host start_device numpy copy}; do
    $PY experiments/tf_checkpoint_path/probe.py --config "$config" --variant "$variant" --saves "${SAVES:-6}" \
      --out "$OUT/$config.jsonl" 2>>"$OUT/$config.log" >/dev/null || { rc=1; tail -3 "$OUT/$config.log"; }
  done
done
$PY - "$OUT" ${CONFIGS:-quality} <<'PY'
import json, sys
from pathlib import Path
print(f"{'config':10}{'variant':13}{'GB':>6}{'before s':>11}  {'seconds on the path, saves 1..n':<44}{'traces':>7}{'GB/s (last)':>12}")
for config in sys.argv[2:]:
    for line in Path(sys.argv[1], f"{config}.jsonl").read_text().splitlines():
        r = json.loads(line)
        s = r["seconds"]
        before = r.get("grow_sec", r.get("round_trip_sec"))
        before = "-" if before is None else f"{before:.3f}"
        print(f"{config:10}{r['variant']:13}{r['state_gb']:6.2f}{before:>11}  {' '.join(f'{x:.3f}' for x in s):<44}"
              f"{str(r.get('traces', '-')):>7}{r['state_gb'] / s[-1]:12.1f}")
PY
exit $rc
