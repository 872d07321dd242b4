#!/usr/bin/env bash
# TensorFlow's cold train-step compile against XLA's autotuning flags, one H200, one call (~5 min):
# for each variant of XLA_FLAGS (added to the kit's own), an empty XLA cache, then the benchmark's
# SYNTHETIC mode on config `quality` (the step the time-to-quality runs compile: short_opt's net with
# the Fourier-space L1) and on `short_opt`: its compile seconds and its step, so that a flag that
# shortens the compile and slows the step shows both. Needs TF staged on the machine (/tmp/tf-env.sh,
# or its unpacker .tf/last/tf-on-device.sh carried with the call); no data, no DALI. Results under
# $OUT (compare.jsonl, run.log, device.txt, table.txt), the table printed last; the exit status is the
# last failed variant's (0 when all ran).
#   bash experiments/tf_compile_flags/run.sh
# VARIANTS: ';'-separated NAME|FLAGS entries (default below). CONFIGS: the configs (default
# "quality short_opt"). On CPU, a smoke test (the flags parse, the records and the table; its times say
# nothing about the H200; ~3 min on 2 cores):
#   OUT=/tmp/out CONFIGS=cpu_tiny PY=.venv/bin/python bash experiments/tf_compile_flags/run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
PY=${PY:-python3}
CONFIGS=${CONFIGS:-quality short_opt}
VARIANTS=${VARIANTS:-"default|;fusion_autotuner_off|--xla_gpu_experimental_enable_fusion_autotuner=false;autotune_level3|--xla_gpu_autotune_level=3;both|--xla_gpu_experimental_enable_fusion_autotuner=false --xla_gpu_autotune_level=3"}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
STEPS=(--warmup 2 --steps 3 --windows 2)
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
  if [[ ! -f /tmp/tf-env.sh ]]; then
    bash .tf/last/tf-on-device.sh > "$OUT/tf_unpack.log" 2>&1 || { tail -5 "$OUT/tf_unpack.log"; exit 1; }
  fi
  source /tmp/tf-env.sh
  export TF_FORCE_GPU_ALLOW_GROWTH=true
  STEPS=(--warmup 5 --steps 40 --windows 3 --window_sec 2)
fi
$PY -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)" | tee -a "$OUT/device.txt"
echo "XLA_FLAGS (before the variants') = ${XLA_FLAGS:-}" | tee -a "$OUT/device.txt"
BASE_FLAGS=${XLA_FLAGS:-}
rm -f "$OUT/compare.jsonl"
IFS=';' read -ra variants <<< "$VARIANTS"
START=$SECONDS rc=0
for config in $CONFIGS; do
  CACHE=$($PY -c "from shared_data.core import config as c; print(c.load_config('$config').xla_cache_dir)")
  for variant in "${variants[@]}"; do
    [[ $variant == *"|"* ]] || { echo "error: VARIANTS entry '$variant': expected NAME|FLAGS" >&2; exit 2; }
    name=${variant%%|*}
    flags=${variant#*|}
    left=$((540 - (SECONDS - START)))  # a GPU call ends at 600 s: the table must be written before
    if ((left < 60)); then echo "== $config $name: skipped (${left} s left of the call)" | tee -a "$OUT/run.log"; rc=1; continue; fi
    rm -rf "$CACHE"
    echo "== $config $name: $flags ($(date -u +%H:%M:%S))" | tee -a "$OUT/run.log"
    XLA_FLAGS="$BASE_FLAGS $flags" timeout $((left < 240 ? left : 240)) $PY -m dlas_compare.benchmark --framework tf \
      --config "$config" --mode synthetic "${STEPS[@]}" --label "$config $name" --out "$OUT/compare.jsonl" \
      >> "$OUT/run.log" 2>&1 \
      || { rc=$?; echo "   failed (rc $rc): $(grep -v '^W0000\|^I0000' "$OUT/run.log" | tail -1)" | tee -a "$OUT/run.log"; }
  done
done
[[ -s $OUT/compare.jsonl ]] || { echo "error: no variant produced a record (run.log says why)" >&2; exit 1; }
$PY -c "
import json, sys
from dlas_compare.benchmark import table
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(table(records))
" "$OUT/compare.jsonl" | tee "$OUT/table.txt"
exit $rc
