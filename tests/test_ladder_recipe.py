"""experiments/ladder_h200/run.sh runs on CPU with a tiny config (CONFIG=cpu_tiny): the GPU recipe's
ladder command with the same flags, all three frameworks, its schedule said first and its budget
stopping it, so the recorded H200 call cannot fail on a typo."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from shared_data.core.config import REPO_ROOT

pytestmark = pytest.mark.slow


def test_recipe_smoke_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "WORK": str(tmp_path / "work"), "CONFIG": "cpu_tiny", "BUDGET": "25"}
    env["PY"] = sys.executable
    res = subprocess.run(["bash", "experiments/ladder_h200/run.sh"], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    log = (out / "ladder_cpu_tiny.log").read_text().splitlines()
    schedule = next(
        i for i, line in enumerate(log) if line.startswith("[ladder] schedule: 12 rungs run in 5 processes")
    )
    first = "[ladder] jax rungs 1, 2, 3, 4 in one process: XLA_FLAGS="
    assert schedule < next(i for i, line in enumerate(log) if line.startswith(first))
    command = next(line for line in log if line.startswith(first))
    assert "--config cpu_tiny" in command and "--steps 40 --windows 2 --window_sec 0.50 --min_window_steps 5" in command
    summaries = [json.loads(line) for line in (out / "ladder_cpu_tiny.jsonl").read_text().splitlines()]
    summaries = [s for s in summaries if s.get("record") == "ladder_summary"]
    # each framework's first process, then JAX's second (rung 5: the kit's XLA flags), then the
    # data-parallel rungs on 2 CPU devices, each a process of its own
    assert [(s["framework"], s["ladder_step"]) for s in summaries] == [("jax", i) for i in range(1, 5)] + [
        ("tf", i) for i in range(1, 7)
    ] + [("torch", i) for i in range(1, 8)] + [("jax", i) for i in range(5, 8)] + [("tf", 7)]
    assert summaries[0]["status"] == "ran" and summaries[0]["full_samples_per_sec"] > 0
    assert {s["status"] for s in summaries} <= {"ran", "stopped", "skipped"}
    if importlib.util.find_spec("torch") is None:
        assert {s["reason"] for s in summaries if s["framework"] == "torch"} == {"torch is not installed"}
    assert (out / "ladder_cpu_tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "the ladder's budget: " in (out / "timeline.txt").read_text()
