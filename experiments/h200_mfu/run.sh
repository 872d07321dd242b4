#!/usr/bin/env bash
# The step levers of issue 29 on one H200, in one call of at most 9.5 minutes: JAX SYNTHETIC
# (short_opt: the full 117 M-parameter net, 64^3 crops, batch 64, bf16) for the baseline and each lever
# alone (one process, levers.py), whole-step command buffers (a process with their XLA flags), the
# combination of the levers that helped (levers.py choose), the step breakdowns of the baseline and of the
# combination, TF SYNTHETIC with the combination's forms TF has (and TF's baseline if time is left), and
# the PyTorch reference. Every stage checks the time left (DEADLINE s after the start) and is recorded as
# skipped when it would not fit. Results under $OUT; the table is printed last.
#
# On nvidia-h200, with TF staged (.tf/p0-p5, then carried as .tf/last: ../shared/device/README.md), in one
# call that carries [".tf/last"], $OUT set:
#   bash experiments/h200_mfu/run.sh
# The same stages on CPU with a tiny config (a smoke test, ~4 min on 2 cores; no PyTorch or TF runtime
# set-up, TORCH=0 skips the reference where PyTorch is not installed):
#   OUT=/tmp/h200_mfu CONFIG=cpu_tiny PY=/work/main/.venv/bin/python TORCH=0 bash experiments/h200_mfu/run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short_opt}
PY=${PY:-python3}
DEADLINE=${DEADLINE:-565}
TORCH=${TORCH:-1}
WINDOWS=(--warmup 3 --steps 30 --windows 3)
START=$(date +%s)
mkdir -p "$OUT"
STUDY=experiments/h200_mfu
if [[ $CONFIG == short_opt ]]; then
  command -v nvidia-smi >/dev/null || { echo "error: run.sh needs an NVIDIA GPU (nvidia-smi not found)" >&2; exit 2; }
  export PYTHONPATH=.:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
  $PY -c "import jax, flax, optax, torch; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__)" | tee -a "$OUT/device.txt"
  if [[ ! -f /tmp/tf-env.sh ]]; then
    bash .tf/last/tf-on-device.sh > "$OUT/tf_unpack.log" 2>&1 || { tail -5 "$OUT/tf_unpack.log"; echo "TF not unpacked: TF stages skipped"; }
  fi
  SETS=(--set xla_cache_dir=/tmp/h200_mfu_xla)
else
  export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
  SETS=(--set xla_cache_dir=/tmp/h200_mfu_xla_cpu --set global_batch_size=2)
  WINDOWS=(--warmup 1 --steps 2 --windows 2)
fi
rm -rf /tmp/h200_mfu_xla /tmp/h200_mfu_xla_cpu  # every compile in this call is a cold one
left() { echo $((START + DEADLINE - $(date +%s))); }
quiet() { grep --line-buffered -v "^W0000\|^I0000\|^WARNING: All log messages"; }
levers() {  # levers.py run with the call's config, deadline and windows; $1: seconds kept after it, then its arguments
  local t=$(( $(left) - $1 )); shift
  (( t > 10 )) || { echo "[levers] skipped, no time left: $*" | tee -a "$OUT/levers.log"; return; }
  timeout "$t" $PY $STUDY/levers.py run --config "$CONFIG" "${SETS[@]}" "${WINDOWS[@]}" \
    --deadline $((START + DEADLINE)) "$@" 2>&1 | quiet | tee -a "$OUT/levers.log" | grep "^\[levers\]\|^error"
}
stamp() { echo "$1 at $(( $(date +%s) - START )) s" | tee -a "$OUT/timeline.txt"; }

stamp "set-up done"
# 1. JAX: the baseline (and its step breakdown) and each lever alone, in one process; a variant that ends
#    the process is recorded as such and the next process goes on with the rest.
SINGLES=(baseline upconv=subpixel_crop upconv=transpose conv_pad=folded kernel_regroup=transpose skip_concat=split
  adam_update=flat pad_out_channels=8)
