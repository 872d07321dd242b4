# Sourced by the single-GPU scripts: environment, device and version record, and the data
# (generated on the device; the 256^3 training volume takes ~30 s). Needs $OUT.
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
python3 -c "import jax, flax, optax, torch, nvidia.dali as d; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, 'dali', d.__version__)" | tee -a $OUT/device.txt
mkdir -p data
python3 -m shared_data.generate --out data/train_256.h5 --size 256 --seed 1 --npy --if-missing > $OUT/generate.log 2>&1
python3 -m shared_data.generate --out data/val_128.h5 --size 128 --seed 2 --npy --if-missing >> $OUT/generate.log 2>&1
