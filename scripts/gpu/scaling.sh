#!/usr/bin/env bash
# The scaling run on a machine with 2 GPUs: weak scaling (local batch 64, 1 -> 2 GPUs) and strong
# scaling (global batch 128) for JAX (one process, batch sharded over a 2-device mesh) and the
# PyTorch reference (DDP, NCCL), SYNTHETIC, bf16; then both with the gradients summed in bfloat16
# (grad_allreduce_dtype; DDP's bf16_compress_hook). Results: $OUT/scaling.jsonl, $OUT/scaling.log.
#   OUT=results/gpu bash scripts/gpu/scaling.sh
set -uo pipefail
command -v nvidia-smi >/dev/null || { echo "error: ${0##*/} needs an NVIDIA GPU (nvidia-smi not found)" >&2; exit 2; }
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
nvidia-smi topo -m >> $OUT/device.txt 2>&1
mkdir -p data
python3 -m shared_data.data.generate --out data/train_256.h5 --size 256 --seed 1 --npy --if-missing > $OUT/generate.log 2>&1
python3 -m shared_data.data.generate --out data/val_128.h5 --size 128 --seed 2 --npy --if-missing >> $OUT/generate.log 2>&1
R=$OUT/scaling.jsonl
T="python3 -m torch.distributed.run --standalone --nproc_per_node"
J="python3 -m dlas_compare.benchmark --framework jax --config short_opt --out $R --mode synthetic"
BF16="--set grad_allreduce_dtype=bfloat16"
{
$T 1 -m dlas_compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch 1 GPU b64" --out $R
$T 2 -m dlas_compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch DDP 2 GPUs local 64" --out $R
$T 1 -m dlas_compare.torch_ddp --config short_opt --local_batch_size 128 --label "torch 1 GPU b128" --out $R
$J --num_devices 1 --local_batch_size 64 --label "jax 1 GPU b64"
$J --num_devices 2 --local_batch_size 64 --label "jax 2 GPUs local 64"
$J --num_devices 1 --local_batch_size 128 --label "jax 1 GPU b128"
$T 2 -m dlas_compare.torch_ddp --config short_opt --local_batch_size 64 $BF16 --label "torch DDP 2 GPUs local 64, bf16 all-reduce" --out $R
$J --num_devices 2 --local_batch_size 64 $BF16 --label "jax 2 GPUs local 64, bf16 all-reduce"
} 2>&1 | grep -v "^\s*$" | tee $OUT/scaling.log
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
