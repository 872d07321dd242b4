#!/usr/bin/env bash
# TensorFlow's own runtime beside JAX and the PyTorch reference on one H200, in one call (~8 min):
# short_opt (the full 117 M-parameter net, 64^3 crops, batch 64, bf16). SYNTHETIC for the three
# frameworks (TF first, with an empty XLA cache: its compile_sec is the cold compile), then IO and
# FULL for each of LOADERS (default "device dali-device") in TF, then in JAX, for the ratios. DALI's
# loaders need TF and DALI staged on the machine and the DALI TF plugin in .daltf/ (diagnose.sh says
# how); LOADERS=device needs TF staged only. Results under $OUT; the table is printed last. The GPU
# check (tests/test_gpu_tf.py) is check.sh's call.
#   bash experiments/tf_on_h200/run.sh
#   LOADERS=device bash experiments/tf_on_h200/run.sh     # the kit's SYNTHETIC and FULL, no DALI
# The same on CPU with a tiny config (a smoke test, ~2 min on 2 cores; TORCH=0 without PyTorch):
#   OUT=/tmp/o CONFIG=cpu_tiny PY=.venv/bin/python TORCH=0 LOADERS=device bash experiments/tf_on_h200/run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short_opt}
LOADERS=${LOADERS:-device dali-device}
TORCH=${TORCH:-1}
PY=${PY:-python3}
SETS=()
ROWS=(--warmup 5 --steps 40 --windows 3 --window_sec 2)
if [[ $CONFIG == short_opt ]]; then
  source experiments/tf_on_h200/env.sh
else
  mkdir -p "$OUT" /tmp/tf_on_h200_cpu
  export PYTHONPATH=. TF_CPP_MIN_LOG_LEVEL=2
  for part in train:1 val:2; do
    [[ -f /tmp/tf_on_h200_cpu/${part%:*}.h5 ]] || $PY -m shared_data.data.generate --out /tmp/tf_on_h200_cpu/${part%:*}.h5 \
      --size 32 --seed "${part#*:}" --chunk 16 > /dev/null
  done
  SETS=(--set train_path=/tmp/tf_on_h200_cpu/train.h5 --set val_path=/tmp/tf_on_h200_cpu/val.h5 --set global_batch_size=2)
  ROWS=(--warmup 1 --steps 2 --windows 2 --window_sec 0.1)
fi
rm -rf .cache/xla
bench() {
  timeout 150 $PY -m dlas_compare.benchmark --config "$CONFIG" "${SETS[@]}" "${ROWS[@]}" \
    --out $OUT/compare.jsonl "$@" 2>&1 | grep -v "^W0000\|^I0000" | tail -3
}
bench --framework tf --mode synthetic --label "tf synthetic"
bench --framework jax --mode synthetic --label "jax synthetic"
[[ $TORCH == 0 ]] || bench --framework torch --mode synthetic --label "torch synthetic"
for fw in tf jax; do
  for loader in $LOADERS; do
    bench --framework $fw --mode io full --data_loader_config "$loader" --label "$fw $loader"
  done
done
$PY experiments/tf_on_h200/table.py $OUT/compare.jsonl | tee $OUT/table.txt
