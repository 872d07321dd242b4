#!/usr/bin/env bash
# TensorFlow's own runtime beside JAX and the PyTorch reference on one H200, in one call (~8 min):
# short_opt (the full 117 M-parameter net, 64^3 crops, batch 64, bf16). SYNTHETIC for the three
# frameworks (TF first, with an empty XLA cache: its compile_sec is the cold compile), then IO and
# FULL for TF's device loader and its DALI loaders through the TF plugin, and JAX's device and
# dali-device loaders for the ratios. Needs TF and DALI staged on the machine and the DALI TF plugin
# in .daltf/ (diagnose.sh says how). Results under $OUT; the table is printed last. The GPU check
# (tests/test_gpu_tf.py) is check.sh's call.
#   bash experiments/tf_on_h200/run.sh
set -uo pipefail
source experiments/tf_on_h200/env.sh
rm -rf .cache/xla
bench() {
  timeout 150 python3 -m dlas_compare.benchmark --config short_opt --warmup 5 --steps 40 --windows 3 --window_sec 2 \
    --out $OUT/compare.jsonl "$@" 2>&1 | grep -v "^W0000\|^I0000" | tail -3
}
bench --framework tf --mode synthetic --label "tf synthetic"
bench --framework jax --mode synthetic --label "jax synthetic"
bench --framework torch --mode synthetic --label "torch synthetic"
bench --framework tf --mode io full --data_loader_config device --label "tf device"
bench --framework tf --mode io full --data_loader_config dali-device --label "tf dali-device"
bench --framework jax --mode io full --data_loader_config device --label "jax device"
bench --framework jax --mode io full --data_loader_config dali-device --label "jax dali-device"
python3 experiments/tf_on_h200/table.py $OUT/compare.jsonl | tee $OUT/table.txt
