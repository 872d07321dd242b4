#!/usr/bin/env bash
# On nvidia-h200 (no DALI needed): per-layer forward+backward times of the U-Net's convolutions,
# each JAX formulation against PyTorch's layer (batch 64, bf16). Results under $OUT.
# (The call of 2026-11-30 also ran full steps with an interim key, upconv_phases_below, since
# removed: results/h200/2026-11-30_upconv.jsonl, experiments/perf_notes.md attempt 7.)
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
python3 -c "import jax, flax, torch; print('jax', jax.__version__, 'flax', flax.__version__, 'torch', torch.__version__)" | tee -a $OUT/device.txt
timeout 250 python3 -m dlas_compare.layer_bench --config short_opt --steps 5 --out $OUT/layers.jsonl 2>&1 | tee $OUT/layers.log
