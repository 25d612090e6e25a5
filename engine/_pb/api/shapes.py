"""PB_OPENAI_SHAPES: replies shaped as OpenAI's (and vLLM's) are, where upstream's differ.

- `id` is `chatcmpl-<request id>` (upstream: the bare request id, a UUID).
- `system_fingerprint` is the build id (upstream: empty), so a client can tell two builds apart.
- A stream carries usage only when the client asks (`stream_options.include_usage`), in a last
  chunk of its own with `choices: []`; upstream puts it on the finish chunk of every stream.
- A `max_tokens` (or `max_completion_tokens`, or /v1/responses' `max_output_tokens`) larger than
  the room the prompt leaves in the context is a 400 naming the numbers; upstream (with 0030)
  shortens it without a word.
"""

from .. import knobs


def on() -> bool:
    return bool(knobs.get("PB_OPENAI_SHAPES"))


def reply_id(request_id: str, prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{request_id}" if on() else request_id


def system_fingerprint() -> str:
    return knobs.build_id() if on() else ""


def usage_in_stream(body: dict) -> str:
    """Where a stream's usage goes: "finish" (upstream: on the finish chunk), "last" (a chunk of
    its own with no choices, asked for) or "none"."""
    if not on():
        return "finish"
    options = body.get("stream_options")
    return "last" if isinstance(options, dict) and options.get("include_usage") else "none"


def check_room(body: dict, prompt_tokens: int, limit: int | None,
               keys: tuple[str, ...] = ("max_completion_tokens", "max_tokens")) -> None:
    """A max_tokens the context cannot hold after the prompt is the client's mistake, named."""
    if not on() or limit is None:
        return
    for key in keys:
        asked = body.get(key)
        if isinstance(asked, int) and not isinstance(asked, bool) and prompt_tokens + asked > limit:
            raise knobs.PBRequestError(
                400, f"{key}={asked} is too large: the prompt has {prompt_tokens} tokens and this model's maximum "
                     f"context length is {limit} tokens, which leaves room for at most {max(limit - prompt_tokens, 0)} "
                     f"(allowed: {key} <= {max(limit - prompt_tokens, 0)})",
                code="invalid_value", param=key)



def check_output_room(body: dict, model, input_ids) -> None:
    """/v1/responses: a max_output_tokens the context cannot hold after the prompt, named as
    check_room names a chat request's max_tokens (upstream, with 0030, shortens it without a word)."""
    if not on():
        return
    from .context import max_model_len, prompt_length

    check_room(body, prompt_length(input_ids), max_model_len(model.config), keys=("max_output_tokens",))
