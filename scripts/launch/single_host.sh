#!/usr/bin/env bash
# Data-parallel training on one host with N GPUs.
#   bash scripts/launch/single_host.sh jax bs256_opt [more train.py flags]
#   bash scripts/launch/single_host.sh tf  bs256_opt
# One process (default):
#   JAX: one process drives every local GPU; the batch is sharded over a device mesh inside the one
#        jitted step (XLA inserts the gradient all-reduce).
#   TF:  one process, MirroredStrategy over the local GPUs (NCCL all-reduce).
# NPROC=N processes (one per GPU share, as on a cluster; process 0 logs, the others print warnings and
# errors tagged [rank i]):
#   NPROC=2 bash scripts/launch/single_host.sh jax bs256_opt
#   JAX: JAX_COORDINATOR_ADDRESS=localhost:$PORT, JAX_NUM_PROCESSES=N, JAX_PROCESS_ID=i, and
#        JAX_LOCAL_DEVICE_IDS = process i's share of the GPUs nvidia-smi lists (none on a CPU host).
#   TF:  TF_CONFIG with N workers on localhost:$PORT.. and CUDA_VISIBLE_DEVICES = worker i's share.
# The global batch is global_batch_size (or local_batch_size x GPUs); lr_scaling/warmup_steps in the
# config scale the LR with it. NCCL's NVLink multicast stays as the machine sets it.
set -euo pipefail
fw=${1:?usage: [NPROC=N] single_host.sh jax|tf CONFIG [flags]}; cfg=${2:?config name}; shift 2
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PY:-python3}
NPROC=${NPROC:-1}
if ! [[ $NPROC =~ ^[0-9]+$ ]] || (( 10#$NPROC < 1 )); then
  echo "error: NPROC=$NPROC: expected a whole number of processes, at least 1" >&2; exit 2
fi
NPROC=$(( 10#$NPROC ))
if [[ $NPROC -le 1 ]]; then
  exec $PY -m ${fw}_impl.train --config "$cfg" "$@"
fi
PORT=${PORT:-12355}
if ! [[ $PORT =~ ^[0-9]+$ ]] || (( 10#$PORT < 1024 || 10#$PORT + NPROC - 1 > 65535 )); then
  echo "error: PORT=$PORT: expected a port number in 1024-$(( 65536 - NPROC )) (process i listens on PORT + i)" >&2; exit 2
fi
PORT=$(( 10#$PORT ))
gpus=$( (nvidia-smi --list-gpus 2>/dev/null || true) | grep -c '^GPU ' || true)
if (( gpus > 0 && gpus % NPROC )); then
  echo "error: $gpus GPUs do not divide over NPROC=$NPROC processes" >&2; exit 2
fi
per=$(( gpus / NPROC ))
share() { [[ $per -gt 0 ]] && seq -s, $(( $1 * per )) $(( ($1 + 1) * per - 1 )) || true; }
workers=$(for i in $(seq 0 $((NPROC - 1))); do printf '"localhost:%d",' $((PORT + i)); done)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for i in $(seq 0 $((NPROC - 1))); do
  if [[ $fw == jax ]]; then
    ids=$(share "$i")
    env JAX_COORDINATOR_ADDRESS="localhost:$PORT" JAX_NUM_PROCESSES="$NPROC" JAX_PROCESS_ID="$i" \
      ${ids:+JAX_LOCAL_DEVICE_IDS="$ids"} $PY -m jax_impl.train --config "$cfg" "$@" &
  else
    ids=$(share "$i")
    env TF_CONFIG="{\"cluster\": {\"worker\": [${workers%,}]}, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      ${ids:+CUDA_VISIBLE_DEVICES="$ids"} $PY -m tf_impl.train --config "$cfg" "$@" &
  fi
  pids+=($!)
done
# The first process to fail stops the others. They end by themselves once they see it gone (one
# error: line each, naming it, within seconds while they train), so they get 10 s to; those still
# running then (waiting for it at the start, or compiling) get SIGTERM, and so does the watchdog
# process beside a TF process waiting at the start: TF's coordination service keeps a SIGTERM sent
# to that process alone (shared_data/runtime/launch.py, watch), the watchdog passes it on.
stop_others() {
  local polls=0
  while [[ -n $(jobs -rp 2>/dev/null) ]] && (( polls < 50 )); do sleep 0.2; polls=$((polls + 1)); done
  for p in $(jobs -rp 2>/dev/null); do
    pkill -TERM -P "$p" -f 'launch\.watch' 2>/dev/null || true
    kill -TERM "$p" 2>/dev/null || true
  done
}
# A process killed by a signal it cannot handle (kill -9, the OOM killer, a native abort) prints no line
# of the kit's: the first one is named here, in place of bash's own notice of it ("line N: PID Killed
# ...", silenced). Exit codes 130, 138 and 143 are the trainers' own after their stop line (SIGINT,
# SIGUSR1, SIGTERM).
status=0
for _ in "${pids[@]}"; do
  wait -n -p ended 2>/dev/null || {
    rc=$?
    if [[ $status -eq 0 ]]; then
      status=$rc
      for i in "${!pids[@]}"; do
        if [[ ${pids[$i]} == "$ended" ]] && (( rc > 128 )) && [[ ! " 130 138 143 " =~ " $rc " ]]; then
          echo "error: process $i of $NPROC (pid $ended) was killed by SIG$(kill -l $((rc - 128))) (exit code $rc); the others are stopped" >&2
        fi
      done
    fi
    stop_others
  }
done
trap - EXIT
exit $status
