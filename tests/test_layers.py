"""The packages in layers (scripts/import_graph.py): no import from a layer to one above or beside it,
no import cycle, nothing from experiments/."""

from __future__ import annotations

import importlib.util

from shared_data.core.config import REPO_ROOT


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", REPO_ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_layers_have_no_upward_arrow_and_no_cycle():
    lines, violations = _import_graph().check()
    assert violations == [], "\n".join(lines + violations)


def test_the_check_names_layers_and_finds_cycles():
    graph = _import_graph()
    assert graph.layer_of("shared_data.runtime.cli") == "shared_data.runtime"
    assert graph.layer_of("shared_data.console") == "shared_data"
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert graph.cycles(edges) == [["a", "b", "c"]]
