"""User errors at the command line: one `error:` line, exit code 2, no traceback, before any
training starts where the flags alone are wrong; also errors raised inside tf.data / DALI callbacks.
Flag errors are checked in this process (``main`` as the console script runs it); one command per
framework through ``python -m`` shows what a user sees."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import REPO_ROOT, assert_one_error_line, run_in_process, run_module

from shared_data.core.errors import DatasetError, user_error_in


def _main(module: str):
    return importlib.import_module(module).main


def test_user_errors_are_found_inside_framework_wrappers():
    try:
        try:
            raise DatasetError("f.h5 Hydro crop at (0, 0, 0): non-finite value nan")
        except DatasetError as inner:
            raise RuntimeError("DALI callback failed") from inner
    except RuntimeError as outer:
        assert user_error_in(outer) == "f.h5 Hydro crop at (0, 0, 0): non-finite value nan"
    tf_like = ValueError(
        "{{function_node __wrapped}} shared_data.core.errors.DatasetError: f.h5 Nbody crop at (1, 2, 3): bad\n"
        " [[{{node PyFunc}}]]"
    )
    assert user_error_in(tf_like) == "f.h5 Nbody crop at (1, 2, 3): bad"
    assert user_error_in(ValueError("shape mismatch")) is None


@pytest.mark.parametrize(
    ("flags", "text"),
    [
        (["--resume", "--overwrite"], "--resume and --overwrite conflict"),
        (["--global_batch_size", "8", "--local_batch_size", "2"], "conflict: give one"),
        (["--save_weights", "{tmp}/no/w.npz"], "does not exist"),
        (["--num_devices", "64"], "--num_devices 64: this process sees"),
        (["--workdir", "{tmp}/file"], "is a file, expected a folder"),
    ],
)
@pytest.mark.parametrize("fw", ["jax_impl", "tf_impl"])
def test_flag_errors_stop_before_training(fw, flags, text, tmp_path, tiny_argv):
    """Checked in this process, as the console script runs ``main``; the trainer never starts."""
    (tmp_path / "file").write_text("x")
    argv = [*tiny_argv, "--workdir", str(tmp_path / "w"), *(f.format(tmp=tmp_path) for f in flags)]
    assert_one_error_line(run_in_process(_main(f"{fw}.train"), argv), text)
    assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fw", ["jax_impl", "tf_impl"])
def test_a_flag_error_is_one_line_without_traceback_from_the_command(fw, tmp_path, tiny_argv):
    """The same check through ``python -m``: what a user sees, one line and exit code 2; then a run of
    zero epochs with --save_weights into the run folder itself succeeds."""
    base = [f"{fw}.train", *tiny_argv, "--workdir", str(tmp_path / "w")]
    assert_one_error_line(run_module(*base, "--resume", "--overwrite"), "--resume and --overwrite conflict")
    zero_epochs = [*base[1:], "--save_weights", str(tmp_path / "w" / "weights.npz"), "--num_epochs", "0"]
    assert run_in_process(_main(f"{fw}.train"), zero_epochs).returncode == 0


@pytest.mark.parametrize("fw", ["jax_impl", "tf_impl"])
def test_bad_data_fails_before_overwrite_deletes_checkpoints(fw, tiny_cfg, tmp_path):
    ckpt = tmp_path / "w" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "epoch_1").write_text("work to keep")
    argv = [
        "--config",
        "cpu_tiny",
        "--set",
        f"train_path={tmp_path / 'nope.h5'}",
        "--set",
        f"val_path={tiny_cfg.val_path}",
    ]
    res = run_in_process(_main(f"{fw}.train"), [*argv, "--workdir", str(tmp_path / "w"), "--overwrite"])
    assert_one_error_line(res, "nope.h5 not found")
    assert (ckpt / "epoch_1").read_text() == "work to keep"


def test_tool_inputs_are_checked(tmp_path, tiny_cfg):
    layer_bench = _main("dlas_compare.layer_bench")
    assert_one_error_line(
        run_in_process(layer_bench, ["--config", "cpu_tiny", "--layers", "nope", "--no-torch"]),
        "unknown layer(s) ['nope']",
    )
    res = run_in_process(layer_bench, ["--config", "cpu_tiny", "--steps", "0"])
    assert res.returncode == 2 and "--steps: expected an integer >= 1, got 0" in res.stderr
    (tmp_path / "bad.jsonl").write_text("not json\n")
    (tmp_path / "other.jsonl").write_text('{"samples_per_sec": 1}\n')
    plots = ["--config", "cpu_tiny", "--out", str(tmp_path / "fig"), "--runs"]
    for run, text in (
        ("nolabel", "expected LABEL=PATH"),
        (f"x={tmp_path / 'none.jsonl'}", "none.jsonl not found"),
        (f"x={tmp_path / 'bad.jsonl'}", "expected a metrics.jsonl file of a training run"),
        (f"x={tmp_path / 'other.jsonl'}", "expected lines with epoch, train_loss and val_loss"),
    ):
        assert_one_error_line(run_in_process(_main("dlas_compare.plots"), [*plots, run]), text)
    torch_dali = ["--framework", "torch", "--mode", "io", "--config", "cpu_tiny", "--data_loader_config", "dali-device"]
    torch_dali += ["--set", f"train_path={tiny_cfg.train_path}"]  # the data exist: the input is what is refused
    assert_one_error_line(run_in_process(_main("dlas_compare.benchmark"), torch_dali), "no dali-device input")


@pytest.mark.slow
def test_nan_crop_in_tf_data_is_a_user_error(tmp_path, data_dir):
    nan = tmp_path / "nan.h5"
    with h5py.File(data_dir / "train_32.h5") as f, h5py.File(nan, "w") as g:
        g["Nbody"] = f["Nbody"][...]
        hydro = f["Hydro"][...]
        hydro[:, 10:20, 10:20, 10:20] = np.nan  # every 16^3 crop of the 32^3 volume overlaps it
        g["Hydro"] = hydro
    res = run_module(
        "tf_impl.train",
        "--config",
        "cpu_tiny",
        "--set",
        f"train_path={nan}",
        "--set",
        f"val_path={data_dir / 'val_24.h5'}",
        "--workdir",
        str(tmp_path / "w"),
    )
    assert_one_error_line(res, "non-finite value nan")


def test_generator_and_converter_reject_bad_values(tmp_path):
    assert_one_error_line(
        run_in_process(
            _main("shared_data.data.generate"), ["--out", str(tmp_path / "g.h5"), "--size", "16", "--redshift", "-5"]
        ),
        "--redshift -5.0: expected >= 0",
    )
    nan = tmp_path / "nan.h5"
    with h5py.File(nan, "w") as g:
        g["Nbody"] = np.zeros((4, 8, 8, 8), np.float32)
        h = np.zeros((5, 8, 8, 8), np.float32)
        h[0, 1, 2, 3] = np.nan
        g["Hydro"] = h
    convert, inspect = _main("shared_data.data.convert"), _main("shared_data.data.inspect")
    assert_one_error_line(run_in_process(convert, [str(nan)]), "Hydro (x from 0): non-finite value nan")
    assert_one_error_line(run_in_process(inspect, [str(tmp_path)]), "is a folder, expected an HDF5 file")


def test_a_reader_that_goes_away_ends_the_command_quietly(data_dir):
    """``inspect ... | head``: stdout is a pipe whose reader has gone (unbuffered, so the first line
    already meets the closed pipe); the command stops with exit 0 and nothing on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "shared_data.data.inspect", str(data_dir / "val_24.h5")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert res.returncode == 0 and "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr


