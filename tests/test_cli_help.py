"""The command lines explain themselves: ``--version``, usage lines and hints in the spelling the user
typed (``dlas-*`` or ``python -m``), help for every option, the config names in ``--help``, and the TF
console scripts answering ``--help`` and argument errors without importing TensorFlow."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared_data import console
from shared_data.core import commands
from shared_data.core.errors import DatasetError

ROOT = Path(__file__).resolve().parents[1]


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def parser_of(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser console command ``name`` builds (captured when it parses)."""

    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(_Parsed) as parsed:
        console.load_main(name)([])
    return parsed.value.parser


@pytest.mark.parametrize("name", list(commands.COMMANDS))
def test_every_option_has_help_and_the_usage_names_the_command(name, monkeypatch, capsys):
    module = commands.COMMANDS[name][0]
    if module.startswith("tf_impl"):
        pytest.importorskip("tensorflow")
    parser = parser_of(name, monkeypatch)
    assert parser.prog == f"python -m {module}"
    undocumented = [
        a.option_strings or a.dest for a in parser._actions if a.help is None and a.help != argparse.SUPPRESS
    ]
    assert undocumented == []
    monkeypatch.undo()
    monkeypatch.setattr(sys, "argv", [f"/venv/bin/{commands.SCRIPTS[module]}"])
    with pytest.raises(SystemExit) as done:
        console.load_main(name)(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"{commands.SCRIPTS[module]} (dlas-cosmo ")


def test_config_names_in_help(capsys):
    from shared_data.core import config as config_mod

    with pytest.raises(SystemExit):
        importlib.import_module("dlas_compare.benchmark").main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "cpu_default, cpu_tiny" in text and "short_opt" in text and "bs2048_opt" in text
    assert "--num_devices NUM_DEVICES data parallel over the first N devices" in text
    assert config_mod.config_names()[0] in text


def test_hints_name_the_command_the_user_typed(tmp_path, monkeypatch):
    from shared_data.data import dataset

    monkeypatch.setattr(sys, "argv", ["/venv/bin/dlas-train-jax"])
    with pytest.raises(DatasetError, match=r"generate one with: dlas-generate --help"):
        dataset.open_h5(tmp_path / "missing.h5")
    assert commands.command_name("jax_impl.train") == "dlas-train-jax"
    monkeypatch.setattr(sys, "argv", ["-m"])
    with pytest.raises(DatasetError, match=r"generate one with: python -m shared_data.data.generate --help"):
        dataset.open_h5(tmp_path / "missing.h5")


CHECK_NO_TF = """
import sys
sys.argv = ["/venv/bin/dlas-train-tf", *sys.argv[1:]]
from shared_data.console import {entry}
try:
    code = {entry}()
except SystemExit as done:
    code = done.code
print("tensorflow imported:", "tensorflow" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize(
    ("entry", "args", "code", "says"),
    [
        ("train_tf", ["--help"], 0, "usage: dlas-train-tf"),
        ("train_tf", ["--bogus"], 2, "dlas-train-tf: error: unrecognized arguments: --bogus"),
        ("predict_tf", ["--help"], 0, "--no-enable_jit"),
        ("export_tf", ["--version"], 0, "(dlas-cosmo "),
    ],
)
def test_tf_console_scripts_answer_without_importing_tensorflow(entry, args, code, says):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_NO_TF.format(entry=entry), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == code, proc.stderr
    assert says in proc.stdout + proc.stderr
    assert "tensorflow imported: False" in proc.stderr


def test_predict_takes_the_trainers_jit_switch(tiny_cfg):
    from shared_data.inference import predict as predict_mod

    for flag, want in (("--no-enable_jit", False), ("--enable_jit", True)):
        args = predict_mod.build_parser("tf").parse_args(
            ["--config", "cpu_tiny", "--weights", "W.npz", "--input", "x.h5", "--out", "y.h5", flag]
        )
        assert predict_mod.config_from_args(args).enable_jit is want


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--data_loader_config", "dali-npyy"], "argument --data_loader_config: invalid choice: 'dali-npyy'"),
        (["--num_epochs"], "argument --num_epochs: expected one argument"),
    ],
)
def test_a_flag_error_is_one_line_without_the_usage_block(argv, says, capsys):
    """argparse's own errors (unknown flag, bad choice, missing value) are one ``error:`` line, exit 2."""
    from jax_impl import train

    with pytest.raises(SystemExit) as exit_:
        train.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith("python -m jax_impl.train: error: ") and says in err, err


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["-m", "tf_impl.train", "--help"], 0, "usage: python -m tf_impl.train"),
        (["-m", "tf_impl.train", "--enable-amp"], 2, "--enable-amp (did you mean '--enable_amp'?)"),
        (["-m", "tf_impl.train", "--set", "nmu_epochs=2"], 2, "unknown key 'nmu_epochs' (did you mean 'num_epochs'?)"),
        (["-m", "tf_impl.predict", "--config", "shortopt"], 2, "the following arguments are required"),
        (["-m", "tf_impl.export", "--config", "shortopt", "--weights", "w.npz", "--out", "x"], 2, "'short_opt'?"),
        (["-m", "jax_impl.train", "--config", "cpu_defualt"], 2, "(did you mean 'cpu_default'?)"),
    ],
)
def test_python_m_answers_before_the_framework_imports(argv, code, says):
    """``python -m tf_impl.train --help`` and bad flags, configs and keys answer while the package
    imports: ``-X importtime`` lists every module imported, and neither framework is among them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, env=env)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert says in proc.stdout + proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not {"tensorflow", "jax", "keras"} & imported
