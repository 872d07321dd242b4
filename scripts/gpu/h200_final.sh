#!/usr/bin/env bash
# On nvidia-h200 (DALI staged in /tmp/site): the recorded comparison (PyTorch reference vs JAX,
# same call) and the 200-step bf16-vs-fp32 loss curves. Results under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
python3 -c "import jax, flax, optax, torch, nvidia.dali as d; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, 'dali', d.__version__)" | tee -a $OUT/device.txt
mkdir -p data
python3 -m shared_data.generate --out data/train_256.h5 --size 256 --seed 1 --npy --if-missing > $OUT/generate.log 2>&1
python3 -m shared_data.generate --out data/val_128.h5 --size 128 --seed 2 --npy --if-missing >> $OUT/generate.log 2>&1
python3 -m compare.suite h200-final --out $OUT/final.jsonl --timeout 150 2>&1 | tee $OUT/final.log
for p in fp32 bf16; do
  amp=(); [[ $p == bf16 ]] && amp=(--enable_amp)
  python3 -m jax_impl.train --config short --data_loader_config device --Nsamples 1280 --num_epochs 10 "${amp[@]}" \
    --set progress_bar=false --workdir /tmp/curve_$p --overwrite > /tmp/curve_$p.log 2>&1
  cp /tmp/curve_$p/metrics.jsonl $OUT/curve_$p.jsonl; tail -4 /tmp/curve_$p.log
done
