"""The engine's model-load sequence (engine/_pb/load.py): defined once, called from two hook lines."""

import ast
import json

import pytest

from .conftest import engine_code
from patchbay.series.overlay import OVERLAY_DIR

PB = OVERLAY_DIR / "_pb"
# the engine's modules by name (kernel modules share their op's name and hold no hooks)
MODULES = {p.stem: p for p in PB.rglob("*.py") if "kernels" not in p.parts}


def _functions(path):
    """name -> number of positional parameters, for the module's top-level functions."""
    tree = ast.parse(path.read_text())
    return {n.name: len(n.args.args) for n in tree.body if isinstance(n, ast.FunctionDef)}


def _lists():
    """load.py's KWARGS, AT_LOAD and AFTER_LOAD as tuples of module names."""
    tree = ast.parse((PB / "load.py").read_text())
    return {t.id: tuple(e.id for e in node.value.elts) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Tuple)}


def test_every_load_hook_of_the_overlay_is_in_the_sequence_once():
    lists = _lists()
    found = {"KWARGS": set(), "AT_LOAD": set(), "AFTER_LOAD": set()}
    for path in sorted(MODULES.values()):
        functions = _functions(path)
        if functions.get("model_kwargs") == 1:  # model_kwargs(kwargs); 0270's model_kwargs(io, kwargs) is not one
            found["KWARGS"].add(path.stem)
        if functions.get("at_load") == 0:
            found["AT_LOAD"].add(path.stem)
        if functions.get("after_load") == 1:
            found["AFTER_LOAD"].add(path.stem)
        if path.stem in lists["AT_LOAD"] + lists["AFTER_LOAD"]:
            assert "restore" in functions, f"{path.name} swaps at load but has no restore()"
    for name, modules in found.items():
        assert set(lists[name]) == modules, name
        assert len(lists[name]) == len(set(lists[name])), name


def test_only_the_infrastructure_patch_hooks_the_model_manager(real_series):
    manager = "src/transformers/cli/serving/model_manager.py"
    assert [p.name for p in real_series.patches if manager in p.files()] == ["0010-knob-runtime"]
    section = real_series.patches[0].diff.split(f"diff --git a/{manager}")[1].split("\ndiff --git")[0]
    added = [line[1:].strip() for line in section.split("\n") if line.startswith("+") and not line.startswith("+++")]
    assert added == ["from ..._pb import load as _pb_load", "model_kwargs = _pb_load.before(model_kwargs)",
                     "_pb_load.after(model)"]
    # the patch that brings a module with a load step also names load.py, where it adds the step
    for module in {m for names in _lists().values() for m in names}:
        rel = str(MODULES[module].relative_to(OVERLAY_DIR))
        bringer = next(p for p in real_series.patches if rel in p.modules)
        assert "_pb/load.py" in bringer.modules, (module, bringer.name)


@pytest.mark.engine
@pytest.mark.parametrize("router", ["0", "1"])
def test_the_tools_take_the_servers_sequence_and_restore_undoes_it(patched_engine, router):
    code = ("import json; from patchbay.runtime import load_hooks; "
            "from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter as R; "
            "upstream = R.forward; kwargs = load_hooks.apply(); swapped = R.forward is not upstream; "
            "load_hooks.restore(); print(json.dumps({'kwargs': sorted(kwargs), 'swapped': swapped, "
            "'restored': R.forward is upstream}))")
    proc = engine_code(code, patched_engine, PB_FUSED_ROUTER=router)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"kwargs": [], "swapped": router == "1", "restored": True}


@pytest.mark.engine
def test_the_pristine_engine_has_no_sequence(pristine_engine):
    proc = engine_code("from patchbay.runtime import load_hooks; print(load_hooks.sequence() is None, load_hooks.apply())",
                       pristine_engine)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "{}"]
