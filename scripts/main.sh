#!/usr/bin/env bash
# The README's first command: set up, generate the default dataset if missing, train the
# cpu_default config with TensorFlow and with JAX, and print the two side by side.
usage="usage: bash scripts/main.sh [--overwrite]
Set up .venv (scripts/setup.sh), generate data/train_128.h5 and data/val_64.h5 if missing, train the
cpu_default config with TensorFlow and with JAX (runs/cpu_default/{tf,jax}), write the figures and
print the two runs side by side (CPU; a few minutes on 2 cores).
  (no argument)  continue the runs from their checkpoints (--resume); a finished run trains nothing
  --overwrite    delete the two runs' checkpoints and train again
  -h, --help     this message"
mode=--resume
for arg in "$@"; do
  case "$arg" in
    -h | --help) echo "$usage"; exit 0 ;;
    --overwrite) mode=--overwrite ;;
    *) echo "error: scripts/main.sh: unknown argument '$arg' (it takes only --overwrite; --help says more)" >&2; exit 2 ;;
  esac
done
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
PY=.venv/bin/python
export TF_CPP_MIN_LOG_LEVEL=2
$PY -m shared_data.data.generate --out data/train_128.h5 --size 128 --seed 1 --npy --if-missing
$PY -m shared_data.data.generate --out data/val_64.h5 --size 64 --seed 2 --npy --if-missing
$PY -m tf_impl.train --config cpu_default $mode --save_weights runs/cpu_default/tf/weights.npz
$PY -m jax_impl.train --config cpu_default $mode --save_weights runs/cpu_default/jax/weights.npz
$PY -m dlas_compare.plots --config cpu_default
$PY -m dlas_compare.summary --config cpu_default
