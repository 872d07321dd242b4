#!/bin/bash
# SLURM batch script, like the tutorial's submit scripts: one task per GPU (or per CPU share), N nodes.
#   sbatch -N 2 --gpus-per-node=4 scripts/launch/submit_slurm.sh jax bs512_opt [train.py flags]
#   sbatch -N 2 --gpus-per-node=4 scripts/launch/submit_slurm.sh tf  bs512_opt
#   sbatch -N 1 --ntasks-per-node=2 --cpus-per-task=1 scripts/launch/submit_slurm.sh jax cpu_tiny   (CPU nodes)
# Adapt it with sbatch options (the command line wins over the #SBATCH lines below) or in those lines:
#   GPUs    --gpus-per-node=G with --ntasks-per-node=G: one task per GPU. Without a GPU option the job
#           asks for none and runs on CPU nodes (JAX_PLATFORMS=cpu keeps JAX off a GPU it would find).
#   nodes   -N NODES; the global batch is global_batch_size, else local_batch_size x tasks.
#   CPUs    --cpus-per-task=C for each task's loader workers; --overcommit runs more tasks than CPUs.
#   time    --time=HH:MM:SS, the job's limit; --stop_after_epoch and --resume split a run over jobs.
#   signal  --signal=B:USR1@120 has SLURM signal the batch shell 120 s before the time limit.
#   python  PY=/path/to/python (default python3), exported to the job with the rest of the environment.
# The run folder is runs/CONFIG/FW-JOBID under the submit folder (a --workdir flag overrides it).
# Every task sees the node's GPUs (--gpus-per-node, no --gpus-per-task) and drives GPU SLURM_LOCALID: no
# per-task device cgroup hides the other tasks' GPUs from NCCL's peer-to-peer paths. The trainers also run
# under --gpus-per-task=1 (each task drives the one GPU it sees); shared_data/runtime/launch.py says how a
# task finds its GPUs.
# JAX: jax.distributed.initialize() reads the SLURM step (coordinator = first node, port from the
#      job id, or JAX_COORDINATOR_PORT); each task loads its own data shard (replica = global device).
# TF:  MultiWorkerMirroredStrategy with the SLURM cluster resolver (one worker per task; ports from the
#      job id, or DLAS_TF_PORT).
# DLAS_START_TIMEOUT (seconds, default 300): how long a task waits for the others to join.
# Caches: JAX_COMPILATION_CACHE_DIR / TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=DIR put the
# compilation cache on scratch (default: .cache/xla under the submit folder).
# Preemption: 120 s before the time limit SLURM sends USR1 to every task (--signal without B:; with
# B: only this shell gets it); each rank saves at the next step boundary with the data cursor, the job
# requeues itself (--requeue allows it) and the requeued job (SLURM_RESTART_COUNT) resumes from there.
#SBATCH --job-name=dlas-cosmo
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --ntasks-per-node=4
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
srun --cpu-bind=cores "${PY:-python3}" -m "${fw}_impl.train" --config "$cfg" --workdir "runs/${cfg}/${fw}-${SLURM_JOB_ID}" "$@"
