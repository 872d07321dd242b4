#!/bin/bash
# SLURM batch script, like the tutorial's submit scripts: one task per GPU, N nodes.
#   sbatch -N 2 scripts/launch/submit_slurm.sh jax bs512_opt
#   sbatch -N 2 scripts/launch/submit_slurm.sh tf  bs512_opt
# JAX: jax.distributed.initialize() reads the SLURM environment (coordinator = first node), each
#      task drives its GPU and loads its own data shard (replica index = global device index).
# TF:  MultiWorkerMirroredStrategy with the SLURM cluster resolver (one worker per task).
#SBATCH --job-name=dlas-cosmo
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=16
#SBATCH --time=01:00:00
#SBATCH --output=slurm-%j.out
set -euo pipefail
fw=${1:?usage: sbatch submit_slurm.sh jax|tf CONFIG [flags]}; cfg=${2:?config name}; shift 2
cd "${SLURM_SUBMIT_DIR:-.}"
export PYTHONUNBUFFERED=1
srun --cpu-bind=cores python3 -m ${fw}_impl.train --config "$cfg" --workdir "runs/${cfg}/${fw}-${SLURM_JOB_ID}" "$@"
