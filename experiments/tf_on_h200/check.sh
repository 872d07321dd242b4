#!/usr/bin/env bash
# The TF GPU check in one call (~3 min): tests/test_gpu_tf.py on the GPU (every up-conv form, the
# folded pad among them, and the down-convs against the float64 references, eager and under XLA;
# mixed precision; one train step against the CPU's; the loaders bit for bit against the NumPy
# reader; MirroredStrategy over two logical GPUs against one replica). Needs TF and DALI staged and
# the DALI TF plugin in .daltf/, as run.sh. Results under $OUT (gpu_check_tf.log).
#   bash experiments/tf_on_h200/check.sh
set -uo pipefail
source experiments/tf_on_h200/env.sh
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_tf.py 2>&1 | tee $OUT/gpu_check_tf.log | tail -4
