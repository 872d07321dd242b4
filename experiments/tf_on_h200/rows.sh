#!/usr/bin/env bash
# The TF trainer rows not yet recorded on the GPU (~3.5 min): `dali-device` (after the epoch-reset fix)
# and `dali-h5` (with room for its host-read speed), 2 epochs each on the narrow net, both at once.
# Needs DALI staged (/tmp/site) and the DALI TF plugin in .daltf/; unpacks TF if this machine has not.
# Results under $OUT (device.txt, setup.log, trainers_rows.jsonl).
#   bash experiments/tf_on_h200/rows.sh
set -uo pipefail
[[ -f /tmp/tf-env.sh ]] || bash .tf/last/tf-on-device.sh > /tmp/tf_unpack.log 2>&1 || { tail -5 /tmp/tf_unpack.log; exit 1; }
source experiments/tf_on_h200/env.sh
timeout 230 python3 experiments/tf_on_h200/trainers.py --config short --epochs 2 --nsamples 1024 --parallel 2 \
  --rows "bf16 dali-h5" "bf16 dali-device" --set "unet_widths=[16,32,64,64,64,64]" --timeout 220 \
  --out $OUT/trainers_rows.jsonl 2>&1 | tail -6
