import importlib
import re

from patchbay import ROOT


def test_every_measurement_tool_agents_md_names_exists_and_imports_without_a_gpu():
    named = set(re.findall(r"patchbay\.measure\.tools\.(\w+)", (ROOT / "AGENTS.md").read_text()))
    assert {"timing_hook", "stall_hook", "loop_hook", "timeline", "stalls", "client", "memfit", "sweep"} <= named
    for name in named:
        importlib.import_module(f"patchbay.measure.tools.{name}")
