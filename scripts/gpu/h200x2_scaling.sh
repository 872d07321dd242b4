#!/usr/bin/env bash
# On nvidia-h200-x2: weak scaling (local batch 64, 1 -> 2 GPUs) and strong scaling (global batch 128)
# for JAX (one process, batch sharded over a 2-device mesh) and the PyTorch reference (DDP, NCCL),
# SYNTHETIC mode, bf16. Results: $OUT/scaling.jsonl, $OUT/scaling.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
nvidia-smi topo -m >> $OUT/device.txt 2>&1
R=$OUT/scaling.jsonl
T="python3 -m torch.distributed.run --standalone --nproc_per_node"
J="python3 -m compare.benchmark --framework jax --mode synthetic --config short_opt --out $R"
{
$T 1 -m compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch 1 GPU b64" --out $R
$T 2 -m compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch DDP 2 GPUs local 64" --out $R
$T 1 -m compare.torch_ddp --config short_opt --local_batch_size 128 --label "torch 1 GPU b128" --out $R
$J --num_devices 1 --local_batch_size 64 --label "jax 1 GPU b64"
$J --num_devices 2 --local_batch_size 64 --label "jax 2 GPUs local 64"
$J --num_devices 1 --local_batch_size 128 --label "jax 1 GPU b128"
} 2>&1 | grep -v "^\s*$" | tee $OUT/scaling.log
python3 -c "
import json; from compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
