#!/usr/bin/env bash
# One call on one GPU, DALI staged (experiments/gpu_machine/stage_dali.sh): the dali-device variants of
# variants.py through DALI's JAX iterator, checked bit for bit against the NumPy reader, then IO and FULL
# next to SYNTHETIC (same process), and the device loader's FULL (dlas_compare.benchmark), config
# short_opt (batch 64, bf16). The training volume is 256^3 of uniform random values in the tutorial's
# layout (speed only: the crops' values do not change the work). Records in $OUT; the table last.
#   CPU smoke test: OUT=/tmp/o SIDE=64 CONFIG=cpu_tiny bash experiments/dali_iterators/run.sh
set -uo pipefail
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
SIDE=${SIDE:-256} CONFIG=${CONFIG:-short_opt} STEPS=${STEPS:-40} DEPTHS=${DEPTHS:-2 3} VARIANTS=${VARIANTS:-production warp warp_cl passthrough gather}
mkdir -p "$OUT" data
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no GPU"
  python3 -c "import jax, flax, numpy, nvidia.dali as d; print('jax', jax.__version__, 'flax', flax.__version__, 'numpy', numpy.__version__, 'dali', d.__version__)"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee $OUT/device.txt
VOL=data/random_$SIDE.h5
python3 - "$VOL" "$SIDE" <<'PY'
import sys, h5py, numpy as np
path, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
with h5py.File(path + ".tmp", "w") as f:
    for key, c in (("Nbody", 4), ("Hydro", 5)):
        f.create_dataset(key, data=rng.uniform(-0.9, 0.9, (c, n, n, n)).astype(np.float32))
import os; os.replace(path + ".tmp", path)
print("wrote", path)
PY
SET="--set train_path=$VOL --set val_path=$VOL"
python3 experiments/dali_iterators/variants.py --config $CONFIG $SET --check 3 --full --steps $STEPS \
  --variants $VARIANTS --depths $DEPTHS --out $OUT/variants.jsonl 2>&1 | grep -v -i warning | tee $OUT/variants.log
python3 -m dlas_compare.benchmark --framework jax --config $CONFIG $SET --mode synthetic full \
  --data_loader_config device --label "jax device loader" --out $OUT/device_loader.jsonl 2>&1 | tail -3 | tee -a $OUT/variants.log
