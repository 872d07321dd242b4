#!/bin/bash
# SLURM batch script, like the tutorial's submit scripts: one task per GPU, N nodes.
#   sbatch -N 2 scripts/launch/submit_slurm.sh jax bs512_opt
#   sbatch -N 2 scripts/launch/submit_slurm.sh tf  bs512_opt
# Every task sees the node's 4 GPUs (--gpus-per-node, no --gpus-per-task) and drives GPU
# SLURM_LOCALID: no per-task device cgroup hides the other tasks' GPUs from NCCL's peer-to-peer paths. The trainers also run under --gpus-per-task=1 (each task drives the
# one GPU it sees); shared_data/runtime/launch.py says how a task finds its GPUs.
# JAX: jax.distributed.initialize() reads the SLURM step (coordinator = first node, port from the
#      job id, or JAX_COORDINATOR_PORT); each task loads its own data shard (replica = global device).
# TF:  MultiWorkerMirroredStrategy with the SLURM cluster resolver (one worker per task).
# Caches: JAX_COMPILATION_CACHE_DIR / TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=DIR put the
# compilation cache on scratch (default: .cache/xla under the submit folder).
# Preemption: 120 s before the time limit SLURM sends USR1 to every task (--signal without B:; with
# B: only this shell gets it); each rank saves at the next step boundary with the data cursor, the job
# requeues itself (--requeue allows it) and the requeued job (SLURM_RESTART_COUNT) resumes from there.
#SBATCH --job-name=dlas-cosmo
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --time=01:00:00
#SBATCH --output=slurm-%j.out
set -euo pipefail
if [[ -z "${SLURM_JOB_ID:-}" ]]; then
  echo "error: ${0##*/} is a SLURM batch script: submit it with sbatch -N NODES $0 jax|tf CONFIG" >&2
  exit 2
fi
fw=${1:?usage: sbatch submit_slurm.sh jax|tf CONFIG [flags]}; cfg=${2:?config name}; shift 2
cd "${SLURM_SUBMIT_DIR:-.}"
export PYTHONUNBUFFERED=1
srun --cpu-bind=cores python3 -m ${fw}_impl.train --config "$cfg" --workdir "runs/${cfg}/${fw}-${SLURM_JOB_ID}" "$@"
