#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI; prepared 2026-11-30, not yet run): weak scaling with the 2-GPU JAX step
# recompiled from a manual PGLE profile (scripts/gpu/manual_pgle.py), next to PyTorch DDP and the
# 1-GPU JAX step, one call. Results: $OUT/manual_pgle.jsonl, $OUT/manual_pgle.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
R=$OUT/manual_pgle.jsonl
T="python3 -m torch.distributed.run --standalone --nproc_per_node"
{
$T 1 -m compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch 1 GPU b64" --out $R
$T 2 -m compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch DDP 2 GPUs local 64" --out $R
python3 -m compare.benchmark --framework jax --config short_opt --mode synthetic --num_devices 1 --local_batch_size 64 --label "jax 1 GPU b64" --out $R
python3 scripts/gpu/manual_pgle.py --config short_opt --num_devices 2 --local_batch_size 64 --out $R
} 2>&1 | grep -v "^\s*$" | grep -v "UserWarning\|return func\|\*\*\*\*\|OMP_NUM_THREADS" | tee $OUT/manual_pgle.log
python3 -c "
import json; from compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
