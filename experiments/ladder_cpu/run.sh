#!/usr/bin/env bash
# The tutorial's ladder on this 2-core CPU machine: TensorFlow and JAX on cpu_default (32^3 crops,
# batch 8, a 5-level net), rungs 1-5 (no GPU: the GPU-resident and data-parallel rungs are skipped).
# About 5 minutes. Needs data/train_128.h5 and data/val_64.h5 with their .npy twins:
#   python -m shared_data.data.generate --out data/train_128.h5 --size 128 --seed 1 --npy
#   python -m shared_data.data.generate --out data/val_64.h5 --size 64 --seed 2 --npy
#   bash experiments/ladder_cpu/run.sh        (from the checkout's root, environment active)
set -euo pipefail
res=experiments/ladder_cpu/results
mkdir -p $res
export PYTHONPATH=. TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
python -m dlas_compare.ladder --frameworks tf jax --config cpu_default \
  --warmup 3 --steps 20 --windows 5 --window_sec 1 \
  --out $res/ladder_cpu_default.jsonl --figure $res/ladder_cpu_default.png 2>&1 | tee $res/ladder_cpu_default.log
