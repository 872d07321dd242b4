#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI needed): weak scaling 1 -> 2 GPUs at local batch 64, PyTorch DDP and
# JAX, with JAX also under auto-PGLE (JAX_ENABLE_PGLE=yes: XLA's latency-hiding scheduler given
# measured op costs, so it can place the gradient all-reduces behind the backward convolutions).
# Results: $OUT/pgle.jsonl, $OUT/pgle.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
R=$OUT/pgle.jsonl
T="python3 -m torch.distributed.run --standalone --nproc_per_node"
J="python3 -m dlas_compare.benchmark --framework jax --config short_opt --out $R --mode synthetic --local_batch_size 64"
{
$T 1 -m dlas_compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch 1 GPU b64" --out $R
$T 2 -m dlas_compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch DDP 2 GPUs local 64" --out $R
$J --num_devices 1 --label "jax 1 GPU b64"
$J --num_devices 2 --label "jax 2 GPUs local 64"
JAX_ENABLE_PGLE=yes $J --num_devices 1 --warmup 8 --label "jax 1 GPU b64, auto-PGLE"
JAX_ENABLE_PGLE=yes $J --num_devices 2 --warmup 8 --label "jax 2 GPUs local 64, auto-PGLE"
} 2>&1 | grep -v "^\s*$" | grep -v "UserWarning\|return func\|\*\*\*\*\|OMP_NUM_THREADS" | tee $OUT/pgle.log
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
