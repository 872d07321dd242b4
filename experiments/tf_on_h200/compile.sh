#!/usr/bin/env bash
# Where TF's cold train-step compile goes (38.2 s against JAX's 19.7 s on short_opt): the same
# SYNTHETIC benchmark from an empty XLA cache under XLA flag variants, each with its compile time and
# step speed, plus an HLO dump of the default to count the modules TF compiles. Needs TF staged.
# Results under $OUT (~5 min).
#   bash experiments/tf_on_h200/compile.sh
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 TF_FORCE_GPU_ALLOW_GROWTH=true TF_CPP_MIN_LOG_LEVEL=2
[[ -f /tmp/tf-env.sh ]] && source /tmp/tf-env.sh
base_flags=$XLA_FLAGS
for variant in default "--xla_gpu_autotune_level=2" "--xla_gpu_force_compilation_parallelism=16" "--xla_gpu_autotune_level=0"; do
  rm -rf .cache/xla /tmp/hlo
  flags=$base_flags; [[ $variant != default ]] && flags="$base_flags $variant"
  dump=""; [[ $variant == default ]] && dump="--xla_dump_to=/tmp/hlo"
  XLA_FLAGS="$flags $dump" timeout 110 python3 -m dlas_compare.benchmark --framework tf --config short_opt --mode synthetic \
    --warmup 3 --steps 20 --windows 3 --label "tf $variant" --out $OUT/compile.jsonl 2>&1 | grep -v "^W0000\|^I0000" | tail -1
  [[ $variant == default ]] && ls /tmp/hlo | grep -c "after_optimizations.txt" | sed 's/^/HLO modules compiled: /' | tee $OUT/hlo_modules.txt
done
python3 -m dlas_compare.benchmark --help >/dev/null && python3 - <<'PY'
import json, os
for line in open(os.environ["OUT"] + "/compile.jsonl"):
    r = json.loads(line)
    print(f"{r['label']:<50} compile {r['compile_sec']:6.1f} s   {r['samples_per_sec']:8.1f} samples/s")
PY
