"""Knob declarations (patch headers), values, settings checks, the registry and the docs."""

import json

import pytest

from patchbay import ROOT
from patchbay.series import knobs, series
from patchbay.series.knobs import Knob, KnobError, parse_declaration


def test_bool_declaration():
    k = parse_declaration("PB_X type=bool default=0", per_request=True, patch="0020-x", description="X.")
    assert k == Knob(name="PB_X", type="bool", default="0", per_request=True, patch="0020-x")
    assert k.description == "X."
    assert (k.parse("0"), k.parse("1"), k.parse(" 1 ")) == (False, True, True)
    assert k.allowed() == "0, 1"


def test_int_declaration():
    k = parse_declaration("PB_CHUNK type=int min=-4 max=65536 default=0")
    assert (k.type, k.min, k.max, k.default, k.values) == ("int", -4, 65536, "0", ())
    assert (k.parse("-4"), k.parse("65536"), k.parse("17")) == (-4, 65536, 17)
    assert k.allowed() == "an integer from -4 to 65536"


def test_enum_declaration():
    k = parse_declaration("PB_FIELD type=enum values=upstream,reasoning,both default=upstream")
    assert k.values == ("upstream", "reasoning", "both")
    assert k.parse("both") == "both"
    assert k.allowed() == "upstream, reasoning, both"


def test_list_declaration():
    k = parse_declaration("PB_TRACE type=list values=sched,kv,sampler default=")
    assert (k.type, k.default, k.values) == ("list", "", ("sched", "kv", "sampler"))
    assert k.parse("") == ()
    assert k.parse("kv, sched") == ("kv", "sched")
    assert "sched, kv, sampler" in k.allowed()


def test_none_declares_no_knob():
    assert parse_declaration("none") is None
    assert parse_declaration("  None ") is None


@pytest.mark.parametrize("text, expected", [
    ("", "knob name '' must look like PB_UPPER_CASE"),
    ("pb_x type=bool default=0", "knob name 'pb_x' must look like PB_UPPER_CASE"),
    ("PB_X-Y type=bool default=0", "knob name 'PB_X-Y'"),
    ("PB_X type=bool default=0 on", "PB_X: 'on' is not key=value"),
    ("PB_X type=bool default=0 doc=hi", "PB_X: unknown attribute 'doc' (allowed: type, default, values, min, max)"),
    ("PB_X type=bool type=int default=0", "PB_X: type given twice"),
    ("PB_X default=0", "PB_X: type=None is not a knob type (allowed: bool, int, enum, list)"),
    ("PB_X type=float default=0", "PB_X: type=float is not a knob type"),
    ("PB_X type=bool", "PB_X: default= is required"),
    ("PB_X type=bool default=2", "PB_X=2 is not a valid value (allowed: 0, 1)"),
    ("PB_X type=bool default=1", "PB_X: a bool knob's default must be 0 (off = upstream)"),
    ("PB_X type=bool values=a,b default=0", "PB_X: values= only applies to enum and list knobs"),
    ("PB_X type=bool min=0 default=0", "PB_X: min=/max= only apply to int knobs"),
    ("PB_X type=enum default=a", "PB_X: type=enum needs values=a,b,..."),
    ("PB_X type=enum values= default=", "PB_X: type=enum needs values=a,b,..."),
    ("PB_X type=enum values=a,b default=c", "PB_X=c is not a valid value (allowed: a, b)"),
    ("PB_X type=list default=", "PB_X: type=list needs values=a,b,..."),
    ("PB_X type=list values=a,b default=c", "PB_X=c is not a valid value"),
    ("PB_X type=int default=0", "PB_X: type=int needs integer min= and max="),
    ("PB_X type=int min=0 default=0", "PB_X: type=int needs integer min= and max="),
    ("PB_X type=int min=zero max=4 default=0", "PB_X: type=int needs integer min= and max="),
    ("PB_X type=int min=5 max=4 default=4", "PB_X: min 5 is above max 4"),
    ("PB_X type=int min=0 max=4 default=5", "PB_X=5 is not a valid value (allowed: an integer from 0 to 4)"),
    ("PB_X type=int min=0 max=4 default=", "PB_X= is not a valid value"),
])
def test_declaration_errors(text, expected):
    with pytest.raises(KnobError) as e:
        parse_declaration(text)
    assert expected in str(e.value)


