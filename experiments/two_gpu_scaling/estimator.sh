#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI): the latency-hiding scheduler of the 2-GPU JAX step with XLA's
# analytical latency estimator (an NCCL cost model for the all-reduces) instead of the default one,
# whose estimate left the all-reduces exposed. Schedule, then 1- and 2-GPU SYNTHETIC rates.
# Results: $OUT/estimator.jsonl, $OUT/estimator.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
R=$OUT/estimator.jsonl
J="python3 -m dlas_compare.benchmark --framework jax --config short_opt --out $R --mode synthetic --local_batch_size 64"
AN="--xla_gpu_enable_analytical_latency_estimator=true"
{
XLA_FLAGS=$AN python3 experiments/two_gpu_scaling/allreduce_schedule.py --config short_opt --num_devices 2 --local_batch_size 64 2>&1 | grep -v "^\s*$" | tail -12
$J --num_devices 1 --label "jax 1 GPU b64"
XLA_FLAGS=$AN $J --num_devices 2 --label "jax 2 GPUs local 64, analytical latency estimator"
$J --num_devices 2 --label "jax 2 GPUs local 64"
} 2>&1 | grep -v "^\s*$" | tee $OUT/estimator.log
