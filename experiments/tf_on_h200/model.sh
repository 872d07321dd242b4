#!/usr/bin/env bash
# TensorFlow's trainer for a real number of epochs on one H200 (config short, the full net, bf16,
# the device loader), then what a user does with the model on the GPU: predict the held-out 128^3
# volume (fp32 and bf16, whole volume), validate each, export (SavedModel + .keras) and check that
# the exported SavedModel, loaded with TensorFlow alone, gives the model's output. Results in $OUT.
#   bash experiments/tf_on_h200/model.sh            (GPU machine, after run.sh in the same session)
#   OUT=/tmp/out CONFIG=cpu_tiny bash experiments/tf_on_h200/model.sh     (CPU smoke test, ~2 min)
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short}
PY=${PY:-python3}
WORK=${WORK:-/tmp/tf_model}
mkdir -p "$OUT" "$WORK"
if [[ $CONFIG == short ]]; then
  export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true  # DALI staged in /tmp/site
  [[ -f /tmp/tf-env.sh ]] && source /tmp/tf-env.sh
  NSAMPLES=${NSAMPLES:-32768} EPOCHS=${EPOCHS:-4}
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
set -e
$PY -m tf_impl.train --config "$CONFIG" "${TRAIN[@]}" --Nsamples "$NSAMPLES" --num_epochs "$EPOCHS" \
  --set progress_bar=false --workdir "$WORK/run" --overwrite --save_weights "$WORK/weights.npz" 2>&1 \
  | grep -v "^W0000\|^I0000" | tee "$OUT/train_tf.log"
cp "$WORK/run/metrics.jsonl" "$OUT/metrics_tf.jsonl"
for precision in float32 bfloat16; do
  $PY -m tf_impl.predict --config "$CONFIG" --weights "$WORK/weights.npz" --input "$VAL" --out "$WORK/pred_$precision.h5" \
    --precision $precision --tile 0 2>&1 | grep -v "^W0000\|^I0000" | tee "$OUT/predict_tf_$precision.log"
  $PY -m shared_data.inference.validate --pred "$WORK/pred_$precision.h5" --truth "$VAL" --out "$OUT/validate_tf_$precision" \
    2>&1 | tee "$OUT/validate_tf_$precision.log"
done
$PY -m tf_impl.export --config "$CONFIG" --weights "$WORK/weights.npz" --out "$WORK/export" 2>&1 \
  | grep -v "^W0000\|^I0000" | tee "$OUT/export_tf.log"
$PY - "$CONFIG" "$WORK" <<'PY' 2>&1 | grep -v "^W0000\|^I0000" | tee "$OUT/export_check_tf.log"
import sys
import numpy as np
import tensorflow as tf
from shared_data.core import config
from shared_data.model import unet_spec
from tf_impl import model as model_mod
cfg, work = config.load_config(sys.argv[1]), sys.argv[2]
s = cfg.crop_size
x = np.random.default_rng(0).uniform(-1, 1, (2, s, s, s, cfg.N_in_channels)).astype(np.float32)
loaded = tf.saved_model.load(f"{work}/export/saved_model")  # kept: its variables live with it
served = loaded.serve(tf.constant(x)).numpy()
model = model_mod.params_from_canonical(model_mod.build_model(cfg), unet_spec.load_weights(f"{work}/weights.npz", cfg))
direct = model(tf.constant(x), training=False).numpy()
err = float(np.abs(served - direct).max())
print(f"exported SavedModel on {tf.config.list_logical_devices('GPU')[:1] or 'CPU'}: max |served - model| = {err:.2e}")
assert err < 1e-3, err
PY
