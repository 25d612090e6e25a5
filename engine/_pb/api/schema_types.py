"""Type a GLM tool-call argument from the tool's JSON schema.

GLM writes every argument as text between `<arg_value>` tags: strings as they are, other
values as JSON. The schema decides which it is, never the look of the text: a `string`
parameter keeps "0042", "123_456" and "  Beijing  " exactly; `null` is None only where the
schema allows null; anyOf / oneOf / type lists / enum / $ref (local) are followed.
"""

import json


def _resolve(schema, root: dict, depth: int = 0):
    """Follow a local `$ref` (#/$defs/X, #/definitions/X) to the schema it names."""
    while isinstance(schema, dict) and "$ref" in schema and depth < 16:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return {}
        node = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        schema, depth = node, depth + 1
    return schema if isinstance(schema, dict) else {}


def kinds(schema, root: dict | None = None) -> set[str]:
    """The JSON types a schema admits ("any" when it does not say)."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    out: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        out.add(kind)
    elif isinstance(kind, list):
        out.update(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            out |= kinds(sub, root)
    values = list(schema.get("enum") or [])
    if "const" in schema:
        values.append(schema["const"])
    for value in values:
        out.add(_kind_of(value))
    return out or {"any"}


def _kind_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _admits(allowed: set[str], value) -> bool:
    kind = _kind_of(value)
    if "any" in allowed or kind in allowed:
        return True
    if kind == "integer" and "number" in allowed:
        return True
    return kind == "number" and "integer" in allowed and float(value).is_integer()


def param_schema(tool_parameters: dict | None, key: str) -> tuple[dict | None, dict]:
    """The schema of argument `key` of a tool (None if the tool does not declare it)."""
    root = tool_parameters if isinstance(tool_parameters, dict) else {}
    props = _resolve(root, root).get("properties")
    if isinstance(props, dict) and key in props:
        return props[key], root
    extra = root.get("additionalProperties")
    return (extra, root) if isinstance(extra, dict) else (None, root)


def is_text(schema: dict | None, root: dict) -> bool:
    """Whether the raw text is the value as it stands (a string-only or undeclared argument)."""
    return schema is None or kinds(schema, root) <= {"string"}


def convert(raw: str, schema: dict | None, root: dict):
    """The typed value of one argument's raw text."""
    if is_text(schema, root):
        return raw
    allowed = kinds(schema, root)
    text = raw.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = _python_literal(text, allowed)
        if value is _NO:
            return raw
    if _admits(allowed, value):
        return value
    # A string parameter that also admits other types keeps text that is not one of them.
    return raw if "string" in allowed else value


_NO = object()


def _python_literal(text: str, allowed: set[str]):
    """GLM sometimes writes Python's spelling of booleans and null."""
    if "boolean" in allowed and text in ("True", "False"):
        return text == "True"
    if "null" in allowed and text == "None":
        return None
    return _NO
