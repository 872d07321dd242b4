#!/usr/bin/env bash
# The comparison on one GPU (JAX, DALI and the PyTorch reference installed): the GPU kernels checked
# against the NumPy reader and float64 references, then the PyTorch reference and JAX SYNTHETIC, and
# JAX FULL on the GPU-resident loaders and on DALI's file reader, one table. Results under $OUT.
#   OUT=results/gpu bash scripts/gpu/compare.sh
set -uo pipefail
source scripts/gpu/common.sh
python3 -m pytest -q -m gpu tests/test_gpu_jax.py 2>&1 | tee $OUT/check_gpu.log
python3 -m dlas_compare.suite gpu --out $OUT/compare.jsonl --timeout 240 2>&1 | tee $OUT/compare.log
