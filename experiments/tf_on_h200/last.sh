#!/usr/bin/env bash
# What the follow-up call left, in one call (~8 min): the TF trainer rows of dali-device (after the
# epoch-reset fix) and dali-h5 (with room for its host-read speed); TF's dali-device FULL with the
# crops of 1, 8 (the default) and 32 steps cut per call beside TF SYNTHETIC, to find the last 0.022 of
# the DALI ratio; and TF's cold train-step compile from an empty XLA cache under XLA flag variants
# (compile.sh). Needs TF and DALI staged (/tmp/tf-env.sh, /tmp/site) and the DALI TF plugin in
# .daltf/. Results under $OUT.
#   bash experiments/tf_on_h200/last.sh
set -uo pipefail
source experiments/tf_on_h200/env.sh
timeout 200 python3 experiments/tf_on_h200/trainers.py --config short --epochs 2 --nsamples 1024 --parallel 2 \
  --rows "bf16 dali-h5" "bf16 dali-device" --set "unet_widths=[16,32,64,64,64,64]" --timeout 190 \
  --out $OUT/trainers_last.jsonl 2>&1 | tail -4
bench() {
  timeout 100 python3 -m dlas_compare.benchmark --config short_opt --warmup 5 --steps 40 --windows 3 --window_sec 2 \
    --out $OUT/compare_last.jsonl "$@" 2>&1 | grep -v "^W0000\|^I0000" | tail -2
}
bench --framework tf --mode synthetic --label "tf synthetic"
for k in 1 8 32; do
  bench --framework tf --mode full --data_loader_config dali-device --set dali_device_cut_steps=$k --label "tf dali-device cut $k"
done
python3 experiments/tf_on_h200/table.py $OUT/compare_last.jsonl | tee $OUT/table_last.txt
bash experiments/tf_on_h200/compile.sh 2>&1 | tee $OUT/compile.log | tail -6
