#!/usr/bin/env bash
# The ladder's set-up on the GPU machine, in a call of its own before run.sh's (the machine stays warm
# between calls; /tmp and the checkout's ignored data/ are kept): the device record and the data
# (scripts/gpu/common.sh: data/train_256.h5 with its .npy twins, data/val_128.h5; ~100 s the first
# time), TensorFlow unpacked from its staged parts (.tf/last/tf-on-device.sh, once per machine), the
# DALI TF plugin carried in .daltf/ beside the staged DALI, TF's and Keras' versions, and /dev/shm
# grown to 16 GiB where it is smaller (the lowmem rungs' worker processes hand their batches over in
# shared memory: 600 MB a batch, num_data_workers + 1 batches). Writes 3 files under $OUT: device.txt,
# setup.log, tf_unpack.log.
#
# On nvidia-h200, after DALI (.dali/p0-p2) and TF (.tf/p0-p5) are staged by their calls
# (../shared/device/README.md), in one call that carries [".tf/last", ".daltf"], $OUT set:
#   bash experiments/ladder_h200/setup.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site  # DALI, staged by ../shared/device/stage-dali.sh
source scripts/gpu/common.sh  # a GPU (else one error line), the environment, device record, data
if [[ ! -f /tmp/tf-env.sh ]]; then
  bash .tf/last/tf-on-device.sh > "$OUT/tf_unpack.log" 2>&1 || { tail -5 "$OUT/tf_unpack.log"; exit 1; }
fi
source /tmp/tf-env.sh
export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
bash experiments/tf_on_h200/plugin.sh  # the DALI TF plugin carried in .daltf/
python3 -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)" | tee -a "$OUT/device.txt"
free_gib=$(( $(stat -f -c '%a * %S' /dev/shm) / 2**30 ))
if (( free_gib < 16 )); then
  mount -o remount,size=16G /dev/shm && df -h /dev/shm | tail -1 | sed 's/^/shared memory grown: /' | tee -a "$OUT/device.txt"
fi
echo "ladder set-up done in ${SECONDS} s; next call: bash experiments/ladder_h200/run.sh"
