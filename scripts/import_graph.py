"""The import graph of the kit's packages, by layer: ``python scripts/import_graph.py``.

Every import of every module counts, those inside functions too. A layer imports only layers below
it (a lower rank); layers of the same rank (``data`` and ``model``, ``tf_impl`` and ``jax_impl``)
import neither each other; no module imports itself through others (a cycle); nothing imports a
study's code under ``experiments/``. Prints the layers, the arrows between them with their import
counts, and every violation; exit code 1 when there is one (``tests/test_layers.py`` runs it).
"""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shared_data", "tf_impl", "jax_impl", "dlas_compare")
#: layer -> rank, lowest first; a module belongs to the longest layer name that prefixes it
LAYERS = {
    "shared_data.core": 0,
    "shared_data.data": 1,
    "shared_data.model": 1,
    "shared_data.runtime": 2,
    "shared_data.inference": 3,
    "tf_impl": 4,
    "jax_impl": 4,
    "dlas_compare": 5,
    "shared_data": 6,  # the package itself and console, the table of console scripts
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    return max((name for name in LAYERS if module == name or module.startswith(name + ".")), key=len)


def imports(path: Path, known: set[str]) -> set[str]:
    """The kit's modules that ``path`` imports (``from a import b`` counts as ``a.b`` when that is a
    module); other top-level names are returned as they are."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the kit's modules it imports, plus study modules under ``experiments/`` by name."""
    files = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    studies = {p.stem for p in (ROOT / "experiments").rglob("*.py")}
    edges = {}
    for module, path in files.items():
        targets = imports(path, set(files))
        edges[module] = {t for t in targets if t.split(".")[0] in PACKAGES and t != module}
        edges[module] |= {f"experiments:{t}" for t in targets if t in studies}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def check() -> tuple[list[str], list[str]]:
    """``(report lines, violations)`` of the kit's import graph."""
    edges = graph()
    arrows: collections.Counter = collections.Counter()
    violations = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if target.startswith("experiments:"):
                violations.append(f"{module} imports the study module {target.split(':')[1]}")
                continue
            src, dst = layer_of(module), layer_of(target)
            if src == dst:
                continue
            arrows[src, dst] += 1
            if LAYERS[dst] >= LAYERS[src]:
                violations.append(f"{module} ({src}) imports {target} ({dst}): not a lower layer")
    violations += [f"import cycle: {' -> '.join(c)}" for c in cycles(edges)]
    by_layer = collections.Counter(layer_of(m) for m in edges)
    lines = ["layers, lowest first (modules):"]
    lines += [f"  {rank}  {name:<24}{by_layer[name]:>3}" for name, rank in sorted(LAYERS.items(), key=lambda x: x[1])]
    lines.append("arrows (imports):")
    order = lambda arrow: (-LAYERS[arrow[0][0]], arrow[0][0], -LAYERS[arrow[0][1]], arrow[0][1])
    lines += [f"  {src:<24} -> {dst:<24}{n:>4}" for (src, dst), n in sorted(arrows.items(), key=order)]
    return lines, violations


def main() -> int:
    lines, violations = check()
    print("\n".join(lines))
    print("\n".join(violations) if violations else "no upward or sideways arrow, no cycle, no import from experiments/")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
