#!/usr/bin/env bash
# On nvidia-h200 (DALI staged in /tmp/site, see ../shared/device/README.md), call 2 of 2 (right
# after scripts/gpu/h200_levels.sh on the same machine, which leaves the data and /tmp/best_jax_args):
# the comparison table of issue 6: JAX and PyTorch rows for IO, SYNTHETIC and FULL on the same
# loader (dali-npy, 16 DALI threads; PyTorch has no dali-device input), the JAX device loader, the other loaders' IO, and the 200-step bf16-vs-fp32
# loss curves. TF is not installed there and gets a note. Results under $OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
BEST=$(cat /tmp/best_jax_args 2>/dev/null)
echo "JAX formulation args: [$BEST]" | tee $OUT/compare.log
python3 -m dlas_compare.compare --config short_opt --out $OUT/compare.jsonl --data_loader_config dali-npy --set dali_threads=16 $BEST 2>&1 | tee -a $OUT/compare.log
python3 -m dlas_compare.compare --config short_opt --frameworks jax --modes io full --out $OUT/compare.jsonl --data_loader_config device $BEST 2>&1 | tee -a $OUT/compare.log
python3 experiments/h200_step_speed/suites.py h200-loaders --out $OUT/loaders.jsonl --timeout 60 2>&1 | tee $OUT/loaders.log
for p in fp32 bf16; do
  amp=(); [[ $p == bf16 ]] && amp=(--enable_amp)
  python3 -m jax_impl.train --config short --data_loader_config device --Nsamples 1280 --num_epochs 10 "${amp[@]}" $BEST \
    --set progress_bar=false --workdir /tmp/curve_$p --overwrite > /tmp/curve_$p.log 2>&1
  cp /tmp/curve_$p/metrics.jsonl $OUT/curve_$p.jsonl; tail -3 /tmp/curve_$p.log
done
