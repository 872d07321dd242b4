#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI): the 2-GPU step's all-reduces run as NCCL RING_LL kernels that
# overlap compute (step_timeline.py, 2026-11-30k) while compute kernels slow by ~0.6 ms per step.
# Does NCCL's Simple or LL128 protocol (less SM and memory traffic per byte than LL) cut that?
# 1 GPU, then 2 GPUs with NCCL's choice, NCCL_PROTO=Simple, NCCL_PROTO=LL128; timeline with Simple.
# Results: $OUT/nccl.jsonl, $OUT/nccl.log
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
R=$OUT/nccl.jsonl
J="python3 -m dlas_compare.benchmark --framework jax --config short_opt --out $R --mode synthetic --local_batch_size 64"
{
$J --num_devices 1 --label "jax 1 GPU b64"
$J --num_devices 2 --label "jax 2 GPUs local 64"
NCCL_PROTO=Simple $J --num_devices 2 --label "jax 2 GPUs local 64, NCCL_PROTO=Simple"
NCCL_PROTO=LL128 $J --num_devices 2 --label "jax 2 GPUs local 64, NCCL_PROTO=LL128"
echo "== timeline, 2 GPUs, NCCL_PROTO=Simple"
NCCL_PROTO=Simple python3 experiments/two_gpu_scaling/step_timeline.py --config short_opt --local_batch_size 64 --steps 5 --num_devices 2 | sed -n 1,4p  # the recorded call (l) piped to head -4, which ended it with a BrokenPipeError after these lines
} 2>&1 | grep -v "^\s*$" | grep -v "^run \|^----\|^W1130\|^I1130\|^E1130" | tee $OUT/nccl.log
python3 -c "
import json
for l in open('$R'):
    r=json.loads(l); print(f\"{r['label']:<45} {r['samples_per_sec']:8.1f} samples/s  p50 {r['step_ms_p50']:.2f} ms\")"
