#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI): the 2-GPU sharded JAX step with an optimization barrier between
# the gradient all-reduces and Adam (experiments/two_gpu_scaling/scaling_gap.py "barrier"), with XLA's default
# schedule and with collectives started as early as possible; then, on the barrier step with early
# starts, XLA's own collective kernels and NCCL with fewer / more channels. 1 GPU first.
# Results: $OUT/barrier.jsonl, $OUT/barrier.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
R=$OUT/barrier.jsonl
S="python3 experiments/two_gpu_scaling/scaling_gap.py --config short_opt --local_batch_size 64 --out $R"
E="--xla_gpu_experimental_collective_start_as_early_as_possible=true"
{
$S --variants 1device sharded barrier
XLA_FLAGS="$E" $S --variants sharded barrier --label_suffix ", early"
XLA_FLAGS="$E --xla_gpu_experimental_use_collective_kernels=true" $S --variants barrier --label_suffix ", early, XLA AR"
NCCL_MAX_NCHANNELS=8 XLA_FLAGS="$E" $S --variants barrier --label_suffix ", early, NCCL 8ch"
NCCL_MIN_NCHANNELS=32 XLA_FLAGS="$E" $S --variants barrier --label_suffix ", early, NCCL 32ch"
} 2>&1 | grep -v "^\s*$" | grep -v "^run \|^----\|^W1130\|^I1130" | tee $OUT/barrier.log
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
