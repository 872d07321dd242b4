#!/usr/bin/env bash
# One experiment on 1 to 4 replicas, both frameworks: cpu_tiny for 2 epochs at its global batch of 4
# on 1 device, 2 devices in one process, 2 and 4 processes (single_host.sh) and 2 and 4 SLURM tasks
# (submit_slurm.sh), then the table of their losses (table.py). A few minutes on 2 cores.
#   bash experiments/scaling_cpu/run.sh         (from the checkout's root, environment active)
# Data: data/train_32.h5 and data/val_24.h5, generated here where missing. SLURM: the one that sinfo
# reaches, else a one-node SLURM of scripts/slurm_local.sh started for the run (root, or slurm-wlm
# installed) and stopped after it. PY=/path/to/python (default python3).
set -euo pipefail
here=experiments/scaling_cpu
res=$here/results runs=runs/scaling_cpu
PY=${PY:-python3}
export PY PYTHONPATH=. TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 JAX_PLATFORMS=cpu
mkdir -p "$res" data
rm -rf "$runs"
$PY -m shared_data.data.generate --out data/train_32.h5 --size 32 --seed 1 --box 8 --if-missing
$PY -m shared_data.data.generate --out data/val_24.h5 --size 24 --seed 2 --box 6 --if-missing
args=(cpu_tiny --set train_path=data/train_32.h5 --set val_path=data/val_24.h5 --set num_epochs=2)
one_device="XLA_FLAGS=--xla_force_host_platform_device_count=1"

if ! sinfo -h >/dev/null 2>&1; then
  slurm_dir=$(mktemp -d /tmp/dlas-scaling-slurm.XXXXXX)
  trap 'bash scripts/slurm_local.sh stop "$slurm_dir"' EXIT
  eval "$(DLAS_SLURM_CPUS=4 bash scripts/slurm_local.sh start "$slurm_dir")"
fi

for fw in jax tf; do
  echo "== $fw: 1 device"
  env $one_device $PY -m ${fw}_impl.train --config "${args[@]}" --num_devices 1 --workdir $runs/$fw-1-device
  echo "== $fw: 2 devices in one process"
  if [[ $fw == jax ]]; then
    env XLA_FLAGS=--xla_force_host_platform_device_count=2 \
      $PY -m jax_impl.train --config "${args[@]}" --num_devices 2 --workdir $runs/$fw-2-devices
  else
    $PY $here/tf_devices.py 2 --config "${args[@]}" --workdir $runs/$fw-2-devices
  fi
  for n in 2 4; do
    echo "== $fw: $n processes (single_host.sh)"
    env $one_device NPROC=$n PORT=$((20000 + RANDOM % 20000)) \
      bash scripts/launch/single_host.sh $fw "${args[@]}" --workdir $runs/$fw-$n-processes
    echo "== $fw: $n SLURM tasks (submit_slurm.sh)"
    env $one_device sbatch --wait -N 1 --ntasks-per-node=$n --cpus-per-task=1 --output=$runs/$fw-$n-tasks.out \
      scripts/launch/submit_slurm.sh $fw "${args[@]}" --workdir $runs/$fw-$n-tasks
    cat $runs/$fw-$n-tasks.out
  done
done 2>&1 | tee "$res/run.log"
$PY $here/table.py $runs | tee "$res/losses.md"
