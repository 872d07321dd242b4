#!/usr/bin/env bash
# Synchronous against asynchronous checkpoint saves on this CPU, in JAX and TensorFlow: the same run in the
# kit as it is (asynchronous saves) and in the last commit with synchronous saves (SYNC_REF, checked out
# into a git worktree), one after the other; parts.py then reads both runs' logs and prints each epoch's
# wall time minus its steps and the checkpoint seconds on the training path.
#
# The config: cpu_default with the widths [32, 64, 128, 256, 256] and 4 steps an epoch (Nsamples 32),
# so that an epoch's save (127 MB in JAX: the parameters and Adam's two moments; 191 MB in TF) is large next
# to its steps (about 2.5 s an epoch on 2 cores).
#
#   PY=$(which python) bash experiments/async_saves/run.sh         (~2 minutes on 2 cores)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-python3}
SYNC_REF=${SYNC_REF:-0336d1b}
WORK=${WORK:-/tmp/async_saves}
OUT=${OUT:-experiments/async_saves/results}
FRAMEWORKS=${FRAMEWORKS:-jax tf}
EPOCHS=${EPOCHS:-6}
mkdir -p "$WORK" "$OUT"
if [[ ! -d $WORK/sync/.git && ! -f $WORK/sync/.git ]]; then
  git worktree add --detach "$WORK/sync" "$SYNC_REF" > /dev/null
fi
for part in train:1 val:2; do
  [[ $part == train* ]] && size=128 || size=64
  $PY -m shared_data.data.generate --out "data/${part%:*}_$size.h5" --size "$size" --seed "${part#*:}" --if-missing > /dev/null
done
ARGS=(--config cpu_default --num_epochs "$EPOCHS" --Nsamples 32 --set "unet_widths=[32,64,128,256,256]"
  --set progress_bar=false --set "train_path=$PWD/data/train_128.h5" --set "val_path=$PWD/data/val_64.h5"
  --set keep_checkpoints=2)
for framework in $FRAMEWORKS; do
  for mode in sync async; do
    tree=$PWD
    [[ $mode == sync ]] && tree=$WORK/sync
    rm -rf "$WORK/${framework}_$mode"  # a fresh run folder: its out.log holds this run alone
    t0=$(date +%s.%N)
    (cd "$tree" && PYTHONPATH=$tree TF_CPP_MIN_LOG_LEVEL=2 $PY -m "${framework}_impl.train" "${ARGS[@]}" \
      --workdir "$WORK/${framework}_$mode" > /dev/null 2>&1)
    t1=$(date +%s.%N)
    mkdir -p "$OUT/${framework}_$mode"
    cp "$WORK/${framework}_$mode"/{out.log,metrics.jsonl} "$OUT/${framework}_$mode/"
    echo "{\"run_sec\": $(echo "$t1 - $t0" | bc)}" > "$OUT/${framework}_$mode/run_sec.json"
  done
done
git log -1 --format='async: %H %cd' > "$OUT/commits.txt"
git -C "$WORK/sync" log -1 --format='sync: %H %cd' >> "$OUT/commits.txt"
$PY experiments/async_saves/parts.py "$OUT" | tee "$OUT/table.md"
