#!/usr/bin/env bash
# TensorFlow's train step on the GPU without TensorFlow: the exported StableHLO of short_opt (bf16 and
# fp32, batch 64; made on a machine with TF into experiments/h200_tf_xla/exports/, which git ignores) checked against JAX's
# first step, then timed SYNTHETIC beside the JAX row. JAX only, no DALI, no data. Results under $OUT.
#   bash experiments/h200_tf_xla/run.sh        (on nvidia-h200, from the checkout's root)
# The exports first, on a machine with TensorFlow (from the checkout's root), then copy the working tree here:
#   python experiments/h200_tf_xla/export_hlo.py --config short_opt --enable_amp --global_batch_size 64
#   python experiments/h200_tf_xla/export_hlo.py --config short_opt --no-enable_amp --global_batch_size 64
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tf_xla}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__)" | tee -a "$OUT/device.txt"
for amp in --enable_amp --no-enable_amp; do
  python3 experiments/h200_tf_xla/check_tf_xla.py --config short_opt "$amp" --out "$OUT/check_tf_xla.jsonl" 2>&1 | tee -a "$OUT/check_tf_xla.log"
done
for amp in --enable_amp --no-enable_amp; do
  python3 experiments/h200_tf_xla/tf_xla.py --config short_opt "$amp" --out "$OUT/tf_xla_synthetic.jsonl" 2>&1 | tee -a "$OUT/tf_xla_synthetic.log"
  python3 -m dlas_compare.benchmark --framework jax --mode synthetic --config short_opt "$amp" --out "$OUT/tf_xla_synthetic.jsonl" 2>&1 | tee -a "$OUT/tf_xla_synthetic.log"
done
