#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI): kernel timelines (experiments/two_gpu_scaling/step_timeline.py) of the 2-GPU step
# with and without its gradient all-reduces (scaling_gap.py's "shard_map local"), and 1 GPU, in
# one call: is the ~0.6 ms of extra compute per step on two GPUs the NCCL kernels slowing the
# convolutions, or extra work in the 2-device program? Results: $OUT/timeline2.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
T="python3 experiments/two_gpu_scaling/step_timeline.py --config short_opt --local_batch_size 64 --steps 10"
{
echo "== 1 GPU"; $T --num_devices 1
echo "== 2 GPUs, no all-reduce"; $T --num_devices 2 --no_all_reduce
echo "== 2 GPUs"; $T --num_devices 2
} 2>&1 | grep -v "^\s*$" | grep -v "^W1130\|^I1130\|^E1130\|  nccl at" | tee $OUT/timeline2.log
