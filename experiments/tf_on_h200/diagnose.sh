#!/usr/bin/env bash
# TensorFlow's own runtime on one H200, first look: the GPU checks (tests marked gpu), where the
# device loader's time goes (device_loader.py), and every TF trainer path (trainers.py). Needs TF and DALI staged on the machine (/tmp/tf-env.sh, /tmp/site) and the DALI TF plugin
# built against the CUDA build of TF carried in .daltf/. Results under $OUT.
#   bash experiments/tf_on_h200/diagnose.sh
set -uo pipefail
source experiments/tf_on_h200/env.sh
timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_tf.py 2>&1 | tee $OUT/gpu_check_tf.log | tail -25
timeout 150 python3 experiments/tf_on_h200/device_loader.py --config short_opt --steps 30 --out $OUT/device_loader.jsonl 2>&1 \
  | grep -v "^W0000\|^I0000" | tee $OUT/device_loader.log | tail -20
# every trainer path, on a narrow net (compiles fast; the full net's speed is run.sh's job)
timeout 170 python3 experiments/tf_on_h200/trainers.py --config short --epochs 2 --nsamples 1024 --parallel 4 \
  --set "unet_widths=[16,32,64,64,64,64]" --timeout 160 --out $OUT/trainers.jsonl 2>&1 | tee $OUT/trainers.log | tail -15
