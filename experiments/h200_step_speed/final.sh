#!/usr/bin/env bash
# On nvidia-h200 (DALI staged in /tmp/site): the recorded comparison (PyTorch reference vs JAX,
# same call) and the 200-step bf16-vs-fp32 loss curves. Results under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site  # DALI, staged by experiments/gpu_machine/stage_dali.sh
source scripts/gpu/common.sh
python3 experiments/h200_step_speed/suites.py h200-final --out $OUT/final.jsonl --timeout 150 2>&1 | tee $OUT/final.log
for p in fp32 bf16; do
  amp=(); [[ $p == bf16 ]] && amp=(--enable_amp)
  python3 -m jax_impl.train --config short --data_loader_config device --Nsamples 1280 --num_epochs 10 "${amp[@]}" \
    --set progress_bar=false --workdir /tmp/curve_$p --overwrite > /tmp/curve_$p.log 2>&1
  cp /tmp/curve_$p/metrics.jsonl $OUT/curve_$p.jsonl; tail -4 /tmp/curve_$p.log
done
