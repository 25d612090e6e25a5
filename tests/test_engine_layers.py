"""The engine package's layers (engine/_pb): api -> runtime -> ops -> ops/kernels, imports pointing
down only; knobs.py under all of them, load.py (the model-load sequence) above runtime and ops."""

import ast

from patchbay.series.overlay import OVERLAY_DIR

PB = OVERLAY_DIR / "_pb"
# what each layer may import of the engine package (besides itself)
ALLOWED = {
    "api": {"runtime", "ops", "kernels", "knobs"},
    "runtime": {"ops", "kernels", "knobs"},
    "ops": {"kernels", "knobs"},
    "kernels": set(),
    "top": {"api", "runtime", "ops", "kernels", "knobs", "load", "build_info"},
}


def layer(parts: tuple[str, ...]) -> str:
    """The layer of a module given by its path parts under _pb."""
    if parts[:2] == ("ops", "kernels"):
        return "kernels"
    return parts[0] if len(parts) > 1 else "top"


def engine_imports(path):
    """The _pb modules a file imports, as path parts under _pb (relative imports resolved)."""
    here = path.relative_to(PB).with_suffix("").parts
    package = here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level - 1 <= len(package) else None
            if base is None:
                continue  # above _pb: transformers itself
            target = (*base, *(node.module.split(".") if node.module else ()))
            names = [a.name for a in node.names]
            found += [(*target, n) for n in names] if not node.module else [target]
    return here, found


def test_every_engine_import_points_down():
    wrong, checked = [], 0
    for path in sorted(PB.rglob("*.py")):
        here, targets = engine_imports(path)
        own = layer(here)
        for target in targets:
            other = layer(target) if len(target) > 1 and target[0] in ("api", "runtime", "ops") else target[0]
            checked += 1
            if other != own and other not in ALLOWED[own]:
                wrong.append(f"{'/'.join(here)} ({own}) imports {'.'.join(target)} ({other})")
    assert checked > 50
    assert wrong == []


def test_kernel_modules_hold_kernels_and_their_jit_helpers_only():
    for path in sorted((PB / "ops" / "kernels").glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                decorators = [ast.unparse(d) for d in node.decorator_list]
                assert any(d.startswith("triton.jit") for d in decorators), f"{path.name}: {node.name} is not a kernel"
            assert not isinstance(node, ast.ClassDef), f"{path.name}: a class in a kernel module"
