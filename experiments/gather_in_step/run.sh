#!/usr/bin/env bash
# The `device` loader's gather inside the compiled train step, on one H200, in one call (~5 min):
# short_opt (the full net, 64^3 crops, batch 64, bf16), SYNTHETIC, IO and FULL with the `device`
# loader in TensorFlow (first, from an empty XLA cache: its SYNTHETIC compile_sec is the cold compile)
# and in JAX, the FULL / SYNTHETIC ratios from the same call; then where each framework's cold
# compile goes (XLA's own timers of its GPU compiler, from an empty cache). Needs TF staged
# (../shared/device/README.md: carry .tf/last); no DALI. Results under $OUT, the table printed last.
#   bash experiments/gather_in_step/run.sh
# On CPU (a smoke test of the recipe, ~2 min on 2 cores): OUT=/tmp/out CONFIG=cpu_tiny PY=.venv/bin/python bash experiments/gather_in_step/run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short_opt}
PY=${PY:-python3}
mkdir -p "$OUT" /tmp/gather_in_step
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
DATA=()
if [[ $CONFIG == short_opt ]]; then
  source scripts/gpu/common.sh  # the device record and data/train_256_filtered.h5, data/val_128_filtered.h5
  if [[ ! -f /tmp/tf-env.sh ]]; then
    bash .tf/last/tf-on-device.sh > "$OUT/tf_unpack.log" 2>&1 || { tail -5 "$OUT/tf_unpack.log"; exit 1; }
  fi
  source /tmp/tf-env.sh
  export TF_FORCE_GPU_ALLOW_GROWTH=true
  $PY -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)" | tee -a "$OUT/device.txt"
  DATA=(--set "train_path=data/train_256$DATA_SUFFIX.h5" --set "val_path=data/val_128$DATA_SUFFIX.h5")
  STEPS=(--warmup 5 --steps 40 --windows 3 --window_sec 2)
else
  for part in train:1:32 val:2:24; do
    IFS=: read -r name seed size <<< "$part"
    $PY -m shared_data.data.generate --out "/tmp/gather_in_step/${name}.h5" --size "$size" --seed "$seed" \
      --chunk 8 --if-missing > /dev/null
  done
  DATA=(--set train_path=/tmp/gather_in_step/train.h5 --set val_path=/tmp/gather_in_step/val.h5)
  STEPS=(--warmup 2 --steps 3 --windows 2)
fi
CACHE=$($PY -c "from shared_data.core import config as c; print(c.load_config('$CONFIG').xla_cache_dir)")
rm -rf "$CACHE" "$OUT/compare.jsonl"
for fw in tf jax; do
  timeout 200 $PY -m dlas_compare.benchmark --framework $fw --config "$CONFIG" "${DATA[@]}" --mode synthetic io full \
    --data_loader_config device "${STEPS[@]}" --out "$OUT/compare.jsonl" 2>&1 | grep -v "^W0000\|^I0000" | tail -4
done
# Where a cold compile goes: XLA's scoped timers at VLOG 1 ("<what> time: 2.1 s (2100000 us)"; the
# GPU compiler's HLO passes hold the convolution autotuning, its backend the code generation), one
# SYNTHETIC compile per framework from an empty cache; the timers of 0.5 s or more are printed.
for fw in tf jax; do
  rm -rf "$CACHE"
  TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_MAX_VLOG_LEVEL=1 timeout 150 $PY -m dlas_compare.benchmark --framework $fw \
    --config "$CONFIG" "${DATA[@]}" --mode synthetic --warmup 1 --steps 2 --windows 1 --out "$OUT/compile_timers.jsonl" 2>&1 \
    | grep " time: " > "$OUT/compile_timers_$fw.log"
  echo "== $fw: XLA's compile timers of 0.5 s or more"
  sed -nE 's/^[^]]*\] (.*) time: .*\(([0-9]+) us\).*/\2 \1/p' "$OUT/compile_timers_$fw.log" \
    | awk '$1 >= 500000 {printf "%8.2f s  %s\n", $1 / 1e6, substr($0, index($0, " ") + 1)}' | head -25
done
$PY experiments/tf_on_h200/table.py "$OUT/compare.jsonl" | tee "$OUT/table.txt"
