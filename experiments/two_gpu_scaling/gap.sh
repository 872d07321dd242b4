#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI): where the 2-GPU JAX step loses its ~4% against 1 GPU.
# experiments/two_gpu_scaling/scaling_gap.py (1 device; the sharded production step; the step per device in
# shard_map with an explicit pmean; the same with no all-reduce at all), then two separate 1-GPU
# processes at once (one per GPU, 60 windows of 20 steps so the timed parts overlap: does running
# both GPUs cost anything by itself?).
# Results: $OUT/gap.jsonl, $OUT/gap.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
R=$OUT/gap.jsonl
J="python3 -m dlas_compare.benchmark --framework jax --config short_opt --mode synthetic --num_devices 1 --local_batch_size 64 --steps 20 --windows 60"
{
python3 experiments/two_gpu_scaling/scaling_gap.py --config short_opt --local_batch_size 64 --out $R
CUDA_VISIBLE_DEVICES=0 $J --label "jax 1 GPU b64, GPU 0 with GPU 1 busy" --out $OUT/gpu0.jsonl &
CUDA_VISIBLE_DEVICES=1 $J --label "jax 1 GPU b64, GPU 1 with GPU 0 busy" --out $OUT/gpu1.jsonl
wait
cat $OUT/gpu0.jsonl $OUT/gpu1.jsonl >> $R
} 2>&1 | grep -v "^\s*$" | grep -v "^run \|^----" | tee $OUT/gap.log
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