@pytest.mark.slow
def test_a_trainer_error_is_one_line_on_stderr_and_kept_in_out_log(tmp_path, data_dir, tiny_argv):
    """An error found once the run has started (a truncated validation file): one ``error:`` line on
    stderr, none among the console's log lines on stdout, and the same line in the run's out.log (of a
    run folder the user made: one the failed start made is removed, tests/test_entry_points.py)."""
    bad = tmp_path / "val.h5"
    bad.write_bytes((data_dir / "val_24.h5").read_bytes()[:5000])
    work = tmp_path / "w"
    work.mkdir()
    res = run_module("jax_impl.train", *tiny_argv, "--set", f"val_path={bad}", "--workdir", str(work))
    assert_one_error_line(res, "val.h5")
    assert "error:" not in res.stdout, res.stdout[-2000:]
    logged = [line for line in (work / "out.log").read_text().splitlines() if "error:" in line]
    assert len(logged) == 1 and "val.h5" in logged[0]


def test_compare_checks_its_options_and_data_before_any_process_and_fails_when_a_framework_does(
    tmp_path, tiny_cfg, monkeypatch
):
    """``dlas_compare.compare``: a mistyped option is one line under compare's own name, a missing
    training file one ``error:`` line with the command that makes it, both before a benchmark process
    starts; a framework whose process fails makes the exit code 1 (its note says why)."""
    from dlas_compare import compare

    started = []
    monkeypatch.setattr(compare, "run_process", lambda cmd, *a, **k: started.append(cmd) or ([], "exit 1: boom", ""))
    monkeypatch.setattr(compare, "availability", lambda fw: None if fw == "jax" else "not here")
    typo = run_in_process(compare.main, ["--confg", "cpu_tiny"])
    assert typo.returncode == 2 and typo.stderr.strip() == (
        "python -m dlas_compare.compare: error: unrecognized arguments: --confg cpu_tiny (did you mean '--config'?)"
    )
    missing = ["--config", "cpu_tiny", "--set", f"train_path={tmp_path / 'none.h5'}"]
    assert_one_error_line(
        run_in_process(compare.main, missing),
        f"{tmp_path / 'none.h5'} not found",
        "python -m shared_data.data.generate --out",
    )
    assert started == []
    tiny = ["--config", "cpu_tiny", "--set", f"train_path={tiny_cfg.train_path}", "--out", str(tmp_path / "c.jsonl")]
    failed = run_in_process(compare.main, tiny)
    assert failed.returncode == 1 and len(started) == 1
    assert "jax: failed (exit 1: boom)" in failed.stdout and "tf: skipped (not here)" in failed.stdout


def test_the_error_line_is_one_write(monkeypatch):
    """``run_cli`` writes ``error: <message>`` and its newline in one write to stderr: the processes of
    a multi-process run share one stderr with their launcher, and ``print``'s two writes (text, then
    newline) let another process's line land between them."""
    from shared_data.core.errors import UserError, run_cli

    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())

    def main(argv):
        raise UserError("process 1 of this run lost process 0 (of 2)")

    assert run_cli(main, []) == 2
    assert writes == ["error: process 1 of this run lost process 0 (of 2)\n"]
