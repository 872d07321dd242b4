"""experiments/trained_model/run.sh runs on CPU with a tiny config (CONFIG=cpu_tiny): every command of
the GPU recipe (train, save weights, predict fp32 / bf16 / crop-wise, validate) with the same flags,
so the recorded H200 run cannot fail on a typo."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shared_data.core.config import REPO_ROOT

pytestmark = pytest.mark.slow


def test_recipe_smoke_on_cpu(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "CONFIG": "cpu_tiny", "PY": sys.executable}
    script = ["bash", "experiments/trained_model/run.sh"]
    res = subprocess.run(script, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["epoch"] == 1
    for variant, precision, windows in (("fp32", "float32", 1), ("bf16", "bfloat16", 1), ("crops", "float32", 8)):
        record = json.loads((out / f"validate_{variant}" / "validation.json").read_text())
        attrs = record["prediction_attributes"]
        assert attrs["prediction_precision"] == precision and attrs["prediction_framework"] == "jax"
        assert attrs["prediction_tiling"]["windows"] == windows
        assert (out / f"validate_{variant}" / "validation.png").stat().st_size > 50_000
    assert "overlap 0 < receptive margin 21" in (out / "predict_crops.log").read_text()