@pytest.mark.parametrize("decl, raw, allowed", [
    ("PB_X type=bool default=0", "yes", "0, 1"),
    ("PB_X type=bool default=0", "true", "0, 1"),
    ("PB_X type=bool default=0", "", "0, 1"),
    ("PB_X type=int min=0 max=8 default=0", "9", "an integer from 0 to 8"),
    ("PB_X type=int min=0 max=8 default=0", "-1", "an integer from 0 to 8"),
    ("PB_X type=int min=0 max=8 default=0", "1.5", "an integer from 0 to 8"),
    ("PB_X type=int min=0 max=8 default=0", "0x4", "an integer from 0 to 8"),
    ("PB_X type=enum values=a,b default=a", "A", "a, b"),
    ("PB_X type=list values=a,b default=", "a,c", "a comma-separated subset of a, b (or empty)"),
])
def test_parse_refuses_bad_values_naming_knob_and_allowed(decl, raw, allowed):
    k = parse_declaration(decl)
    with pytest.raises(KnobError) as e:
        k.parse(raw)
    assert str(e.value) == f"PB_X={raw} is not a valid value (allowed: {allowed})"


def test_validate_settings_reports_unknown_and_bad_values():
    ks = [parse_declaration("PB_A type=bool default=0"), parse_declaration("PB_B type=enum values=x,y default=x")]
    settings = {"PB_A": "1", "PB_B": "z", "PB_NOPE": "1", "PORT": "8000"}
    errors = knobs.validate_settings(ks, settings, "config/prod.env")
    assert errors == [
        "config/prod.env: PB_B=z is not a valid value (allowed: x, y)",
        "config/prod.env: PB_NOPE is not a knob of this series (known: PB_A, PB_B)",
    ]
    assert knobs.validate_settings(ks, {"PB_A": "0", "PB_B": "y", "HOST": "x"}, "f") == []
    assert knobs.validate_settings([], {"PB_A": "1"}, "f") == ["f: PB_A is not a knob of this series (known: none)"]


def test_registry_json_round_trips_every_field():
    ks = [
        parse_declaration("PB_A type=bool default=0", per_request=True, patch="0020-a"),
        parse_declaration("PB_N type=int min=1 max=9 default=3", patch="0030-n"),
        parse_declaration("PB_E type=enum values=p,q default=q", patch="0040-e"),
        parse_declaration("PB_L type=list values=s,t default=", per_request=True, patch="0050-l"),
    ]
    data = json.loads(knobs.registry_json(ks))
    assert sorted(data["knobs"]) == ["PB_A", "PB_E", "PB_L", "PB_N"]
    back = []
    for name, e in data["knobs"].items():
        back.append(Knob(name=name, type=e["type"], default=e["default"], values=tuple(e.get("values", ())),
                         min=e.get("min"), max=e.get("max"), per_request=e["per_request"], patch=e["patch"]))
    assert sorted(back, key=lambda k: k.name) == sorted(ks, key=lambda k: k.name)
    assert "values" not in data["knobs"]["PB_A"] and "min" not in data["knobs"]["PB_E"]


def test_patches_md_is_up_to_date():
    loaded, problems = series.load()
    assert problems == []
    expected = knobs.render_patches_md(loaded)
    actual = (ROOT / "docs" / "PATCHES.md").read_text()
    assert actual == expected, "docs/PATCHES.md is stale; run `python -m patchbay docs`"
    for k in loaded.knobs():
        assert f"`{k.name}`" in expected


def test_a_value_listed_twice_is_refused():
    with pytest.raises(KnobError, match="lists a value twice"):
        parse_declaration("PB_X type=enum values=a,b,a default=a")


def test_a_knob_set_table_replaces_its_block_and_a_missing_block_is_named(real_series):
    from patchbay.runtime.config import knob_set

    table = knobs.render_knob_set_md("prod", knob_set("prod"), real_series)
    assert "| `PB_FUSED_MOE=1` | [0220-fused-moe](docs/PATCHES.md#0220-fused-moe) | adopted |" in table
    start, end = knobs.BLOCK_START.format(name="prod"), knobs.BLOCK_END.format(name="prod")
    text = f"before\n{start}\nold rows\n{end}\nafter\n"
    assert knobs.with_block(text, "prod", table) == f"before\n{table}\nafter\n"
    with pytest.raises(knobs.KnobError, match="no generated block for knob set prod"):
        knobs.with_block("no markers here", "prod", table)
