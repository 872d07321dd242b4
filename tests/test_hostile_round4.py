"""Hostile input, round 4: damaged run records (a stop's data cursor, a checkpoint's checksum record)
are a warning and the resume rule's fallback, never a resume blocked until a user deletes files;
values the model cannot fit, seeds, paths and nesting that break a command end in one ``error:``
line before any work; the study scripts read torn and foreign records in one line."""

from __future__ import annotations

import json
import signal
import types

import pytest
from conftest import RUN_OF_3_EPOCHS, assert_one_error_line, checkpoint_epochs, run_in_process, train_with_signal_at

from shared_data.core import config as config_mod
from shared_data.runtime import resume as resume_mod

STEPS = 4  # steps per epoch of the stopped runs: Nsamples 16, global batch 4


def _sound_cursor() -> dict:
    """A cursor as a stop at epoch 2, step 4 of 4 writes it."""
    return dict(epoch=1, step=3, global_step=STEPS + 3, steps_per_epoch=STEPS, losses=[0.5, 0.4, 0.3])


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (dict(step=1256, global_step=STEPS + 1256), "has step 1256, beyond an epoch of 4 steps"),
        (dict(global_step=None), "has no 'global_step'"),
        (dict(losses=None), "has no 'losses'"),
        (dict(losses=3), "has losses = 3, expected a list of numbers"),
        (dict(losses=["a", 1, 2]), "has losses = ['a', 1, 2], expected a list of numbers"),
        (dict(losses=[0.5] * 150), "has 150 losses for its 3 steps of the epoch"),
        (dict(epoch=50), "has global_step 7, expected epoch x steps_per_epoch + step = 203"),
        (
            dict(epoch=50, global_step=50 * STEPS + 3),
            "is in epoch 51, beyond the run's checkpoints (the newest is of epoch 1)",
        ),
        (dict(step=-1, global_step=STEPS - 1), "has step = -1, expected a count (an integer >= 0)"),
        (dict(step="3"), "has step = '3', expected a count (an integer >= 0)"),
        (dict(epoch=True), "has epoch = True, expected a count (an integer >= 0)"),
        (dict(steps_per_epoch=8), "steps_per_epoch"),  # another global batch: not damage
        ({}, None),
    ],
)
def test_cursor_problem_names_what_is_wrong(change, problem):
    cursor = _sound_cursor()
    for key, value in change.items():
        if value is None:
            del cursor[key]
        else:
            cursor[key] = value
    assert resume_mod.cursor_problem(cursor, STEPS, 1) == problem
    assert resume_mod.cursor_problem([cursor], STEPS, 1) == "is a JSON list, expected an object"


def test_a_long_value_in_a_cursor_is_quoted_short():
    cursor = {**_sound_cursor(), "losses": "x" * 10**6}
    problem = resume_mod.cursor_problem(cursor, STEPS, 1)
    assert problem.startswith("has losses = 'xxx") and problem.endswith(
        "(1000002 characters), expected a list of numbers"
    )
    assert len(problem) < 150


