#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI): XLA settings that could start the 2-GPU JAX step's gradient
# all-reduces earlier or cost them right, each timed next to the 1-GPU step in one call:
#   sync    all-reduces synchronous, scheduler off (how long a fully exposed all-reduce takes)
#   early   --xla_gpu_experimental_collective_start_as_early_as_possible
#   early0  the same, all-reduce combining off (one all-reduce per gradient)
#   early0p the same, up to 4 all-reduces in flight
#   sol     XLA's speed-of-light latency estimator for collectives
#   then manual PGLE (experiments/two_gpu_scaling/manual_pgle.py: default and recompiled with the profile).
# Results: $OUT/early.jsonl, $OUT/early.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
R=$OUT/early.jsonl
J="python3 -m dlas_compare.benchmark --framework jax --config short_opt --out $R --mode synthetic --local_batch_size 64"
E="--xla_gpu_experimental_collective_start_as_early_as_possible=true"
declare -A FLAGS=(
  [default]=""
  [sync]="--xla_gpu_enable_latency_hiding_scheduler=false --xla_gpu_disable_async_collectives=allreduce"
  [early]="$E"
  [early0]="$E --xla_gpu_all_reduce_combine_threshold_bytes=0"
  [early0p]="$E --xla_gpu_all_reduce_combine_threshold_bytes=0 --xla_gpu_experimental_parallel_collective_overlap_limit=4"
  [sol]="--xla_gpu_enable_analytical_sol_latency_estimator=true"
)
{
$J --num_devices 1 --label "jax 1 GPU b64"
for v in default sync early early0 early0p sol; do
  XLA_FLAGS="${FLAGS[$v]}" $J --num_devices 2 --label "jax 2 GPUs local 64, $v"
done
XLA_FLAGS="$E" python3 experiments/two_gpu_scaling/allreduce_schedule.py --config short_opt --num_devices 2 --local_batch_size 64 2>&1 | tail -14
python3 experiments/two_gpu_scaling/manual_pgle.py --config short_opt --num_devices 2 --local_batch_size 64 --out $R
} 2>&1 | grep -v "^\s*$" | grep -v "^run \|^----" | tee $OUT/early.log
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
