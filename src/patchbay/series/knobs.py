"""Knob declarations: parsed from patch headers, validated, turned into the engine registry.

A patch header declares its knob on one line:

    Knob: PB_SSE_DONE type=bool default=0
    Knob: PB_PREFILL_CHUNK type=int min=0 max=65536 default=0
    Knob: PB_REASONING_FIELD type=enum values=upstream,reasoning,both default=upstream
    Knob: PB_TRACE type=list values=sched,kv,sampler default=

The default is always the value that means "upstream behaviour". The engine reads the
registry generated from these lines (`registry_json`), so the header is the only place
a knob is declared. What a value may be is the engine's own grammar (engine/_pb/knobs.py:
`allowed`, `parse_value` on a registry entry), loaded from the overlay, so a config this
module accepts is one the engine accepts.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass, field

from .. import ROOT

TYPES = ("bool", "int", "enum", "list")
NAME_RE = re.compile(r"^PB_[A-Z0-9_]+$")


@functools.cache
def _engine_knobs():
    """engine/_pb/knobs.py as a module of its own (stdlib only; not the built engine's copy)."""
    spec = importlib.util.spec_from_file_location("patchbay._engine_knobs", ROOT / "engine" / "_pb" / "knobs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KnobError = _engine_knobs().KnobError  # one error type: a declaration or value that cannot be accepted


@dataclass(frozen=True)
class Knob:
    name: str
    type: str
    default: str
    values: tuple[str, ...] = ()
    min: int | None = None
    max: int | None = None
    per_request: bool = False
    patch: str = ""
    description: str = field(default="", compare=False)

    def spec(self) -> dict:
        """This knob's entry in the engine's registry."""
        entry = {"type": self.type, "default": self.default, "per_request": self.per_request, "patch": self.patch}
        if self.values:
            entry["values"] = list(self.values)
        if self.type == "int":
            entry["min"], entry["max"] = self.min, self.max
        return entry

    def allowed(self) -> str:
        return _engine_knobs().allowed(self.spec())

    def parse(self, raw: str):
        """The typed value of raw, or KnobError naming the knob and what is allowed."""
        return _engine_knobs().parse_value(self.name, self.spec(), raw)


def parse_declaration(text: str, *, per_request: bool = False, patch: str = "",
                      description: str = "") -> Knob | None:
    """Parse the value of a `Knob:` header field. `none` declares no knob."""
    text = text.strip()
    if text.lower() == "none":
        return None
    name, _, rest = text.partition(" ")
    if not NAME_RE.match(name):
        raise KnobError(f"knob name {name!r} must look like PB_UPPER_CASE")
    attrs: dict[str, str] = {}
    for token in rest.split():
        key, eq, value = token.partition("=")
        if not eq:
            raise KnobError(f"{name}: {token!r} is not key=value")
        if key not in ("type", "default", "values", "min", "max"):
            raise KnobError(f"{name}: unknown attribute {key!r} (allowed: type, default, values, min, max)")
        if key in attrs:
            raise KnobError(f"{name}: {key} given twice")
        attrs[key] = value
    kind = attrs.get("type")
    if kind not in TYPES:
        raise KnobError(f"{name}: type={kind} is not a knob type (allowed: {', '.join(TYPES)})")
    if "default" not in attrs:
        raise KnobError(f"{name}: default= is required (the value that means upstream behaviour)")
    values = tuple(v for v in attrs.get("values", "").split(",") if v)
    if len(set(values)) != len(values):
        raise KnobError(f"{name}: values= lists a value twice")
    lo = hi = None
    if kind in ("enum", "list") and not values:
        raise KnobError(f"{name}: type={kind} needs values=a,b,...")
    if kind not in ("enum", "list") and "values" in attrs:
        raise KnobError(f"{name}: values= only applies to enum and list knobs")
    if kind == "int":
        try:
            lo, hi = int(attrs["min"]), int(attrs["max"])
        except (KeyError, ValueError):
            raise KnobError(f"{name}: type=int needs integer min= and max=") from None
        if lo > hi:
            raise KnobError(f"{name}: min {lo} is above max {hi}")
    elif "min" in attrs or "max" in attrs:
        raise KnobError(f"{name}: min=/max= only apply to int knobs")
    knob = Knob(name=name, type=kind, default=attrs["default"], values=values, min=lo, max=hi,
                per_request=per_request, patch=patch, description=description)
    knob.parse(knob.default)  # the default itself must be a valid value
    if kind == "bool" and knob.default != "0":
        raise KnobError(f"{name}: a bool knob's default must be 0 (off = upstream)")
    return knob


def registry_json(knobs: list[Knob]) -> str:
    """The registry the engine's knob runtime reads, generated from the headers."""
    return json.dumps({"knobs": {k.name: k.spec() for k in knobs}}, indent=2, sort_keys=True) + "\n"


def validate_settings(knobs: list[Knob], settings: dict[str, str], source: str) -> list[str]:
    """Errors for PB_* settings that name no knob or carry a bad value (empty list: all good)."""
    by_name = {k.name: k for k in knobs}
    errors = []
    for name, raw in sorted(settings.items()):
        if not name.startswith("PB_"):
            continue
        knob = by_name.get(name)
        if knob is None:
            known = ", ".join(sorted(by_name)) or "none"
            errors.append(f"{source}: {name} is not a knob of this series (known: {known})")
            continue
        try:
            knob.parse(raw)
        except KnobError as e:
            errors.append(f"{source}: {e}")
    return errors


def render_patches_md(series) -> str:
    """docs/PATCHES.md, generated from the patch headers (`patchbay docs`)."""
    out = ["# Patches", "",
           "Generated from the patch headers by `patchbay docs`; edit the headers, not this file.", "",
           "| # | patch | knob | allowed (default) | per request | status | exactness | gain |",
           "|---|---|---|---|---|---|---|---|"]
    for p in series.patches:
        f, k = p.fields, p.knob
        knob = f"`{k.name}`" if k else "—"
        allowed = f"{k.allowed()} (`{k.default or '(empty)'}`)" if k else "—"
        out.append(f"| {p.number:04d} | [{p.slug}](#{p.name}) | {knob} | {allowed} | {f.get('Per-Request')} "
                   f"| {f.get('Status')} | {f.get('Exactness')} | {f.get('Gain')} |")
    for p in series.patches:
        f = p.fields
        title, _, body = f.get("Description", "").partition("\n")
        out += ["", f'<a id="{p.name}"></a>', f"## {p.name}", "", f"**{title}**", ""]
        if body.strip():
            out += [body.strip(), ""]
        out += [f"- Knob: `{f.get('Knob')}`", f"- Depends: {', '.join(p.depends) or 'none'}",
                f"- Upstream-Status: {f.get('Upstream-Status')}", f"- Last-Update: {f.get('Last-Update')}",
                "- Modules (engine/): " + (", ".join(f"`{name}`" for name in p.modules) or "none"),
                "- Hooks in upstream files: " + (", ".join(f"`{name}`" for name in p.files()) or "none")]
    return "\n".join(out) + "\n"


BLOCK_START = "<!-- knob set {name}: generated by `patchbay docs` from config/knob-sets.toml -->"
BLOCK_END = "<!-- end of knob set {name} -->"


def render_knob_set_md(name: str, settings: dict[str, str], series) -> str:
    """A knob set as a Markdown table: each knob, its value, and the patch it belongs to."""
    by_knob = {p.knob.name: p for p in series.patches if p.knob}
    rows = [f"| `{knob}={value}` | [{by_knob[knob].name}](docs/PATCHES.md#{by_knob[knob].name}) | "
            f"{by_knob[knob].status} | {by_knob[knob].fields.get('Description', '').partition(chr(10))[0]} |"
            for knob, value in settings.items()]
    return "\n".join([BLOCK_START.format(name=name), "", "| knob | patch | status | what it does |",
                      "|---|---|---|---|", *rows, "", BLOCK_END.format(name=name)])


def with_block(text: str, name: str, block: str) -> str:
    """text with its generated block for knob set `name` replaced by `block`."""
    start, end = BLOCK_START.format(name=name), BLOCK_END.format(name=name)
    head, found, rest = text.partition(start)
    if not found or end not in rest:
        raise KnobError(f"the text has no generated block for knob set {name} ({start} ... {end})")
    return head + block + rest.partition(end)[2]
