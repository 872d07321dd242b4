#!/usr/bin/env bash
# On nvidia-h200 (DALI staged in /tmp/site): data, GPU correctness checks, compute benchmarks.
# Results: $OUT/compute.jsonl, $OUT/compute.log
set -uo pipefail
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.8
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee $OUT/device.txt
python3 -c "import jax, flax, optax, torch, numpy, h5py, nvidia.dali as d; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, 'dali', d.__version__, 'numpy', numpy.__version__, jax.devices())" | tee -a $OUT/device.txt
mkdir -p data
( time python3 -m shared_data.data.generate --out data/train_256.h5 --size 256 --seed 1 --npy --if-missing ) 2>&1 | tee $OUT/generate.log
python3 -m shared_data.data.generate --out data/val_128.h5 --size 128 --seed 2 --npy --if-missing 2>&1 | tee -a $OUT/generate.log
python3 -m pytest -q -m gpu tests/test_gpu_jax.py 2>&1 | tee $OUT/check_gpu.log
python3 experiments/h200_step_speed/suites.py h200-compute --out $OUT/compute.jsonl --timeout 240 2>&1 | tee $OUT/compute.log
