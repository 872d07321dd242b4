#!/usr/bin/env bash
# TensorFlow's train step on the GPU without TensorFlow: the exported StableHLO of short_opt (bf16 and
# fp32, batch 64; made on a machine with TF, committed under exports/tf_xla/) checked against JAX's
# first step, then timed SYNTHETIC beside the JAX row. JAX only, no DALI, no data. Results under $OUT.
#   bash experiments/h200_tf_xla/run.sh        (on nvidia-h200, from the checkout's root)
# The exports, on a machine with TensorFlow (from the checkout's root):
#   python -m tf_impl.export_hlo --config short_opt --enable_amp --global_batch_size 64
#   python -m tf_impl.export_hlo --config short_opt --no-enable_amp --global_batch_size 64
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tf_xla}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__)" | tee -a "$OUT/device.txt"
for amp in --enable_amp --no-enable_amp; do
  python3 scripts/gpu/check_tf_xla.py --config short_opt "$amp" --out "$OUT/check_tf_xla.jsonl" 2>&1 | tee -a "$OUT/check_tf_xla.log"
done
for amp in --enable_amp --no-enable_amp; do
  for fw in tf-xla jax; do
    python3 -m compare.benchmark --framework "$fw" --mode synthetic --config short_opt "$amp" --out "$OUT/tf_xla_synthetic.jsonl" 2>&1 | tee -a "$OUT/tf_xla_synthetic.log"
  done
done
