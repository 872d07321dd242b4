#!/usr/bin/env bash
# TensorFlow's own runtime on one H200, first look: the GPU checks (tests marked gpu), where the
# device loader's time goes (device_loader.py), and every TF trainer path (trainers.py). Needs TF and DALI staged on the machine (/tmp/tf-env.sh, /tmp/site) and the DALI TF plugin
# built against the CUDA build of TF carried in .daltf/. Results under $OUT.
#   bash experiments/tf_on_h200/diagnose.sh
set -uo pipefail
export PYTHONPATH=/tmp/site  # DALI, staged by experiments/gpu_machine/stage_dali.sh
source scripts/gpu/common.sh
source /tmp/tf-env.sh
export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
bash experiments/tf_on_h200/plugin.sh
python3 -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__, tf.config.list_physical_devices('GPU'))" | tee -a $OUT/device.txt
timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_tf.py 2>&1 | tee $OUT/gpu_check_tf.log | tail -25
timeout 150 python3 experiments/tf_on_h200/device_loader.py --config short_opt --steps 30 --out $OUT/device_loader.jsonl 2>&1 \
  | grep -v "^W0000\|^I0000" | tee $OUT/device_loader.log | tail -20
# every trainer path, on a narrow net (compiles fast; the full net's speed is run.sh's job)
timeout 170 python3 experiments/tf_on_h200/trainers.py --config short --epochs 2 --nsamples 1024 --parallel 4 \
  --set "unet_widths=[16,32,64,64,64,64]" --timeout 160 --out $OUT/trainers.jsonl 2>&1 | tee $OUT/trainers.log | tail -15
