#!/usr/bin/env bash
# TensorFlow's own runtime on one H200, first look: the GPU checks (tests marked gpu), where the
# device loader's time goes (device_loader.py), and TF's DALI loaders through the TF plugin on the
# GPU. Needs TF and DALI staged on the machine (/tmp/tf-env.sh, /tmp/site) and the DALI TF plugin
# built against the CUDA build of TF carried in .daltf/. Results under $OUT.
#   bash experiments/tf_on_h200/diagnose.sh
set -uo pipefail
source scripts/gpu/common.sh
source /tmp/tf-env.sh
export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
bash experiments/tf_on_h200/plugin.sh
python3 -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__, tf.config.list_physical_devices('GPU'))" | tee -a $OUT/device.txt
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_tf.py 2>&1 | tee $OUT/gpu_check_tf.log | tail -25
timeout 170 python3 experiments/tf_on_h200/device_loader.py --config short_opt --steps 30 --out $OUT/device_loader.jsonl 2>&1 \
  | grep -v "^W0000\|^I0000" | tee $OUT/device_loader.log | tail -20
for loader in dali-npy dali-device; do
  timeout 110 python3 -m compare.benchmark --framework tf --config short_opt --mode full --data_loader_config $loader \
    --warmup 3 --steps 40 --windows 3 --window_sec 2 --label "tf full $loader" --out $OUT/bench_tf.jsonl 2>&1 \
    | grep -v "^W0000\|^I0000" | tail -4
done
