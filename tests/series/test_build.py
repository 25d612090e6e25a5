"""The build: the patched wheel, its version and registry, reuse when nothing changed, and the
engine-side knob runtime agreeing with patchbay's own parser on every knob type."""

import importlib.util
import json
import zipfile

import pytest

from patchbay.series import build
from patchbay.series.knobs import KnobError, parse_declaration, registry_json


def test_wheel_is_versioned_by_the_series_and_carries_the_registry(patched_engine, real_series):
    build_id = patched_engine.build_id
    assert patched_engine.wheel.name == f"transformers-5.23.0+pb.{build_id[3:]}-py3-none-any.whl"
    with zipfile.ZipFile(patched_engine.wheel) as wheel:
        names = wheel.namelist()
        assert "transformers/_pb/knobs.py" in names
        source = wheel.read("transformers/_pb/build_info.py").decode()
    info = json.loads(source.split("r'''", 1)[1].rsplit("'''", 1)[0])
    assert info["build_id"] == build_id
    assert info["patches"] == [p.name for p in real_series.patches]
    assert info["knobs"] == json.loads(registry_json(real_series.knobs()))["knobs"]


def test_unchanged_inputs_reuse_the_build(patched_engine, real_series):
    before = patched_engine.wheel.stat().st_mtime_ns
    again = build.build(real_series, progress=lambda *_: pytest.fail("rebuilt an unchanged series"))
    assert again == patched_engine
    assert again.wheel.stat().st_mtime_ns == before


def test_pristine_build_has_no_patchbay_code(pristine_engine):
    assert pristine_engine.wheel.name == "transformers-5.23.0-py3-none-any.whl"
    with zipfile.ZipFile(pristine_engine.wheel) as wheel:
        assert not [n for n in wheel.namelist() if "/_pb/" in n]


DECLARATIONS = [
    "PB_FLAG type=bool default=0",
    "PB_CHUNK type=int min=0 max=4096 default=0",
    "PB_FIELD type=enum values=upstream,reasoning,both default=upstream",
    "PB_TRACE type=list values=sched,kv,sampler default=",
]
VALUES = ["0", "1", "yes", "", "12", "4097", "-1", "reasoning", "both", "nope", "kv", "sched,kv", "kv,bogus"]


def test_engine_knob_runtime_agrees_with_patchbay(patched_engine):
    """Both sides parse knob values (patchbay before start, the engine at start): same answers."""
    spec = importlib.util.spec_from_file_location("pb_engine_knobs",
                                                  patched_engine.site / "transformers" / "_pb" / "knobs.py")
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)
    knobs = [parse_declaration(d, per_request=True) for d in DECLARATIONS]
    engine._registry = json.loads(registry_json(knobs))["knobs"]
    checked = 0
    for knob in knobs:
        for raw in VALUES:
            try:
                ours = ("ok", knob.parse(raw))
            except KnobError as e:
                ours = ("error", str(e))
            try:
                theirs = ("ok", engine.parse(knob.name, raw))
            except engine.KnobError as e:
                theirs = ("error", str(e))
            assert ours == theirs, (knob.name, raw)
            checked += ours[0] == "ok"
    assert checked >= 8  # both accepting and refusing were exercised
    with pytest.raises(engine.KnobError, match="PB_OTHER is not a knob of this build"):
        engine.load({"PB_OTHER": "1"})
    values = engine.load({"PB_CHUNK": "64", "PB_TRACE": "kv,sched"})
    assert values["PB_CHUNK"] == 64 and values["PB_TRACE"] == ("kv", "sched") and values["PB_FLAG"] is False
