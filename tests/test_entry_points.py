"""The README's entry points are loud about mistakes: the two scripts print their usage for ``--help``
and refuse an unknown argument before they set anything up."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
