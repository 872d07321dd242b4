#!/usr/bin/env bash
# The README's first command: set up, generate the default dataset if missing, train the
# cpu_default config with TensorFlow and with JAX, and print the two side by side.
# Re-running continues the runs from their checkpoints (--resume); pass --overwrite to start again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
PY=.venv/bin/python
export TF_CPP_MIN_LOG_LEVEL=2
$PY -m shared_data.data.generate --out data/train_128.h5 --size 128 --seed 1 --npy --if-missing
$PY -m shared_data.data.generate --out data/val_64.h5 --size 64 --seed 2 --npy --if-missing
mode=--resume
[[ "${1:-}" == "--overwrite" ]] && mode=--overwrite
$PY -m tf_impl.train --config cpu_default $mode --save_weights runs/cpu_default/tf/weights.npz
$PY -m jax_impl.train --config cpu_default $mode --save_weights runs/cpu_default/jax/weights.npz
$PY -m dlas_compare.plots --config cpu_default
$PY -m dlas_compare.summary --config cpu_default
