#!/usr/bin/env bash
# The fusion levers of the JAX train step on one H200, in one call of at most 9 minutes: the step breakdown
# (`python -m dlas_compare.step_breakdown`: SYNTHETIC steps of short_opt, batch 64, bf16, timed, then traced)
# of the baseline and of each lever alone, each variant in its own process (an XLA flag this XLA does not
# know aborts its process: that variant is recorded as failed and the call goes on), then the combination
# of the levers that shortened the step by more than 1% (table.py combination), then the baseline again
# (the call's noise) if time is left. Every compile is cold (a fresh cache folder per variant). A variant
# that would not end DEADLINE s after the start is skipped and recorded as such. The table printed last
# (table.py) gives per variant the step ms, samples/s, MFU by the datasheet and as a share of the
# measured matmul rate, the breakdown's kinds, and the change against the baseline.
#
# VARIANTS: ';'-separated entries NAME|KEY=VALUE ...|XLA flags ... (config overrides and XLA flags,
# each part space-separated and possibly empty; the first entry is the baseline); EXTRA_VARIANTS is
# appended to them. $OUT gets device.txt, run.log, table.txt and variants.tar.gz (one folder per
# variant: variant.json, breakdown.json, breakdown.md, stderr.log, trace.json.gz, hlo.txt.gz); a call
# returns at most 8 files of $OUT.
#
# On nvidia-h200, from the checkout's root, $OUT set (no data, no DALI, nothing carried):
#   bash experiments/step_fusion/run.sh
# The same processes and table on CPU with a tiny config (a smoke test, 2-3 min on 2 cores; the GPU's XLA
# flags are parsed there and change nothing; the extra variant checks that a bad flag is recorded):
#   OUT=/tmp/step_fusion_out CONFIG=cpu_tiny PY=.venv/bin/python \
#     EXTRA_VARIANTS="bad_flag||--xla_gpu_no_such_flag=true" bash experiments/step_fusion/run.sh
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
CONFIG=${CONFIG:-short_opt}
PY=${PY:-python3}
DEADLINE=${DEADLINE:-540}  # seconds after the start by which the call ends
TIMEOUT=${TIMEOUT:-120}    # most seconds one variant's process may run
EST=${EST:-45}             # seconds a variant takes (start, cold compile, steps, trace, tables)
WORK=${WORK:-/tmp/step_fusion_work}  # scratch, emptied first: not $OUT
STUDY=experiments/step_fusion
START=$(date +%s)
VARIANTS=${VARIANTS:-"baseline||;\
adam_flat|adam_update=flat|;\
conv_fusion||--xla_gpu_experimental_enable_conv_fusion=true;\
triton_fusions||--xla_gpu_experimental_all_fusions_with_triton=true;\
runtime_fusion||--xla_gpu_use_runtime_fusion=true;\
upconv_phases|upconv=phases|;\
pad_out16|pad_out_channels=16|;\
small_transpose|upconv_transpose_below=4|;\
skip_split|skip_concat=split|"}
[[ -n ${EXTRA_VARIANTS:-} ]] && VARIANTS="$VARIANTS;$EXTRA_VARIANTS"

[[ $(realpath -m "$WORK") != $(realpath -m "$OUT") ]] || { echo "error: WORK and OUT are one folder ($OUT); WORK is emptied first" >&2; exit 2; }
mkdir -p "$OUT"
rm -rf "$WORK" "$OUT/run.log" "$OUT/table.txt" "$OUT/variants.tar.gz"
mkdir -p "$WORK/variants"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [[ $CONFIG == short_opt ]]; then
  command -v nvidia-smi >/dev/null || { echo "error: run.sh needs an NVIDIA GPU (nvidia-smi not found)" >&2; exit 2; }
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt"
  STEPS=(--warmup 5 --steps 10)
else
  : > "$OUT/device.txt"
  STEPS=(--warmup 1 --steps 3)
