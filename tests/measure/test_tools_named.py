"""The measurement tools docs/MEASURING.md names exist and import on a CPU."""

import importlib
import re

from patchbay import ROOT


def test_every_measurement_tool_the_docs_name_exists_and_imports_without_a_gpu():
    text = (ROOT / "docs" / "MEASURING.md").read_text()
    named = set(re.findall(r"patchbay\.measure\.tools\.(\w+)", text))
    assert {"timing_hook", "stall_hook", "loop_hook", "timeline", "stalls", "client", "sweep"} <= named
    for name in named:
        importlib.import_module(f"patchbay.measure.tools.{name}")
    assert "patchbay.device memfit" in text  # the memory fit serves air12: a device job
    importlib.import_module("patchbay.device.memfit")
