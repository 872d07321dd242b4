"""The GPU diagnostic scripts run on CPU too (2 host devices): the all-reduce schedule report and
the manual-PGLE comparison (empty profile on a CPU) and the scaling-gap variants, so a device session does not find them broken."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from shared_data.config import REPO_ROOT


def _run(script, tiny_cfg, *args):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, f"scripts/gpu/{script}", "--config", "cpu_tiny", "--set", f"train_path={tiny_cfg.train_path}",
                           "--set", f"val_path={tiny_cfg.val_path}", "--set", f"xla_cache_dir={tiny_cfg.xla_cache_dir}",
                           "--num_devices", "2", "--local_batch_size", "2", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)


def test_allreduce_schedule_reports_the_gradient_sums(tiny_cfg):
    res = _run("allreduce_schedule.py", tiny_cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    # cpu_tiny: 3 levels, 17 convolutions in the step; XLA:CPU sums f32
    assert "17 convolutions" in lines[0]
    assert any(" all-reduce" in line and "f32" in line for line in lines[1:-1])
    assert lines[-1].startswith("total all-reduced:") and lines[-1].endswith("MiB per step")
    bad = _run("allreduce_schedule.py", tiny_cfg, "--num_devices", "3")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == "error: --num_devices 3: this process sees 2 cpu device(s)"


def test_manual_pgle_times_both_steps(tiny_cfg, tmp_path):
    out = tmp_path / "r.jsonl"
    res = _run("manual_pgle.py", tiny_cfg, "--steps", "2", "--windows", "2", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "PGLE profile: 0 bytes" in res.stdout  # JAX fills it only on NVIDIA GPUs
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in records] == ["jax 2 GPUs, default", "jax 2 GPUs, manual PGLE"]
    assert all(r["global_batch"] == 4 and r["samples_per_sec"] > 0 for r in records)


def test_scaling_gap_times_the_four_steps(tiny_cfg, tmp_path):
    out = tmp_path / "r.jsonl"
    res = _run("scaling_gap.py", tiny_cfg, "--steps", "2", "--windows", "2", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in records] == ["jax 1 device", "jax 2 devices, sharded", "jax 2 devices, shard_map pmean",
                                             "jax 2 devices, shard_map local"]
    assert [r["global_batch"] for r in records] == [2, 4, 4, 4]
    assert all(r["samples_per_sec"] > 0 for r in records)
