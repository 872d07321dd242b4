#!/usr/bin/env bash
# Data-parallel training on one host with N GPUs.
#   bash scripts/launch/single_host.sh jax bs256_opt [more train.py flags]
#   bash scripts/launch/single_host.sh tf  bs256_opt
# JAX: one process drives every local GPU; the batch is sharded over a device mesh inside the one
#      jitted step (XLA inserts the gradient all-reduce).
# TF:  one process, MirroredStrategy over the local GPUs (NCCL all-reduce).
# The global batch is global_batch_size (or local_batch_size x GPUs); lr_scaling/warmup_steps in the
# config scale the LR with it. NCCL's NVLink multicast stays as the machine sets it.
set -euo pipefail
fw=${1:?usage: single_host.sh jax|tf CONFIG [flags]}; cfg=${2:?config name}; shift 2
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PY:-python3}
exec $PY -m ${fw}_impl.train --config "$cfg" "$@"
