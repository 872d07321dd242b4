#!/usr/bin/env bash
# What the first calls left: the MirroredStrategy and DALI GPU checks, TF's GPU-resident dali-device
# (pipelines run from Python, crops cut on the GPU) beside TF's and JAX's SYNTHETIC and JAX's
# dali-device in one call, and the trainer rows of dali-h5 and dali-device. Needs TF and DALI staged
# (/tmp/tf-env.sh, /tmp/site) and the DALI TF plugin in .daltf/. Results under $OUT (~7 min).
#   bash experiments/tf_on_h200/followup.sh
set -uo pipefail
source experiments/tf_on_h200/env.sh
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_tf.py -k "dali or mirrored" 2>&1 \
  | tee $OUT/gpu_check_tf_followup.log | tail -4
bench() {
  timeout 100 python3 -m dlas_compare.benchmark --config short_opt --warmup 5 --steps 40 --windows 3 --window_sec 2 \
    --out $OUT/compare_followup.jsonl "$@" 2>&1 | grep -v "^W0000\|^I0000" | tail -3
}
bench --framework tf --mode synthetic --label "tf synthetic"
bench --framework tf --mode io full --data_loader_config dali-device --label "tf dali-device"
bench --framework jax --mode synthetic --label "jax synthetic"
bench --framework jax --mode full --data_loader_config dali-device --label "jax dali-device"
timeout 120 python3 experiments/tf_on_h200/trainers.py --config short --epochs 2 --nsamples 1024 --parallel 2 \
  --rows "bf16 dali-h5" "bf16 dali-device" --set "unet_widths=[16,32,64,64,64,64]" --timeout 110 \
  --out $OUT/trainers_followup.jsonl 2>&1 | tail -4
python3 experiments/tf_on_h200/table.py $OUT/compare_followup.jsonl | tee $OUT/table_followup.txt
