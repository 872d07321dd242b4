"""The README's entry points are loud about mistakes: the two scripts print their usage for ``--help``
and refuse an unknown argument before they set anything up; a trainer writes nothing outside the run
folder, leaves none behind when it fails to start, names the command that makes missing data and
says what ``--overwrite`` deleted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_error_line, run_in_process

ROOT = Path(__file__).resolve().parents[1]


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / name), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", ["main.sh", "test.sh"])
def test_scripts_print_usage_for_help(name):
    proc = script(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: bash scripts/{name}")
    assert "setup" not in proc.stderr and proc.stderr == ""


@pytest.mark.parametrize(
    ("name", "arg", "says"),
    [
        ("main.sh", "--overwite", "unknown argument '--overwite' (it takes only --overwrite"),
        ("main.sh", "extra", "unknown argument 'extra'"),
        ("test.sh", "--fsat", "unknown argument '--fsat' (did you mean '--fast'?)"),
    ],
)
def test_scripts_refuse_unknown_arguments_before_the_set_up(name, arg, says):
    proc = script(name, arg)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: scripts/{name}: {says}"), proc.stderr
    assert proc.stdout == ""  # nothing ran: the set-up prints its steps


def jax_train(argv):
    from jax_impl import train

    return run_in_process(train.main, argv)


FAKE_PYTHON = """#!/usr/bin/env bash
echo "TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-unset} $*" >> "$(dirname "$0")/calls"
"""


def test_the_set_up_says_how_long_its_stages_take_and_keeps_tensorflows_start_up_lines_out(tmp_path):
    """``scripts/setup.sh`` on a fresh checkout (its ``.venv`` a stand-in that records each call):
    each install stage says up front how long it takes, and every call, the DALI TF plugin's build
    (which imports TensorFlow) included, runs with ``TF_CPP_MIN_LOG_LEVEL=2``."""
    for part in ("scripts/setup.sh", "requirements/constraints-cpu.txt", "pyproject.toml"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / part, tmp_path / part)
    python = tmp_path / ".venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {**os.environ, "PYTHON": str(python)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    proc = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    stages = [line for line in proc.stdout.splitlines() if line.startswith("setup: stage")]
    assert len(stages) == 2 and "~1 minute from pip's cache" in stages[0] and "seconds" in stages[1], stages
    calls = (python.parent / "calls").read_text().splitlines()
    assert any("nvidia-dali-tf-plugin" in call for call in calls) and len(calls) == 4, calls
    assert all(call.startswith("TF_CPP_MIN_LOG_LEVEL=2 ") for call in calls), calls


def test_missing_data_gives_the_command_that_makes_it_and_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = jax_train(["--config", "cpu_tiny", "--set", "val_path=/nonexistent_folder/valid.h5"])
    assert_one_error_line(
        res,
        f"dataset files {tmp_path}/data/train_128.h5 and /nonexistent_folder/valid.h5 not found; make them with: "
        "python -m shared_data.data.generate --out data/train_128.h5 --size 128 --seed 1; "
        "python -m shared_data.data.generate --out data/valid.h5 --size 32 --seed 2, "
        "then pass --set val_path=data/valid.h5",
    )
    assert list(tmp_path.iterdir()) == []


def test_missing_data_of_a_named_gas_gives_its_generator_flag(tmp_path, monkeypatch):
    """A file named after its side and gas (``val_48_filtered.h5``, as the GPU recipes name the linear
    gas's files) is made with that side and ``--gas filtered``; a side-only name gets no --gas."""
    monkeypatch.chdir(tmp_path)
    sets = ["--set", "train_path=data/train_96.h5", "--set", "val_path=data/val_48_filtered.h5"]
    res = jax_train(["--config", "cpu_tiny", *sets])
    assert_one_error_line(
        res,
        f"dataset files {tmp_path}/data/train_96.h5 and {tmp_path}/data/val_48_filtered.h5 not found; make them "
        "with: python -m shared_data.data.generate --out data/train_96.h5 --size 96 --seed 1; "
        "python -m shared_data.data.generate --out data/val_48_filtered.h5 --size 48 --seed 2 --gas filtered",
    )


def test_a_failed_start_leaves_no_run_folder(tmp_path, tiny_argv, caplog):
    (tmp_path / "bad.h5").write_text("not HDF5")
    exp = tmp_path / "exp"
    res = jax_train([*tiny_argv, "--set", f"train_path={tmp_path / 'bad.h5'}", "--exp_dir", str(exp)])
    assert_one_error_line(res, "bad.h5 is not a readable HDF5 file")
    assert f"removed {exp}: the run stopped before its first checkpoint" in caplog.text
    assert not exp.exists()


def test_the_tutorials_absolute_expdir_maps_into_the_current_folder(tmp_path, monkeypatch):
    from shared_data.core import config as config_mod
    from shared_data.runtime.run_folder import workdir_for

    yaml_file = tmp_path / "UNet.yaml"
    yaml_file.write_text(
        "base: &base\n  data_size: 64\n  expdir: '/logs'\n  train_path: '/data/train.h5'\nshort:\n  <<: *base\n"
    )
    monkeypatch.chdir(tmp_path)
    cfg = config_mod.load_config("short", yaml_file)
    assert cfg.exp_dir == "runs"
    assert workdir_for(cfg, "tf", run_num="01") == tmp_path / "runs/short/01/tf"
    (note,) = [n for n in cfg.notes if "expdir" in n]
    assert note.startswith("tutorial key 'expdir' = /logs is an absolute folder of the tutorial's container")
    res = jax_train(["--yaml_config", str(yaml_file), "--config", "short", "--run_num", "01"])
    assert_one_error_line(res, "/data/train.h5", "--out data/train.h5 --size 256 --seed 1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["UNet.yaml"]


@pytest.mark.slow
def test_training_says_its_step_and_overwrite_what_it_deleted(tmp_path, tiny_argv, caplog, monkeypatch):
    """With slow steps (here: a progress line due after every step) training says where it is;
    ``--overwrite`` names the checkpoints it deleted; a run of no epochs compiles nothing."""
    from shared_data.runtime import steps

    monkeypatch.setattr(steps, "PROGRESS_SEC", 0.0)
    workdir = tmp_path / "w"
    assert jax_train([*tiny_argv, "--workdir", str(workdir)]).returncode == 0
    assert "epoch 1: step 1/4, " in caplog.text and "epoch 1: step 3/4, " in caplog.text
    files = [f for f in (workdir / "checkpoints").rglob("*") if f.is_file()]
    assert files
    caplog.clear()
    res = jax_train([*tiny_argv, "--workdir", str(workdir), "--overwrite", "--num_epochs", "0"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "compile:" not in caplog.text  # nothing to train: nothing compiled
    assert f"--overwrite: deleted {workdir / 'checkpoints'} ({len(files)} files, " in caplog.text


def test_records_carry_the_version_from_a_checkout(monkeypatch):
    """Run from a checkout with no installed package, the version comes from its pyproject.toml; a
    record has it beside the git commit."""
    import re
    from importlib import metadata

    from shared_data.core import commands
    from shared_data.runtime.records import code_version

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    want = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert commands.package_version() == want
    code = code_version()
    assert code["package_version"] == want
    assert (ROOT / ".git").exists() <= ("git_commit" in code)


def test_the_h200_ladder_without_out_says_how_to_call_it():
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run(
        ["bash", str(ROOT / "experiments/ladder_h200/run.sh")], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: run.sh: set OUT to the results folder, e.g. OUT=results/ladder_h200 bash")


def test_the_style_check_reads_every_package_and_skips_what_the_readme_puts_in_the_checkout(tmp_path):
    """``ruff check .`` (``scripts/test.sh``) reads every Python file of the packages, ``shared_data/data``
    included, and none of the data folder, the run folders or the tutorial the README clones beside
    them (its own style is not the kit's)."""
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed (the test extra)")
    for folder in ("data", "runs", "sc21-dl-tutorial/utils"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "x.py").write_text("import os\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "shared_data", tmp_path / "shared_data", ignore=shutil.ignore_patterns("__pycache__"))
    listed = subprocess.run([str(ruff), "check", "--show-files", "."], cwd=tmp_path, capture_output=True, text=True)
    files = {str(Path(line).relative_to(tmp_path)) for line in listed.stdout.split() if line.endswith(".py")}
    packaged = {str(p.relative_to(tmp_path)) for p in (tmp_path / "shared_data").rglob("*.py")}
    assert "shared_data/data/generate.py" in packaged and files == packaged
