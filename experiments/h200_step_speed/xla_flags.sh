#!/usr/bin/env bash
# On nvidia-h200 (no DALI needed): XLA convolution flags for JAX's step, with the PyTorch reference
# in the same call (SYNTHETIC, batch 64, bf16). Results: $OUT/flags.jsonl, $OUT/flags.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
python3 experiments/h200_step_speed/suites.py h200-flags --out $OUT/flags.jsonl --timeout 100 2>&1 | tee $OUT/flags.log
