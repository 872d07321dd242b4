#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI): kernel timeline of the JAX train step on 1 and 2 GPUs
# (experiments/two_gpu_scaling/step_timeline.py): NCCL kernel time, its overlap with compute, compute-stream idle
# time; default XLA schedule and collectives started as early as possible. Results: $OUT/timeline.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
T="python3 experiments/two_gpu_scaling/step_timeline.py --config short_opt --local_batch_size 64 --steps 5"
{
echo "== 1 GPU"; $T --num_devices 1
echo "== 2 GPUs"; $T --num_devices 2 --trace_to $OUT/trace2
echo "== 2 GPUs, early starts"; XLA_FLAGS=--xla_gpu_experimental_collective_start_as_early_as_possible=true $T --num_devices 2
} 2>&1 | grep -v "^\s*$" | grep -v "^W1130\|^I1130\|^E1130" | tee $OUT/timeline.log
find $OUT/trace2 -name "*.xplane.pb" -delete