@pytest.mark.parametrize("text", ['{"epo', "\xff\xfe", ""])
def test_a_cursor_that_does_not_parse_is_kept_aside(tmp_path, caplog, text):
    """Read twice: the second resume no longer meets the cursor (the folder is kept aside once)."""
    mid = tmp_path / "mid_epoch"
    mid.mkdir()
    (mid / "cursor.json").write_bytes(text.encode("latin-1"))
    folder = types.SimpleNamespace(mid_epoch_dir=mid, steps_per_epoch=STEPS, main=True)
    assert resume_mod.mid_epoch_cursor(folder, 1) is None
    assert f"{mid / 'cursor.json'} does not parse (" in caplog.text
    assert f"kept as {tmp_path / 'mid_epoch.damaged'}" in caplog.text
    assert not mid.exists() and (tmp_path / "mid_epoch.damaged" / "cursor.json").read_bytes() == text.encode("latin-1")
    mid.mkdir()  # a second damaged save keeps the first one
    (mid / "cursor.json").write_text("[]")
    assert resume_mod.mid_epoch_cursor(folder, 1) is None
    assert (tmp_path / "mid_epoch.damaged.2" / "cursor.json").read_text() == "[]"


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_damaged_cursor_resumes_from_the_epoch_checkpoint(framework, tiny_cfg, tiny_argv, tmp_path, monkeypatch):
    """A stop's cursor with a step beyond the epoch ended the resume in ``UnboundLocalError`` (every
    later --resume too, until mid_epoch/ was deleted by hand): one warning naming the file and what
    is wrong, the folder kept aside, and epoch 2 trained from the checkpoint of epoch 1."""
    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    workdir = tmp_path / "w"
    cfg = config_mod.load_config(
        "cpu_tiny", overrides={**config_mod.config_dict(tiny_cfg), "num_epochs": 2, "Nsamples": 4 * STEPS}
    )
    stopped = train_with_signal_at(train, monkeypatch, STEPS + 2, signal.SIGTERM, cfg, workdir, num_devices=1)
    assert "at epoch 2, step 4 of 4" in str(stopped)
    path = workdir / "mid_epoch" / "cursor.json"
    cursor = json.loads(path.read_text())
    assert cursor["global_step"] == STEPS + 3
    path.write_text(json.dumps({**cursor, "step": 1256}))
    argv = [*tiny_argv, "--set", "num_epochs=2", "--set", f"Nsamples={4 * STEPS}", "--num_devices", "1"]
    res = run_in_process(train.main, [*argv, "--workdir", str(workdir), "--resume"])
    assert res.returncode == 0, res.stderr[-2000:]
    kept = workdir / "mid_epoch.damaged"
    assert f"{path} has step 1256, beyond an epoch of 4 steps: kept as {kept}" in res.stdout
    assert f"resumed from {workdir / 'checkpoints'} at epoch 1" in res.stdout
    assert json.loads((kept / "cursor.json").read_text())["step"] == 1256
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and checkpoint_epochs(workdir / "checkpoints") == [1, 2]
    again = run_in_process(train.main, [*argv, "--workdir", str(workdir), "--resume"])
    assert again.returncode == 0 and "all 2 epochs of this run are trained" in again.stdout, again.stderr[-2000:]


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_damaged_checksum_record_is_a_damaged_checkpoint(framework, tmp_path, tiny_argv, run_of_3_epochs):
    """``block_bytes`` 0 in the newest checkpoint's record ended --resume and predict --workdir in
    ``ZeroDivisionError``: --resume warns naming the record and what is wrong and continues from the
    checkpoint before; predict and export refuse it in one line, as a checkpoint whose bytes changed."""
    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    predict = __import__(f"{framework}_impl.predict", fromlist=["predict"])
    export = __import__(f"{framework}_impl.export", fromlist=["export"])
    work = run_of_3_epochs(framework, 2, tmp_path / "w")
    path = work / "checksums" / "2.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "block_bytes": 0}))
    damaged = f"its checksum record {path} is damaged (block_bytes is 0, expected a positive integer)"
    val_path = tiny_argv[tiny_argv.index("--set") + 3].split("=", 1)[1]
    out = tmp_path / "p.h5"
    res = run_in_process(
        predict.main, ["--config", "cpu_tiny", "--workdir", str(work), "--input", val_path, "--out", str(out)]
    )
    assert_one_error_line(res, f"checkpoint {work / 'checkpoints'}/", damaged)
    assert not out.exists()
    res = run_in_process(export.main, ["--config", "cpu_tiny", "--workdir", str(work), "--out", str(tmp_path / "e")])
    assert_one_error_line(res, damaged)
    res = run_in_process(train.main, [*tiny_argv, *RUN_OF_3_EPOCHS, "--workdir", str(work), "--resume"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"checkpoint of epoch 2 does not restore (checkpoint {work / 'checkpoints'}/" in res.stdout
    assert f"2: {damaged}" in res.stdout
    assert "resuming from the checkpoint of epoch 1, the newest one that restores" in res.stdout
    assert [json.loads(line)["epoch"] for line in (work / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
