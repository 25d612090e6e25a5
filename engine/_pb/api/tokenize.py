"""PB_TOKENIZE: `POST /tokenize` (a prompt or chat messages -> token ids, tokenized exactly
as the completion endpoints do) and token-id prompts on `/v1/completions`."""

from fastapi import Request
from fastapi.responses import JSONResponse

from .. import knobs
from . import messages as messages_hook
from .context import max_model_len


def accepts(prompt) -> bool:
    """Whether a non-string completions prompt is a token-id list this build serves."""
    if not knobs.get("PB_TOKENIZE") or not isinstance(prompt, list):
        return False
    if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        raise knobs.PBRequestError(400, "prompt must be a string or a non-empty list of token ids "
                                        "(non-negative integers)", code="invalid_prompt", param="prompt")
    return True


def token_inputs(token_ids: list[int], model, use_cb: bool):
    """Inputs shaped like the tokenizer's own output for the chosen generation path."""
    from transformers import BatchEncoding

    vocab = model.config.get_text_config().vocab_size
    if max(token_ids) >= vocab:
        raise knobs.PBRequestError(400, f"token id {max(token_ids)} is out of range (vocabulary size {vocab})",
                                   code="invalid_prompt", param="prompt")
    if use_cb:
        return BatchEncoding({"input_ids": list(token_ids), "attention_mask": [1] * len(token_ids)})
    return BatchEncoding({"input_ids": [list(token_ids)], "attention_mask": [[1] * len(token_ids)]},
                         tensor_type="pt")


def install(app, chat_handler) -> None:
    from ...cli.serving.utils import Modality

    @app.post("/tokenize")
    async def tokenize(request: Request, body: dict):
        knobs.take_request_overrides(body)
        has_prompt, has_messages = "prompt" in body, "messages" in body
        if has_prompt == has_messages:
            raise knobs.PBRequestError(400, "give exactly one of `prompt` (a string) or `messages` (a list)",
                                       code="invalid_request")
        model_id, model, processor = chat_handler._resolve_model(body)
        if has_prompt:
            if not isinstance(body["prompt"], str):
                raise knobs.PBRequestError(400, "prompt must be a string", param="prompt")
            tokenizer = getattr(processor, "tokenizer", processor)
            ids = tokenizer(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True)))
            ids = ids["input_ids"]
        else:
            if not isinstance(body["messages"], list):
                raise knobs.PBRequestError(400, "messages must be a list", param="messages")
            try:
                messages = messages_hook.processor_inputs(chat_handler, body["messages"], Modality.LLM)
            except (KeyError, TypeError, ValueError) as e:
                raise knobs.PBRequestError(400, f"messages are malformed: {e!r}", param="messages") from None
            messages_hook.take_thinking_fields(body)
            kwargs = {**chat_handler.chat_template_kwargs, **(body.get("chat_template_kwargs") or {})}
            ids = processor.apply_chat_template(
                messages, add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                tools=body.get("tools"), tokenize=True, return_dict=True, **kwargs)["input_ids"]
        return JSONResponse({"model": model_id, "tokens": list(ids), "count": len(ids),
                             "max_model_len": max_model_len(model.config)})
