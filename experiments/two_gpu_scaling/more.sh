#!/usr/bin/env bash
# On nvidia-h200-x2, call 2 of 2 (right after scaling.sh, same warm machine): correctness of
# the GPU paths (check_gpu.py), where the gradient all-reduces sit in XLA's schedule (float32 and
# bfloat16 sums), JAX at XLA optimization level O1 (latency-hiding scheduler, pipelined
# collectives), and the GPU-resident inputs on 1 and 2 GPUs. Results: $OUT/more.jsonl, $OUT/*.log
set -uo pipefail
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
R=$OUT/more.jsonl
J="python3 -m dlas_compare.benchmark --framework jax --config short_opt --out $R"
python3 -m pytest -q -m gpu tests/test_gpu_jax.py 2>&1 | tail -20 | tee $OUT/check_gpu.log
for dt in float32 bfloat16; do
  python3 experiments/two_gpu_scaling/allreduce_schedule.py --config short_opt --num_devices 2 --local_batch_size 64 \
    --set grad_allreduce_dtype=$dt 2>&1 | grep -v "^\s*$" | tail -40
done | tee $OUT/allreduce_schedule.log
{
JAX_OPTIMIZATION_LEVEL=O1 $J --mode synthetic --num_devices 2 --local_batch_size 64 --label "jax 2 GPUs local 64, XLA O1"
$J --mode io full --num_devices 2 --local_batch_size 64 --data_loader_config device --label "jax 2 GPUs device loader"
$J --mode io full --num_devices 1 --local_batch_size 64 --data_loader_config dali-device --label "jax 1 GPU dali-device"
$J --mode io full --num_devices 2 --local_batch_size 64 --data_loader_config dali-device --label "jax 2 GPUs dali-device"
} 2>&1 | grep -v "^\s*$" | tee $OUT/more.log
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R')]))"
