"""A run's model is the one it evaluated: a run with a weight average (``ema_decay``) or a quality
target leaves the evaluated weights in its folder, and ``predict``/``export --workdir`` take them,
saying which; a checkpoint newer than them (the run continued) is taken instead, with a warning."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import run_in_process


@pytest.mark.slow
def test_predict_workdir_takes_the_weight_average_the_run_evaluated(tmp_path, tiny_argv, caplog):
    from shared_data.core import config as config_mod
    from shared_data.model import unet_spec

    from jax_impl import predict, train

    workdir = tmp_path / "w"
    res = run_in_process(train.main, [*tiny_argv, "--set", "ema_decay=0.5", "--workdir", str(workdir)])
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{workdir / 'weights.npz'} receives the weights this run evaluates" in caplog.text
    cfg = config_mod.load_config("cpu_tiny", overrides={"ema_decay": 0.5})
    saved = unet_spec.load_weights(workdir / "weights.npz", cfg)

    weights, source = predict.load_weights(cfg, None, str(workdir))
    assert source == f"the run's {workdir / 'weights.npz'} (the weight average it evaluated)"
    assert all(np.array_equal(weights[k], saved[k]) for k in saved)

    checkpoint, _ = predict.restore_checkpoint(cfg, workdir / "checkpoints", str(workdir))
    # an average over the epoch's steps with decay 0.5 is not the last step's weights
    assert any(not np.allclose(checkpoint[k], saved[k]) for k in saved)

    later = os.stat(workdir / "weights.npz").st_mtime + 10
    for f in (workdir / "checkpoints").rglob("*"):
        os.utime(f, (later, later))
    weights, source = predict.load_weights(cfg, None, str(workdir))
    assert source.startswith(f"checkpoint {workdir / 'checkpoints'} epoch 1")
    assert all(np.array_equal(weights[k], checkpoint[k]) for k in saved)
    assert "evaluated a weight average (ema_decay 0.5) and left no current weights.npz" in caplog.text
