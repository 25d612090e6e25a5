"""PB_GLM_MESSAGES: turn what real chat clients send into what GLM chat templates expect.

Clients replay whole conversations: past assistant turns come back with `content: null`
or `""` next to `tool_calls`, tool-call `arguments` as JSON strings, content as a list of
text parts, and the turn's thinking as `reasoning_content` (or `reasoning`). Upstream drops
an assistant turn's text when it also calls a tool, drops the thinking, joins text parts
with spaces and answers a malformed `arguments` string with a 500. Here every one of those
is kept or refused with a 400 that names the message. `reasoning_effort` and
`thinking: {"type": "enabled"|"disabled"}` become the template's `enable_thinking`.
"""

import contextvars
import copy
import json

from .. import knobs


_EFFORT_THINKS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True}
# The request's reasoning_effort, taken from the body here; 0150 turns it into a thinking budget.
_effort: contextvars.ContextVar = contextvars.ContextVar("pb_reasoning_effort", default=None)


def asked_effort():
    return _effort.get()


def on() -> bool:
    return bool(knobs.get("PB_GLM_MESSAGES"))


def _bad(message: str, param: str) -> knobs.PBRequestError:
    return knobs.PBRequestError(400, message, code="invalid_messages", param=param)


def take_thinking_fields(body: dict) -> None:
    """Map `reasoning_effort` and `thinking` onto `chat_template_kwargs.enable_thinking`.

    Runs before upstream validates the body (which does not know `thinking`). A value the
    request gives in `chat_template_kwargs` itself wins."""
    if not on():
        return
    thinks = None
    effort = body.pop("reasoning_effort", None)
    _effort.set(effort)
    if effort is not None:
        if effort not in _EFFORT_THINKS:
            raise _bad(f"reasoning_effort={effort!r} is not supported (allowed: {', '.join(_EFFORT_THINKS)})",
                       "reasoning_effort")
        thinks = _EFFORT_THINKS[effort]
    thinking = body.pop("thinking", None)
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled"):
            raise _bad('thinking must be {"type": "enabled"} or {"type": "disabled"}', "thinking")
        thinks = kind == "enabled"
    if thinks is None:
        return
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _bad("chat_template_kwargs must be an object", "chat_template_kwargs")
    body["chat_template_kwargs"] = {"enable_thinking": thinks, **(kwargs or {})}


def _text(content, where: str) -> str:
    """A message's content as one string: null -> "", text parts joined as written."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string, null or a list of text parts", where)
    parts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
            raise _bad(f"{where}.content[{i}] is not a text part (this model reads text only)", where)
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls must be a list", where)
    out = []
    for i, call in enumerate(calls):
        here = f"{where}.tool_calls[{i}]"
        if not isinstance(call, dict):
            raise _bad(f"{here} must be an object", here)
        call = copy.deepcopy(call)
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        if not isinstance(fn.get("name"), str):
            raise _bad(f"{here}.function.name is missing", here)
        args = fn.get("arguments")
        if args is None or args == "":
            args = {}
        elif isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise _bad(f"{here}.function.arguments is not valid JSON: {args[:80]!r}", here) from None
        if not isinstance(args, dict):
            raise _bad(f"{here}.function.arguments must be a JSON object", here)
        fn["arguments"] = args
        out.append(call)
    return out


def convert(messages) -> list[dict]:
    """OpenAI chat messages -> the message dicts handed to a text model's chat template."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"{where} must be an object with a role", where)
        parsed = {"role": message["role"], "content": _text(message.get("content"), where)}
        if message.get("tool_calls"):
            parsed["tool_calls"] = _tool_calls(message["tool_calls"], where)
        for key in ("tool_call_id", "name"):
            if message.get(key) is not None:
                parsed[key] = message[key]
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if reasoning:
            parsed["reasoning_content"] = _text(reasoning, where)
        out.append(parsed)
    return out


def processor_inputs(handler, messages, modality) -> list[dict]:
    """The hook: this module's conversion for text models when the knob is on, else upstream's."""
    if on() and getattr(modality, "value", None) == "LLM":
        return convert(messages)
    return handler.get_processor_inputs_from_messages(messages, modality)
