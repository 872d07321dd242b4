#!/usr/bin/env bash
# On nvidia-h200 (DALI staged in /tmp/site, see ../shared/device/README.md): the comparison table of
# issue 6 in one call: JAX and PyTorch rows for IO, SYNTHETIC and FULL on the same loader; TF is not
# installed there and gets a note. Results: $OUT/compare.jsonl, $OUT/compare.log
set -uo pipefail
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
mkdir -p data
python3 -m shared_data.generate --out data/train_256.h5 --size 256 --seed 1 --npy --if-missing > $OUT/generate.log 2>&1
python3 -m shared_data.generate --out data/val_128.h5 --size 128 --seed 2 --npy --if-missing >> $OUT/generate.log 2>&1
python3 -m compare.compare --config short_opt --out $OUT/compare.jsonl --data_loader_config dali-npy --set dali_threads=16 2>&1 | tee $OUT/compare.log
python3 -m compare.compare --config short_opt --frameworks jax --out $OUT/compare.jsonl --data_loader_config device 2>&1 | tee -a $OUT/compare.log
