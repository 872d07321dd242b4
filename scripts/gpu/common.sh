# Sourced by the GPU recipes (run from the checkout's root on the GPU machine, $OUT set): the
# environment (the checkout first on PYTHONPATH), a record of the device and of every installed
# version, and the data (generated there; the 256^3 training volume of the linear gas takes ~150 s of
# CPU on the 2-core machine, experiments/generator_lattice, the nonlinear gas ~1.4x that,
# experiments/nonlinear_gas). Two files in $OUT: device.txt, and setup.log (the installed
# packages, then the data's generation): a call returns at most 8 of $OUT's files. GAS=filtered makes
# the data with the linear gas (generate --gas filtered) as data/train_256_filtered.h5 and
# data/val_128_filtered.h5; the default is the nonlinear gas in data/train_256.h5 and data/val_128.h5.
# DM picks the dark matter: zeldovich (the default here: generator v4's files, bit for bit, on which
# every recorded GPU result was measured) or nbody (the generator's default since v5; the files get an
# _nbody suffix, e.g. data/train_256_nbody.h5).
command -v nvidia-smi >/dev/null || { echo "error: ${0##*/} needs an NVIDIA GPU (nvidia-smi not found)" >&2; exit 2; }
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/device.txt
python3 - << 'PY' | tee -a $OUT/device.txt
import importlib
found = []
for name, module in (("jax", "jax"), ("jaxlib", "jaxlib"), ("flax", "flax"), ("optax", "optax"), ("numpy", "numpy"),
                     ("torch", "torch"), ("dali", "nvidia.dali")):
    try:
        found.append(f"{name} {getattr(importlib.import_module(module), '__version__', '?')}")
    except ImportError:
        found.append(f"{name} not installed")
    except Exception as err:  # a library that is there but does not load (CUDA libraries)
        found.append(f"{name} does not import ({type(err).__name__})")
print(", ".join(found))
PY
df -h /dev/shm | tail -1 | sed 's/^/shared memory (lowmem workers): /' | tee -a $OUT/device.txt
python3 -m pip list --format=freeze 2>/dev/null > $OUT/setup.log
mkdir -p data
GAS=${GAS:-nonlinear}
DM=${DM:-zeldovich}
DATA_SUFFIX=$([[ $GAS == nonlinear ]] || echo "_$GAS")$([[ $DM == zeldovich ]] || echo "_$DM")
python3 -m shared_data.data.generate --out data/train_256$DATA_SUFFIX.h5 --size 256 --seed 1 --gas $GAS --dm $DM --npy --if-missing >> $OUT/setup.log 2>&1
python3 -m shared_data.data.generate --out data/val_128$DATA_SUFFIX.h5 --size 128 --seed 2 --gas $GAS --dm $DM --npy --if-missing >> $OUT/setup.log 2>&1
