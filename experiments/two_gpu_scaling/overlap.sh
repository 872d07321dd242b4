#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI needed): can XLA overlap the gradient all-reduces of the 2-GPU JAX
# step with the backward convolutions? For each XLA setting, where the all-reduces sit in the
# compiled schedule (allreduce_schedule.py), then the 2-GPU SYNTHETIC rate next to 1 GPU.
# Results: $OUT/overlap.jsonl, $OUT/overlap.log, $OUT/schedules.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
XLA_FLAGS=--help python3 -c "import jax; jax.numpy.zeros(1)" 2>&1 | grep -E "latency_hiding|combine_threshold|highest_priority|pipelined_all_reduce" | cut -c1-220 > $OUT/flags_help.txt
R=$OUT/overlap.jsonl
J="python3 -m dlas_compare.benchmark --framework jax --config short_opt --out $R --mode synthetic --local_batch_size 64"
LHS="--xla_gpu_enable_latency_hiding_scheduler=true"
declare -A FLAGS=(
  [default]=""
  [lhs]="$LHS"
  [lhs_nocombine]="$LHS --xla_gpu_all_reduce_combine_threshold_bytes=0"
  [lhs_prio]="$LHS --xla_gpu_enable_highest_priority_async_stream=true --xla_gpu_all_reduce_combine_threshold_bytes=8388608"
)
for v in default lhs lhs_nocombine lhs_prio; do
  echo "== $v: XLA_FLAGS=${FLAGS[$v]}"
  XLA_FLAGS="${FLAGS[$v]}" python3 experiments/two_gpu_scaling/allreduce_schedule.py --config short_opt --num_devices 2 --local_batch_size 64 2>&1 \
    | grep -v "^\s*$" | tail -30
done 2>&1 | tee $OUT/schedules.log
{
$J --num_devices 1 --label "jax 1 GPU b64"
for v in default lhs lhs_nocombine lhs_prio; do
  XLA_FLAGS="${FLAGS[$v]}" $J --num_devices 2 --label "jax 2 GPUs local 64, $v"
done
} 2>&1 | grep -v "^\s*$" | tee $OUT/overlap.log
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
