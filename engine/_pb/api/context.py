"""PB_CONTEXT_LIMIT: refuse a prompt that does not fit the model's context with the OpenAI
error shape (HTTP 400, code `context_length_exceeded`), and clamp a max_tokens that only
overruns the room left after the prompt instead of refusing it."""

from .. import knobs


def max_model_len(config) -> int | None:
    """The context length the model was built for (None if the config does not say)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text_config, "max_position_embeddings", None)
    return int(value) if value else None


def prompt_length(input_ids) -> int:
    # The continuous-batching path hands plain lists, the sequential path a [1, n] tensor.
    return input_ids.shape[-1] if hasattr(input_ids, "shape") else len(input_ids)


def enforce(model, input_ids, gen_config, what: str) -> None:
    """Check one request before it is queued; `what` is "messages" or "prompt"."""
    if not knobs.get("PB_CONTEXT_LIMIT"):
        return
    limit = max_model_len(model.config)
    if limit is None:
        return
    n = prompt_length(input_ids)
    if n >= limit:
        raise knobs.PBRequestError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your {what} resulted in "
            f"{n} tokens, which leaves no room for a reply. Please reduce the length of the {what}.",
            code="context_length_exceeded",
            param=what,
        )
    room = limit - n
    if gen_config.max_new_tokens is None or gen_config.max_new_tokens > room:
        gen_config.max_new_tokens = room
