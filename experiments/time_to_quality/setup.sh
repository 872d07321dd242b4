# Sourced by this study's recipes (checkout root, $OUT set): the environment and the data, and
# CONFIG / TRAIN_CONFIG / TRAIN (the training command's config and flags) and the run folder root WORK
# (one per recipe and framework: the two frameworks' runs of one name on one machine stay apart). $OUT gets device.txt, setup.log, runs.tar (each run's train.log, quality.jsonl,
# metrics.jsonl and run.json, appended as the run ends), table.txt and curve.png: a GPU call returns at
# most 8 files of $OUT.
#   CONFIG=short (default): the GPU set-up (scripts/gpu/common.sh: a GPU or one error line, the device
#     record, data/train_256_filtered.h5 and data/val_128_filtered.h5), config short_opt (short with
#     bf16 and the step's fastest forms) with the `device` loader (volumes in GPU memory).
#   CONFIG=cpu_tiny (or another CPU config): tiny generated volumes under $WORK, for a smoke test.
# GAS (default filtered) picks the data's gas: the linear gas (generate --gas filtered), on which this
# study's target was chosen and on which the non-ML baseline is the truth itself, so TRAIN switches
# quality_beat_non_ml off; or GAS=nonlinear (the generator's default), with the non-ML baseline scored.
# FRAMEWORK=tf adds TensorFlow's staged runtime (experiments/tf_on_h200/env.sh's steps).
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short}
PY=${PY:-python3}
WORK=${WORK:-/tmp/time_to_quality/$(basename "$0" .sh)/${FRAMEWORK:-jax}}
TRAIN_CONFIG=$CONFIG
mkdir -p "$OUT" "$WORK"
rm -rf "$OUT/runs.tar"
[[ -n ${RESUME:-} ]] || rm -rf "$WORK/records"  # a resumed recipe appends to its runs' logs
if [[ $CONFIG == short ]]; then
  export PYTHONPATH=/tmp/site  # DALI, staged by experiments/gpu_machine/stage_dali.sh (common.sh records its version)
  GAS=${GAS:-filtered}
  source scripts/gpu/common.sh
  if [[ ${FRAMEWORK:-jax} == tf ]]; then
    if [[ ! -f /tmp/tf-env.sh ]]; then
      bash .tf/last/tf-on-device.sh > "$OUT/tf_unpack.log" 2>&1 || { tail -5 "$OUT/tf_unpack.log"; exit 1; }
    fi
    source /tmp/tf-env.sh
    export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
    $PY -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)" | tee -a "$OUT/device.txt"
  fi
  TRAIN_CONFIG=short_opt
  TRAIN=(--data_loader_config device --enable_amp --set progress_bar=false
    --set "train_path=data/train_256$DATA_SUFFIX.h5" --set "val_path=data/val_128$DATA_SUFFIX.h5")
else
  export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
  GAS=${GAS:-filtered}
  for part in train:1 val:2; do
    $PY -m shared_data.data.generate --out "$WORK/${part%:*}_32_$GAS.h5" --size 32 --seed "${part#*:}" --chunk 16 \
      --gas "$GAS" --if-missing > /dev/null
  done
  TRAIN=(--set "train_path=$WORK/train_32_$GAS.h5" --set "val_path=$WORK/val_32_$GAS.h5" --set "xla_cache_dir=$WORK/xla")
fi
# The recipes' CPU smoke test: config quality's levers on a few crops an epoch (each script adds --num_epochs).
TINY_QUALITY=(--Nsamples 16 --set quality_budget_sec=60 --set ema_decay=0.9 --set loss_space=physical
  --set lambda_fourier=1.0)
TRAIN+=(--set "quality_beat_non_ml=$([[ $GAS == filtered ]] && echo false || echo true)")  # config quality has it off

# xla_cache: the compilation cache the runs of TRAIN_CONFIG use (a CPU config's TRAIN puts it under $WORK),
# for run_levers' CACHE.
xla_cache() {
  if [[ $CONFIG == short ]]; then
    $PY -c "from shared_data.core import config as c; print(c.load_config('$TRAIN_CONFIG').xla_cache_dir)"
  else
    echo "$WORK/xla"
  fi
}

# ttq NAME FRAMEWORK [flags...]: one time-to-quality run in $WORK/NAME; its log, quality.jsonl,
# metrics.jsonl and run.json are kept in $WORK/records/NAME and appended to $OUT/runs.tar. With RESUME
# set (in the environment), the run already in $WORK/NAME is resumed (--resume, its clock continuing
# from its last evaluation) instead of started afresh (--overwrite); its log is appended to.
ttq() {
  local name=$1 framework=$2
  shift 2
  local rec="$WORK/records/$name" mode=--overwrite
  [[ -n ${RESUME:-} ]] && mode=--resume
  if [[ $mode == --resume && ! -d $WORK/$name/checkpoints ]]; then  # a fresh machine: nothing to resume
    echo "error: RESUME: $WORK/$name holds no checkpoints to resume (the earlier call's machine is gone?)" >&2
    return 2
  fi
  mkdir -p "$rec"
  [[ $mode == --overwrite ]] && : > "$rec/train.log"
  $PY -m "${framework}_impl.train" --config "$TRAIN_CONFIG" "${TRAIN[@]}" --set quality_every_epochs=1 "$@" \
    --workdir "$WORK/$name" $mode 2>&1 | grep -v "^W0000\|^I0000\|^WARNING: All log" >> "$rec/train.log"
  local rc=${PIPESTATUS[0]}
  cp "$WORK/$name"/{quality.jsonl,metrics.jsonl,run.json} "$rec/" 2>/dev/null
  tar -rf "$OUT/runs.tar" -C "$WORK/records" "$name"
  grep "quality after\|time to quality\|error:" "$rec/train.log" | tail -3
  return "$rc"
}

# run_levers FRAMEWORK TIMEOUT: one ttq run per ';'-separated entry of $LEVERS (each a space-separated
# list of KEY=VALUE overrides, "base" for none) with the flags in RECIPE, each killed after TIMEOUT
# seconds; with CACHE set, that compilation cache is emptied before the first run (before every run
# with COLD=all). Returns the last failing run's exit status (0 when all ran).
run_levers() {
  local framework=$1 limit=$2 rc=0 first=1 lever name kv
  local -a runs flags
  IFS=';' read -ra runs <<< "$LEVERS"
  for lever in "${runs[@]}"; do
    flags=()
    name=base
    if [[ $lever != base ]]; then
      for kv in $lever; do flags+=(--set "$kv"); done
      name=$(echo "$lever" | tr ' =' '_-')
    fi
    if [[ -n ${CACHE:-} && ( $first == 1 || ${COLD:-} == all ) ]]; then rm -rf "$CACHE" "${JAX_COMPILATION_CACHE_DIR:-/nonexistent}"; fi
    first=0
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "$limit" bash -c "$(declare -f ttq); $(declare -p PY CONFIG TRAIN_CONFIG TRAIN WORK OUT); ttq '$name' $framework $(printf '%q ' "${RECIPE[@]}" "${flags[@]}")" || rc=$?
  done
  return $rc
}
