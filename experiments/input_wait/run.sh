#!/usr/bin/env bash
# Does the trainer's "Input wait" line tell the truth on a GPU? One call (~2.5 min on one H200): the JAX
# trainer on `short` (bf16) with the `device` loader (the volumes in GPU memory: compute-bound, the
# gather ~1 ms of a ~17 ms step) and with `lowmem` (h5py reads in 2 host workers: input-bound), 2
# epochs each on generated 128^3 / 64^3 volumes; prints each epoch's input-wait line and samples/s.
#   bash experiments/input_wait/run.sh                                # on the GPU machine, $OUT set
#   OUT=/tmp/out CONFIG=cpu_tiny bash experiments/input_wait/run.sh   # a smoke test on CPU (~1 min)
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short}
PY=${PY:-python3}
WORK=${WORK:-/tmp/input_wait}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT" "$WORK"
if [[ $CONFIG == short ]]; then
  SIZES=(128 64); FLAGS=(--enable_amp); N=(--Nsamples 8192)  # 128 steps of 64 an epoch
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
else
  SIZES=(32 24); FLAGS=(); N=(--Nsamples 32)
fi
for part in "train.h5 ${SIZES[0]} 1" "val.h5 ${SIZES[1]} 2"; do
  read -r name size seed <<< "$part"
  $PY -m shared_data.data.generate --out "$WORK/$name" --size "$size" --seed "$seed" --if-missing > /dev/null 2>&1 ||
    { echo "error: generating $WORK/$name failed"; exit 1; }
done
rc=0
for loader in device lowmem; do
  n=("${N[@]}")
  [[ $loader == lowmem && $CONFIG == short ]] && n=(--Nsamples 1024)  # 16 steps: the host reads slowly
  $PY -m jax_impl.train --config "$CONFIG" --data_loader_config "$loader" "${FLAGS[@]}" "${n[@]}" --num_epochs 2 \
    --set num_data_workers=2 --set "train_path=$WORK/train.h5" --set "val_path=$WORK/val.h5" \
    --set progress_bar=false --set tensorboard=false --workdir "$WORK/$loader" --overwrite 2>&1 |
    grep -v "^W0000\|^I0000" > "$OUT/train_$loader.log" || rc=1
  echo "== $loader"
  grep "Time taken\|Input wait\|input-bound\|compile:\|error:" "$OUT/train_$loader.log"
done
exit $rc