for attempt in 1 2 3; do
  (( $(left) > 60 )) || break
  levers 40 --framework jax --variants "${SINGLES[@]}" --estimate 35 \
    --breakdown "baseline=$OUT/breakdown_baseline" --out "$OUT/jax.jsonl"
  [[ $($PY -c "import json,sys; print(len(open('$OUT/jax.jsonl').read().splitlines()))" 2>/dev/null) -ge ${#SINGLES[@]} ]] && break
done
# the variants no process reached, recorded (skipped, or ended their process) without running them
$PY $STUDY/levers.py run --config "$CONFIG" "${SETS[@]}" --framework jax --variants "${SINGLES[@]}" --deadline 1 \
  --out "$OUT/jax.jsonl"
stamp "JAX levers done"
# 2. JAX: whole-step command buffers (CUDA graphs), the baseline in a process with their flags.
FLAGS=$($PY -c "import sys; sys.path.insert(0, '$STUDY'); import levers; print(levers.COMMAND_BUFFER_FLAGS)")
XLA_FLAGS="${XLA_FLAGS:-} $FLAGS" levers 20 --framework jax --variants command_buffers --estimate 40 \
  --out "$OUT/jax.jsonl"
stamp "command buffers done"
# 3. The combination of the levers that helped, with its step breakdown.
$PY $STUDY/levers.py choose "$OUT/jax.jsonl" --out "$OUT/best.json" 2>&1 | tee -a "$OUT/levers.log"
TF_VARIANTS=(baseline)
if [[ -f $OUT/best.json ]]; then
  TF_VARIANTS=(best baseline)
  BEST_FLAGS=$($PY -c "import json; print(json.load(open('$OUT/best.json'))['xla_flags'])")
  XLA_FLAGS="${XLA_FLAGS:-} $BEST_FLAGS" levers 20 --framework jax --variants best --best "$OUT/best.json" \
    --estimate 60 --breakdown "best=$OUT/breakdown_best" --out "$OUT/jax.jsonl"
fi
stamp "JAX combination done"
# 4. The PyTorch reference.
if [[ $TORCH == 1 ]] && (( $(left) > 60 )); then
  timeout $(( $(left) - 20 )) $PY -m dlas_compare.benchmark --framework torch --mode synthetic --config "$CONFIG" \
    "${SETS[@]}" "${WINDOWS[@]}" --label "torch reference" --out "$OUT/torch.jsonl" 2>&1 | quiet | tail -3
fi
stamp "PyTorch done"
# 5. TF with the combination's forms (TF's own runtime), then TF's baseline if time is left.
if [[ $CONFIG != short_opt || -f /tmp/tf-env.sh ]] && (( $(left) > 70 )); then
  (
    if [[ $CONFIG == short_opt ]]; then
      source /tmp/tf-env.sh
      export TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
      $PY -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)" | tee -a "$OUT/device.txt"
    fi
    levers 10 --framework tf --variants "${TF_VARIANTS[@]}" --best "$OUT/best.json" --estimate 65 \
      --out "$OUT/tf.jsonl"
  )
  stamp "TF done"
else
  stamp "TF skipped ($(left) s left; TF's staged runtime /tmp/tf-env.sh $([[ -f /tmp/tf-env.sh ]] && echo found || echo missing))"
fi
for d in "$OUT"/breakdown_*; do [[ -f $d/hlo.txt ]] && gzip -f "$d/hlo.txt"; done
RECORDS=("$OUT/jax.jsonl")
for f in torch tf; do [[ -f $OUT/$f.jsonl ]] && RECORDS+=("$OUT/$f.jsonl"); done
$PY $STUDY/levers.py table "${RECORDS[@]}" --breakdowns "$OUT/breakdown_baseline" "$OUT/breakdown_best" | tee "$OUT/table.txt"
# a call returns at most 8 files of $OUT: the breakdown folders and bookkeeping go in one archive
( cd "$OUT" && tar czf raw.tar.gz --remove-files breakdown_* ./*.started timeline.txt 2>/dev/null )
