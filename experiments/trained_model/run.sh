#!/usr/bin/env bash
# A trained model judged as a cosmologist would: train the JAX U-Net (config short, bf16, the volumes
# in GPU memory) for ~3 minutes on one H200, predict the whole validation volume (fp32, bf16, and
# crop-wise: 64^3 tiles without context, what the network saw in training) and validate each
# prediction against the truth and the dark-matter baseline. Question and results: README.md here.
#
# On nvidia-h200, from the checkout's root, $OUT set (results land there; ~4 min in all):
#   bash experiments/trained_model/run.sh
# The same commands on CPU with a tiny config and tiny generated volumes (a smoke test, ~1 min):
#   OUT=/tmp/out CONFIG=cpu_tiny bash experiments/trained_model/run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short}
PY=${PY:-python3}
WORK=${WORK:-/tmp/trained_model}
mkdir -p "$OUT" "$WORK"
if [[ $CONFIG == short ]]; then
  export PYTHONPATH=/tmp/site  # DALI, staged by experiments/gpu_machine/stage_dali.sh
  source scripts/gpu/common.sh  # environment, device and versions record, data/train_256.h5 and data/val_128.h5
  # 131072 crops x 4 epochs = 524k samples at ~3500 samples/s (batch 64): ~2.5 min of steps
  NSAMPLES=${NSAMPLES:-131072} EPOCHS=${EPOCHS:-4}
  TRAIN=(--data_loader_config device --enable_amp)
  VAL=data/val_128.h5
else
  export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  NSAMPLES=${NSAMPLES:-16} EPOCHS=${EPOCHS:-1}
  $PY -m shared_data.data.generate --out "$WORK/train_32.h5" --size 32 --seed 1 --chunk 16 --if-missing
  $PY -m shared_data.data.generate --out "$WORK/val_32.h5" --size 32 --seed 2 --chunk 16 --if-missing
  TRAIN=(--set "train_path=$WORK/train_32.h5" --set "val_path=$WORK/val_32.h5" --set "xla_cache_dir=$WORK/xla")
  VAL=$WORK/val_32.h5
fi
CROP=$($PY -c "from shared_data.core.config import load_config; print(load_config('$CONFIG').crop_size)")
set -e
date -u +"%F %T UTC start" | tee "$OUT/timeline.txt"
$PY -m jax_impl.train --config "$CONFIG" "${TRAIN[@]}" --Nsamples "$NSAMPLES" --num_epochs "$EPOCHS" \
  --set progress_bar=false --workdir "$WORK/run" --overwrite --save_weights "$WORK/weights.npz" 2>&1 | tee "$OUT/train.log"
cp "$WORK/run/metrics.jsonl" "$WORK/run/run.json" "$OUT/"
date -u +"%F %T UTC trained" | tee -a "$OUT/timeline.txt"
for variant in fp32 bf16 crops; do
  case $variant in
    fp32) flags=(--precision float32) ;;
    bf16) flags=(--precision bfloat16) ;;
    crops) flags=(--precision float32 --tile "$CROP" --overlap 0) ;;  # seams at the crop faces, by design
  esac
  $PY -m jax_impl.predict --config "$CONFIG" --weights "$WORK/weights.npz" --input "$VAL" \
    --out "$WORK/pred_$variant.h5" "${flags[@]}" 2>&1 | tee "$OUT/predict_$variant.log"
  $PY -m shared_data.inference.validate --pred "$WORK/pred_$variant.h5" --truth "$VAL" --out "$OUT/validate_$variant" \
    2>&1 | tee "$OUT/validate_$variant.log"
  date -u +"%F %T UTC $variant validated" | tee -a "$OUT/timeline.txt"
done
