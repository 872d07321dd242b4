"""Library code changes no process-wide state on import: importing every module of the kit's packages
(both frameworks included; not the lowmem fork server's preload, a process of its own whose import
ignores SIGTERM there by design) leaves the signal handlers, ``sys.excepthook``, ``sys.unraisablehook`` and
``sys.argv`` as they were."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import importlib, pathlib, signal, sys
root = pathlib.Path(sys.argv[1])
# the lowmem fork server's preload, imported in that process alone, ignores SIGTERM there by design
EXEMPT = {"fork_server"}
watched = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
before = ([signal.getsignal(s) for s in watched], sys.excepthook, sys.unraisablehook, list(sys.argv))
modules = sorted(
    ".".join(p.relative_to(root).with_suffix("").parts)
    for package in ("shared_data", "dlas_compare", "jax_impl", "tf_impl")
    for p in (root / package).rglob("*.py")
    if p.name != "__main__.py" and p.stem not in EXEMPT
)
for name in modules:
    importlib.import_module(name.removesuffix(".__init__"))
after = ([signal.getsignal(s) for s in watched], sys.excepthook, sys.unraisablehook, list(sys.argv))
names = ("signal handlers", "sys.excepthook", "sys.unraisablehook", "sys.argv")
changed = [n for n, b, a in zip(names, before, after) if b != a]
print(len(modules), "modules;", "changed: " + ", ".join(changed) if changed else "nothing changed")
"""


@pytest.mark.slow
def test_importing_the_kit_changes_no_process_wide_state():
    res = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(ROOT)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-3000:]
    count, verdict = res.stdout.strip().splitlines()[-1].split(" modules; ")
    assert int(count) > 100 and verdict == "nothing changed", res.stdout
