#!/usr/bin/env bash
# Loss levers against the same clock, in JAX on one H200 in one call (<= 9.5 min): each entry of
# LEVERS (';'-separated, each a space-separated list of KEY=VALUE config overrides, "base" for none)
# trains config short_opt (`device` loader, bf16) for ~70-80 s: epochs of 32768 crops (7-9 s of
# steps), the cosine schedule over 5 epochs, a budget of 100 s from the trainer's start, a quality
# evaluation after each epoch. The table printed last gives each run's metrics at its end and its
# best shortfall against the time; curve.png shows the shortfall against time.
#
# Default LEVERS: the next round on top of the first round's winner (the loss in physical units with
# the Fourier-space L1, shortfall 1.88 after 76 s): the winner again (the same clock, and its
# run-to-run spread), + the weight average (ema_decay 0.999, ~2 epochs of 512 steps), + start_lr 5e-4
# and 1e-3 (2.5x and 5x the config's 2e-4; no warm-up at batch 64). Four runs of ~80 s, ~6 min a call.
# The first round: LEVERS="base;lambda_rho=0.01;lambda_fourier=1.0;loss_space=physical".
#
# On nvidia-h200, from the checkout's root, $OUT set:
#   bash experiments/time_to_quality/levers.sh
# The same on CPU with a tiny config (a smoke test, ~2 min on 2 cores):
#   OUT=/tmp/out CONFIG=cpu_tiny bash experiments/time_to_quality/levers.sh
set -uo pipefail
source experiments/time_to_quality/setup.sh
WINNER="loss_space=physical lambda_fourier=1.0"
LEVERS=${LEVERS:-$WINNER;$WINNER ema_decay=0.999;$WINNER start_lr=5e-4;$WINNER start_lr=1e-3}
if [[ $CONFIG == short ]]; then
  RECIPE=(--Nsamples 32768 --num_epochs 5 --set quality_budget_sec=100)
else
  RECIPE=(--Nsamples 16 --num_epochs 2 --set quality_budget_sec=60)
fi
run_levers jax 120
rc=$?
$PY experiments/time_to_quality/table.py "$WORK/records" --plot "$OUT/curve.png" | tee "$OUT/table.txt"
exit $rc
