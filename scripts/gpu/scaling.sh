#!/usr/bin/env bash
# The scaling run on one machine's GPUs: weak scaling at local batch 64 on 1, 2, 4, ... NGPUS GPUs
# (default: every GPU nvidia-smi lists) for JAX (one process, batch sharded over an n-device mesh), TF
# (MirroredStrategy; where TensorFlow imports) and the PyTorch reference (DDP, NCCL), SYNTHETIC, bf16;
# strong scaling against one GPU at batch 128 (JAX, PyTorch); the NGPUS runs again with the gradients
# summed in bfloat16 (grad_allreduce_dtype; DDP's bf16_compress_hook); last, the weak-scaling model's
# prediction for the same GPU counts (dlas_compare.scaling_model). Results: $OUT/scaling.jsonl,
# $OUT/scaling.log. About a minute per row: ~5 min on 2 GPUs, ~12 min on 8.
#   OUT=results/gpu bash scripts/gpu/scaling.sh
#   NGPUS=8 OUT=results/gpu bash scripts/gpu/scaling.sh
set -uo pipefail
command -v nvidia-smi >/dev/null || { echo "error: ${0##*/} needs an NVIDIA GPU (nvidia-smi not found)" >&2; exit 2; }
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
nvidia-smi topo -m >> $OUT/device.txt 2>&1
N=${NGPUS:-$(nvidia-smi -L | wc -l)}
[[ $N =~ ^[1-9][0-9]*$ ]] || { echo "error: NGPUS=$N: a number of GPUs (1 or more)" >&2; exit 2; }
counts=(); for ((n = 1; n < N; n *= 2)); do counts+=($n); done; counts+=($N)
mkdir -p data
python3 -m shared_data.data.generate --out data/train_256.h5 --size 256 --seed 1 --npy --if-missing > $OUT/generate.log 2>&1
python3 -m shared_data.data.generate --out data/val_128.h5 --size 128 --seed 2 --npy --if-missing >> $OUT/generate.log 2>&1
R=$OUT/scaling.jsonl
T="python3 -m torch.distributed.run --standalone --nproc_per_node"
B="python3 -m dlas_compare.benchmark --config short_opt --out $R --mode synthetic"
L64="--local_batch_size 64"
BF16="--set grad_allreduce_dtype=bfloat16"
TF=$(python3 -c "import tensorflow" 2>/dev/null && echo yes || echo "")
{
[[ $TF ]] || echo "TensorFlow does not import here: no tf rows"
for n in "${counts[@]}"; do
  if ((n == 1)); then
    $T 1 -m dlas_compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch 1 GPU b64" --out $R
    $B --framework jax --num_devices 1 $L64 --label "jax 1 GPU b64"
    [[ $TF ]] && $B --framework tf --num_devices 1 $L64 --label "tf 1 GPU b64"
  else
    $T $n -m dlas_compare.torch_ddp --config short_opt --local_batch_size 64 --label "torch DDP $n GPUs local 64" --out $R
    $B --framework jax --num_devices $n $L64 --label "jax $n GPUs local 64"
    [[ $TF ]] && $B --framework tf --num_devices $n $L64 --label "tf $n GPUs local 64"
  fi
done
$T 1 -m dlas_compare.torch_ddp --config short_opt --local_batch_size 128 --label "torch 1 GPU b128" --out $R
$B --framework jax --num_devices 1 --local_batch_size 128 --label "jax 1 GPU b128"
if ((N > 1)); then
  $T $N -m dlas_compare.torch_ddp --config short_opt --local_batch_size 64 $BF16 --label "torch DDP $N GPUs local 64, bf16 all-reduce" --out $R
  $B --framework jax --num_devices $N $L64 $BF16 --label "jax $N GPUs local 64, bf16 all-reduce"
  [[ $TF ]] && $B --framework tf --num_devices $N $L64 $BF16 --label "tf $N GPUs local 64, bf16 all-reduce"
fi
} 2>&1 | grep -v "^\s*$" | tee $OUT/scaling.log
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))" | tee -a $OUT/scaling.log
python3 -m dlas_compare.scaling_model --gpus "${counts[@]}" | tee -a $OUT/scaling.log
