"""PB_VLLM_FIELDS: the request fields vLLM's clients send, honoured or ignored, never refused.

Upstream answers any field its OpenAI parameter class does not know with a 422, so a benchmark
client that sends `ignore_eos` fails every request. With the knob on:
- honoured: `ignore_eos`, `min_tokens`, `repetition_penalty` (on the prompt's and the reply's
  tokens, as vLLM applies it), `stop_token_ids`, `include_stop_str_in_output`,
  `skip_special_tokens` (when no GLM parsing needs the special tokens);
- `n` up to MAX_CHOICES choices on the chat route (choices.py: they share the prompt's blocks);
- legacy `functions` / `function_call` become `tools` / `tool_choice`;
- any other field the route does not know is dropped, with one warning per field name in the
  log, as vLLM does.
A honoured field of the wrong type or range is a 400 naming it and what is allowed.
"""

import contextvars
import logging

from .. import knobs

logger = logging.getLogger(__name__)

MAX_CHOICES = 16  # n: each choice is a request of its own in the batch

_taken: contextvars.ContextVar = contextvars.ContextVar("pb_vllm_fields", default=None)
_warned: set = set()


def on() -> bool:
    return bool(knobs.get("PB_VLLM_FIELDS"))


def _bad(message: str, param: str) -> knobs.PBRequestError:
    return knobs.PBRequestError(400, message, code="invalid_value", param=param)


def _flag(body: dict, key: str):
    value = body.pop(key)
    if not isinstance(value, bool):
        raise _bad(f"{key}={value!r} is not valid (allowed: true, false)", key)
    return value


def _min_tokens(body: dict, key: str):
    value = body.pop(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 20:
        raise _bad(f"{key}={value!r} is not valid (allowed: an integer from 0 to {1 << 20})", key)
    return value


def _penalty(body: dict, key: str):
    value = body.pop(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 10:
        raise _bad(f"{key}={value!r} is not valid (allowed: a number above 0 and at most 10; 1 is none)", key)
    return float(value)


def _token_ids(body: dict, key: str):
    value = body.pop(key)
    if not isinstance(value, list) or len(value) > 64 or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise _bad(f"{key} is not valid (allowed: a list of at most 64 token ids, non-negative integers)", key)
    return list(value)


HONOURED = {"ignore_eos": _flag, "min_tokens": _min_tokens, "repetition_penalty": _penalty,
            "stop_token_ids": _token_ids, "include_stop_str_in_output": _flag, "skip_special_tokens": _flag}


def map_legacy(body: dict) -> None:
    """OpenAI's legacy function calling as tools: `functions` -> `tools`, `function_call` ->
    `tool_choice` (before 0100 and 0140 read the body)."""
    if not on():
        return
    functions = body.pop("functions", None)
    call = body.pop("function_call", None)
    if functions is not None:
        if "tools" in body:
            raise _bad("give `tools` or the legacy `functions`, not both", "functions")
        if not isinstance(functions, list) or not all(isinstance(f, dict) for f in functions):
            raise _bad("functions must be a list of function definitions ({name, description, parameters})",
                       "functions")
        body["tools"] = [{"type": "function", "function": f} for f in functions]
    if call is not None:
        if "tool_choice" in body:
            raise _bad("give `tool_choice` or the legacy `function_call`, not both", "function_call")
        if call in ("auto", "none"):
            body["tool_choice"] = call
        elif isinstance(call, dict) and isinstance(call.get("name"), str):
            body["tool_choice"] = {"type": "function", "function": {"name": call["name"]}}
        else:
            raise _bad("function_call must be \"auto\", \"none\" or {\"name\": ...}", "function_call")


def take(body: dict, known) -> None:
    """Before upstream checks the body's fields: take the honoured ones, drop the unknown ones."""
    if not on():
        _taken.set(None)
        return
    taken = {key: read(body, key) for key, read in HONOURED.items() if key in body}
    for key in sorted(set(body) - set(known)):
        body.pop(key)
        if key not in _warned:
            _warned.add(key)
            logger.warning("patchbay: ignoring the request field %r (nothing here honours it)", key)
    _taken.set(taken)


def get(key: str, default=None):
    taken = _taken.get()
    return default if not taken else taken.get(key, default)


def taken() -> dict | None:
    """The current request's honoured fields, to hand to another process (0720)."""
    return _taken.get()


def use_taken(fields: dict | None) -> None:
    """Make `fields` the current context's honoured fields (0720's reply process)."""
    _taken.set(fields)


def eos_ids(eos) -> list[int]:
    """The ids that end a reply: the model's end-of-turn ids (none with ignore_eos), then
    `stop_token_ids`."""
    base = [] if get("ignore_eos") else list(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    return base + [t for t in get("stop_token_ids", []) if t not in base]


def apply(spec, input_ids, eos) -> None:
    """The sampling fields onto the request's sampler spec."""
    spec.repetition_penalty = get("repetition_penalty", 1.0)
    if spec.repetition_penalty != 1.0:
        spec.prompt_ids = list(input_ids)
    spec.min_tokens = get("min_tokens", 0)
    if spec.min_tokens:
        spec.suppress = tuple(eos_ids(eos))


def wants_spec() -> bool:
    return get("repetition_penalty", 1.0) != 1.0 or bool(get("min_tokens", 0))
