#!/usr/bin/env bash
# Does `lowmem` scale with its worker processes on the 16-core GPU host? In one call (~3-5 min):
# lowmem_workers.py (threads vs processes, h5py's lock, the control) with WORKERS, then the benchmark's
# IO mode, JAX, CONFIG, `lowmem` with each of WORKERS processes (the ladder's rungs 1-2 read with 4 and
# 8 threads: 75.8 and 77.9 samples/s). Also prints /dev/shm's size: a `lowmem` loader holds
# num_data_workers + 1 batches there (short_opt: 604 MB each). Writes 3 files under $OUT:
# lowmem_workers.txt, io.jsonl, io.log; the table of IO samples/s is printed last.
#
# On nvidia-h200, on a machine where experiments/ladder_h200/setup.sh ran (data/train_256.h5), $OUT set:
#   bash experiments/ladder_h200/lowmem_workers.sh
# The same commands on CPU (a smoke test, ~1 min on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_default CROP=32 WORKERS="1 2" DATA=/tmp/train_128.h5 bash experiments/ladder_h200/lowmem_workers.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short_opt}
CROP=${CROP:-64}
WORKERS=${WORKERS:-1 4 8}
DATA=${DATA:-data/train_256.h5}
PY=${PY:-python3}
mkdir -p "$OUT"
[[ -f $DATA ]] || { echo "error: $DATA not found: run bash experiments/ladder_h200/setup.sh first" >&2; exit 2; }
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
df -h /dev/shm | tee "$OUT/lowmem_workers.txt"
nproc | sed 's/^/cores: /' | tee -a "$OUT/lowmem_workers.txt"
# shellcheck disable=SC2086
$PY experiments/ladder_h200/lowmem_workers.py --data "$DATA" --crop "$CROP" --batch 8 --workers $WORKERS \
  2>&1 | tee -a "$OUT/lowmem_workers.txt"
for w in $WORKERS; do
  timeout 150 $PY -m dlas_compare.benchmark --framework jax --mode io --config "$CONFIG" --data_loader_config lowmem \
    --num_data_workers "$w" --set "train_path=$DATA" --label "jax io lowmem $w processes" --warmup 2 --windows 3 \
    --window_sec 2 --min_window_steps 5 --out "$OUT/io.jsonl" >> "$OUT/io.log" 2>&1 || echo "workers $w: exit $?" | tee -a "$OUT/io.log"
done
echo "done in ${SECONDS} s"
$PY - "$OUT/io.jsonl" <<'EOF'
import json, sys
print(f"{'run':<32}{'samples/s':>11}{'min':>9}{'max':>9}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['label']:<32}{r['samples_per_sec']:>11.1f}{r['samples_per_sec_min']:>9.1f}{r['samples_per_sec_max']:>9.1f}")
EOF
