#!/usr/bin/env bash
# One call on one H200, DALI staged (experiments/gpu_machine/stage_dali.sh): the GPU kernels checked bit for bit
# (every DALI mode, the device loader), the per-stage cost of dali-device, then IO and FULL of the DALI
# modes next to JAX SYNTHETIC and the device loader (batch 64, bf16), and the step breakdown of
# dlas_compare.step_breakdown in bf16 and fp32. Everything lands in $OUT/results.tar.gz (+ summary.log).
set -uo pipefail
export PYTHONPATH=/tmp/site  # DALI, staged by experiments/gpu_machine/stage_dali.sh
source scripts/gpu/common.sh
R=$OUT/r; mkdir -p $R; cp $OUT/device.txt $OUT/setup.log $R/ 2>/dev/null
{
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_jax.py 2>&1 | grep -v Warning | tail -8 | tee $R/check_gpu.log
timeout 180 python3 experiments/dali_full_speed/stages.py --config short_opt --out $R/dali_stages.jsonl 2>&1 | grep -E "^(cut|layout|axes|flips|channels) "
B="python3 -m dlas_compare.benchmark --framework jax --config short_opt --out $R/dali_full.jsonl"
timeout 100 $B --mode synthetic --label "jax bf16" 2>&1 | tail -1
timeout 100 $B --mode io full --data_loader_config device --label "jax device loader" 2>&1 | tail -2
timeout 100 $B --mode io full --data_loader_config dali-device --label "jax dali-device, 8 steps cut per call" 2>&1 | tail -2
timeout 100 $B --mode io full --data_loader_config dali-device --set dali_device_cut_steps=1 --label "jax dali-device, 1 step cut per call" 2>&1 | tail -2
timeout 120 $B --mode io full --data_loader_config dali-npy --set dali_threads=16 --label "jax dali-npy, 16 threads" 2>&1 | tail -2
for p in bf16 fp32; do
  amp=--enable_amp; [[ $p == fp32 ]] && amp=--no-enable_amp
  timeout 150 python3 -m dlas_compare.step_breakdown --config short_opt $amp --out $R/breakdown_$p 2>&1 | tail -40 > $R/breakdown_$p.md
  head -3 $R/breakdown_$p.md
done
python3 -c "
import json; from dlas_compare.benchmark import table
print(table([json.loads(l) for l in open('$R/dali_full.jsonl')]))"
} 2>&1 | tee $OUT/summary.log
tar czf $OUT/results.tar.gz -C $R .
