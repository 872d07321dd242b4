"""Results follow the run they come from: a resumed run updates the weights file an earlier
``--save_weights`` left in its folder, a run past its ``num_epochs`` says where it is, and
``compare.plots`` says which weights it validates, when they are older than the run, and when there
are none."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from dlas_compare import plots
from shared_data.model import unet_spec

from jax_impl import train as jax_train


@pytest.mark.slow
def test_resume_updates_the_weights_in_the_run_folder(tiny_cfg, tiny_argv, tmp_path, caplog):
    run = tmp_path / "jax"
    weights = run / "weights.npz"
    assert jax_train.main([*tiny_argv, "--workdir", str(run), "--save_weights", str(weights)]) == 0
    first = dict(np.load(weights))
    assert jax_train.main([*tiny_argv, "--workdir", str(run), "--resume", "--set", "num_epochs=2"]) == 0
    second = unet_spec.load_weights(weights, tiny_cfg)
    assert any(not np.array_equal(first[k], second[k]) for k in first)  # epoch 2's weights, not epoch 1's
    assert f"{weights} is updated at the end of this run (an earlier --save_weights wrote it)" in caplog.text
    assert (run / "out.log").read_text().count(f"wrote {weights}") == 2
    assert jax_train.main([*tiny_argv, "--workdir", str(run), "--resume"]) == 0
    log = (run / "out.log").read_text()
    assert "this run is at epoch 2, past num_epochs = 1: nothing to train (--set num_epochs=N, N > 2" in log


def test_plots_names_stale_and_missing_weights(tmp_path, monkeypatch, capsys):
    run = tmp_path / "jax"
    run.mkdir()
    weights = run / "weights.npz"
    weights.write_bytes(b"")
    (run / "metrics.jsonl").write_text('{"epoch": 5, "train_loss": 0.1, "val_loss": 0.1}\n')
    now = time.time()
    os.utime(weights, (now - 60, now - 60))
    note = plots.stale_weights_note(weights, run)
    assert note == (
        f"warning: {weights} is older than epoch 5 of the run in {run}: the figure validates an earlier model "
        "(the trainer with --resume --save_weights rewrites it)"
    )
    os.utime(weights, (now + 60, now + 60))
    assert plots.stale_weights_note(weights, run) is None
    monkeypatch.chdir(tmp_path)
    assert plots.main(["--config", "cpu_tiny", "--out", str(tmp_path / "fig")]) == 0
    want = tmp_path / "runs/cpu_tiny/jax/weights.npz"
    printed = capsys.readouterr().out.strip()
    assert printed.endswith(
        f"no validation figure: {want} not found (the trainers write it with --save_weights {want}; "
        "--weights W.npz takes any other)"
    )
