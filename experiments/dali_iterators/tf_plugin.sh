#!/usr/bin/env bash
# One call on one GPU, TF and DALI staged (experiments/tf_on_h200/env.sh: /tmp/tf-env.sh, /tmp/site, the
# DALI TF plugin carried in .daltf/): the fastest path through DALI's TF plugin. The plugin's
# DALIDataset takes only host (tf.data) inputs, so the crops of a GPU-resident volume cannot be handed to
# it; what remains is DALI reading the crops itself: its CPU numpy reader (`dali-npy`) with 4, 8 and 16
# threads, FULL beside TF SYNTHETIC in one process each, and the `device` loader (no DALI) as the bound.
# Config short_opt (batch 64, bf16). Records in $OUT/tf_plugin.jsonl; the table last.
#   CPU smoke test (no GPU needed for the benchmark rows): OUT=/tmp/o CONFIG=cpu_tiny SMOKE=1 bash experiments/dali_iterators/tf_plugin.sh
set -uo pipefail
CONFIG=${CONFIG:-short_opt} THREADS=${THREADS:-4 8 16}
if [[ -z ${SMOKE:-} ]]; then
  source experiments/tf_on_h200/env.sh   # device record, data/train_256.h5 (+ .npy), TF, DALI, plugin
  SET=""
else                                     # CPU: a tiny volume of the generator
  export PYTHONPATH=. PYTHONUNBUFFERED=1; mkdir -p "$OUT" data
  python3 -m shared_data.data.generate --out data/smoke_64.h5 --size 64 --seed 1 --npy --if-missing > /dev/null
  SET="--set train_path=data/smoke_64.h5 --set val_path=data/smoke_64.h5"
fi
bench() {
  timeout 150 python3 -m dlas_compare.benchmark --framework tf --config $CONFIG $SET --warmup 5 --steps 40 \
    --windows 3 --window_sec 2 --out $OUT/tf_plugin.jsonl "$@" 2>&1 | grep -v "^W0000\|^I0000" | tail -2
}
bench --mode synthetic full --data_loader_config device --label "tf device loader"
for t in $THREADS; do
  bench --mode synthetic full --data_loader_config dali-npy --set dali_threads=$t --label "tf dali-npy $t threads"
done
python3 - $OUT/tf_plugin.jsonl <<'PY' | tee $OUT/tf_plugin.txt
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
synthetic = {r["label"]: r["samples_per_sec"] for r in rows if r["mode"] == "synthetic"}
print(f"{'label':28s} {'SYNTHETIC':>10s} {'FULL':>10s} {'FULL/SYNTHETIC':>15s}")
for r in rows:
    if r["mode"] == "full":
        s = synthetic.get(r["label"])
        print(f"{r['label']:28s} {s or float('nan'):10.1f} {r['samples_per_sec']:10.1f} {r['samples_per_sec'] / s if s else float('nan'):15.3f}")
PY