fi
$PY - >> "$OUT/device.txt" 2>&1 <<'EOF'
import jax, jaxlib, flax, optax
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__, "optax", optax.__version__)
try:
    from jax._src.lib import cuda_versions
    print("cuDNN", cuda_versions.cudnn_get_version(), "CUDA runtime", cuda_versions.cuda_runtime_get_version())
except AttributeError:  # cuda_versions is None: no CUDA plugin (a CPU-only JAX)
    print("cuDNN: none (no CUDA plugin)")
EOF
echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ), config $CONFIG, XLA_FLAGS of the caller: '${XLA_FLAGS:-}'" >> "$OUT/device.txt"
cat "$OUT/device.txt"

left() { echo $((START + DEADLINE - $(date +%s))); }
say() { echo "[step_fusion] $* ($(( $(date +%s) - START )) s)" | tee -a "$OUT/run.log"; }
INDEX=0

# measure NAME "KEY=VALUE ..." "FLAGS ..." RESERVE: the step breakdown of one variant in its own process,
# in $WORK/variants/NN_NAME, recorded (variant.json) whatever happens; skipped when less than EST s
# would be left before the last RESERVE s of the call.
measure() {
  local name=$1 sets=$2 flags=$3 reserve=$4 kv rc t0
  INDEX=$((INDEX + 1))
  local dir=$WORK/variants/$(printf %02d "$INDEX")_$name cache=$WORK/xla/$name
  local -a args=()
  local limit=$(( $(left) - reserve ))
  if (( limit < EST )); then
    $PY $STUDY/table.py record "$dir" --index "$INDEX" --name "$name" --sets="$sets" --flags="$flags" \
      --skipped "no time left ($(left) s to the deadline, ${reserve} s kept for later stages)" | tee -a "$OUT/run.log"
    return
  fi
  (( limit > TIMEOUT )) && limit=$TIMEOUT
  for kv in $sets; do args+=(--set "$kv"); done
  mkdir -p "$dir"
  say "$name: ${sets:-no overrides}; XLA flags: ${flags:-none}; at most $limit s"
  t0=$(date +%s)
  XLA_FLAGS="${XLA_FLAGS:-} $flags" timeout -k 10 "$limit" $PY -m dlas_compare.step_breakdown --config "$CONFIG" \
    "${STEPS[@]}" --set "xla_cache_dir=$cache" "${args[@]}" --out "$dir" > "$dir/breakdown.md" 2> "$dir/stderr.log"
  rc=$?
  rm -rf "$cache"
  [[ -f $dir/hlo.txt ]] && gzip -f "$dir/hlo.txt"
  $PY $STUDY/table.py record "$dir" --index "$INDEX" --name "$name" --sets="$sets" --flags="$flags" --rc "$rc" \
    --wall_s $(( $(date +%s) - t0 )) | tee -a "$OUT/run.log"
  grep "^timed step" "$dir/breakdown.md" | tee -a "$OUT/run.log"
}

# 1. The baseline and each lever alone; the last 2 x EST s are kept for the combination and the repeat.
IFS=';' read -ra ENTRIES <<< "$VARIANTS"
for entry in "${ENTRIES[@]}"; do
  IFS='|' read -r name sets flags <<< "$entry"
  measure "$name" "$sets" "$flags" $((2 * EST))
done
# 2. The combination of the levers that shortened the step by more than 1%, when there are two or more.
if COMBO=$($PY $STUDY/table.py combination "$WORK/variants" 2>&1); then
  IFS='|' read -r sets flags winners <<< "$COMBO"
  say "combination of $winners"
  measure combination "$sets" "$flags" $((EST / 2))
else
  say "combination not run: $COMBO"
fi
# 3. The baseline again: the spread between its two steps is the call's noise.
IFS='|' read -r name sets flags <<< "${ENTRIES[0]}"
measure baseline_repeat "$sets" "$flags" 10

$PY $STUDY/table.py table "$WORK/variants" | tee "$OUT/table.txt"
tar czf "$OUT/variants.tar.gz" -C "$WORK" variants
say "done"
