"""The tooling's layers point one way: series -> runtime -> measure -> device -> cli.

Every import of every module under src/patchbay/ (those inside functions too) is read with ast
and resolved to the module it names; the layer a module may import from is checked against its
own, patchbay.cli may be imported by no module but patchbay.__main__, and the import graph of
patchbay's modules has no cycle.
"""

import ast
from pathlib import Path

from patchbay import ROOT

SRC = ROOT / "src"
PACKAGE = SRC / "patchbay"
# The base every layer may use: the root package (ROOT) and what a verb is (Fail, guarded, ...).
BASE = {"patchbay", "patchbay.verb"}
ORDER = ["series", "runtime", "measure", "device", "cli"]
# What each layer may import besides itself; series only the root package, for ROOT.
MAY_IMPORT = {"series": {"patchbay"}, "runtime": BASE | {"series"}, "measure": BASE | {"series", "runtime"},
              "device": BASE | {"series", "runtime", "measure"}, "cli": BASE | {"series", "runtime", "measure"},
              "base": {"patchbay"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The patchbay modules `path` imports (a name imported from a package counts as its
    submodule when there is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import patchbay.x.y` counts as patchbay.x.y's module
                target = target.rpartition(".")[0]
            if target.startswith("patchbay") and target != name:
                found.add(target)
    return found


def layer(name: str) -> str:
    if name in BASE:
        return "base"
    if name in ("patchbay.cli", "patchbay.__main__"):
        return "cli"
    top = name.split(".")[1]
    assert top in ORDER, f"{name} is in no layer: put it under one of {', '.join(ORDER[:-1])}"
    return top


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items()}


def test_every_module_is_in_a_layer():
    for name in modules():
        layer(name)


def test_imports_point_down_the_layers():
    wrong = []
    for name, targets in graph().items():
        mine = layer(name)
        for target in sorted(targets):
            theirs = layer(target)
            if theirs != mine and target not in MAY_IMPORT[mine] and theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert wrong == []


def test_nothing_imports_the_cli():
    assert [n for n, targets in graph().items() if "patchbay.cli" in targets and n != "patchbay.__main__"] == []


def test_the_import_graph_has_no_cycle():
    edges = graph()
    state: dict[str, str] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(path[path.index(nxt):] + [node, nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    assert cycles == []


def test_the_checker_sees_relative_imports_and_reports_a_wrong_one(tmp_path):
    """The checker on a made-up package: a relative import two levels up is resolved, and an
    upward import is named."""
    pkg = tmp_path / "patchbay"
    (pkg / "series").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "series" / "__init__.py").write_text("")
    (pkg / "series" / "a.py").write_text("def f():\n    from ..measure import b\n")
    (pkg / "measure").mkdir()
    (pkg / "measure" / "__init__.py").write_text("")
    (pkg / "measure" / "b.py").write_text("from ..series import a\n")
    known = {"patchbay", "patchbay.series", "patchbay.series.a", "patchbay.measure", "patchbay.measure.b"}
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        assert imports(pkg / "series" / "a.py", known) == {"patchbay.measure.b"}
        assert imports(pkg / "measure" / "b.py", known) == {"patchbay.series.a"}
    finally:
        SRC = saved
