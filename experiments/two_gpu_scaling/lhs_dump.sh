#!/usr/bin/env bash
# On nvidia-h200-x2 (no DALI): why XLA's latency-hiding scheduler leaves the gradient all-reduces of
# the 2-GPU JAX step exposed. Compiles the step once with the scheduler pass dumped and its VLOG on;
# writes $OUT/lhs_dump.tgz (HLO before/after the scheduler) and $OUT/lhs_vlog.txt.gz.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.6
export XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_pass_re=.*[Ss]chedul.* --xla_dump_hlo_module_re=.*train_step.*"
export TF_CPP_VMODULE=latency_hiding_scheduler=2 TF_CPP_MIN_LOG_LEVEL=0
python3 experiments/two_gpu_scaling/allreduce_schedule.py --config short_opt --num_devices 2 --local_batch_size 64 \
  --set xla_cache_dir=/tmp/nocache 2> /tmp/vlog.txt | tail -12
ls -la /tmp/vlog.txt; grep -c "" /tmp/vlog.txt; head -c 40000000 /tmp/vlog.txt | gzip > $OUT/lhs_vlog.txt.gz
ls /tmp/dump | grep -i sched | head -20
tar czf $OUT/lhs_dump.tgz -C /tmp dump --exclude='*.pb' 2>/dev/null; ls -la $OUT
