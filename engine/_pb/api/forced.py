"""PB_FORCED_DECODING: make the sampler emit a given reply and report each token's logprob.

Two ways in:
- per request, `"pb_forced": {"text": "..."}` (or `{"tokens": [ids]}`): the reply is
  exactly that, then an end-of-turn token; its choice carries every token's logprob under
  the model, which scores a reference text (teacher forcing);
- for clients that cannot add fields (an agent such as opencode), `POST /pb/forced` queues
  replies, each taken by the next chat request its `when` matches (`tools`: whether the
  request offers tools; `last_user_contains`: a substring of the last user message;
  `tool_result_contains`: the last message is a tool result holding this substring).
  `GET /pb/forced` lists what is queued, `DELETE /pb/forced` empties the queue.
The model still runs every step; only the choice of token is fixed. This is how end-to-end
tests drive a whole tool-calling conversation through the real engine on random weights.
"""

import threading

from .. import knobs


WHEN = ("tools", "last_user_contains", "tool_result_contains")
_queue: list[dict] = []
_lock = threading.Lock()


def on() -> bool:
    return bool(knobs.get("PB_FORCED_DECODING"))


def _bad(message: str, param: str = "pb_forced") -> knobs.PBRequestError:
    return knobs.PBRequestError(400, message, code="invalid_forced_reply", param=param)


def _check(reply, where: str) -> dict:
    if not isinstance(reply, dict) or ("text" in reply) == ("tokens" in reply):
        raise _bad(f"{where} must be an object with exactly one of `text` (a string) or `tokens` (a list of ids)")
    if "text" in reply and not isinstance(reply["text"], str):
        raise _bad(f"{where}.text must be a string")
    if "tokens" in reply:
        tokens = reply["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in tokens):
            raise _bad(f"{where}.tokens must be a list of token ids (non-negative integers)")
    when = reply.get("when", {})
    if not isinstance(when, dict) or set(when) - set(WHEN):
        raise _bad(f"{where}.when may only hold {', '.join(WHEN)}")
    return reply


def token_ids(reply: dict, tokenizer) -> list[int]:
    if "tokens" in reply:
        ids = list(reply["tokens"])
        if ids and max(ids) >= len(tokenizer):
            raise _bad(f"token id {max(ids)} is out of range (vocabulary size {len(tokenizer)})")
        return ids
    return tokenizer.encode(reply["text"], add_special_tokens=False)


def _matches(when: dict, body: dict) -> bool:
    if "tools" in when and bool(when["tools"]) != bool(body.get("tools")):
        return False
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    needle = when.get("last_user_contains")
    if needle is not None:
        users = [m for m in messages if m.get("role") == "user"]
        if not users or needle not in _text(users[-1].get("content")):
            return False
    needle = when.get("tool_result_contains")
    if needle is not None:
        if not messages or messages[-1].get("role") != "tool" or needle not in _text(messages[-1].get("content")):
            return False
    return True


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def take(body: dict, per_request) -> tuple[dict | None, bool]:
    """The forced reply for this request, and whether the request itself asked for it."""
    if per_request is not None:
        return _check(per_request, "pb_forced"), True
    with _lock:
        for i, reply in enumerate(_queue):
            if _matches(reply.get("when", {}), body):
                return _queue.pop(i), False
    return None, False


def install(app) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.post("/pb/forced")
    async def queue_replies(request: Request):
        try:
            body = await request.json()
        except ValueError:
            raise _bad("the body must be JSON: {\"replies\": [...]}", "replies") from None
        replies = body.get("replies") if isinstance(body, dict) else None
        if not isinstance(replies, list) or not replies:
            raise _bad("give `replies`: a non-empty list of {text | tokens, when?}", "replies")
        checked = [_check(r, f"replies[{i}]") for i, r in enumerate(replies)]
        with _lock:
            _queue.extend(checked)
            pending = len(_queue)
        return JSONResponse({"queued": len(checked), "pending": pending})

    @app.get("/pb/forced")
    async def list_replies():
        with _lock:
            return JSONResponse({"pending": len(_queue), "replies": list(_queue)})

    @app.delete("/pb/forced")
    async def clear_replies():
        with _lock:
            dropped = len(_queue)
            _queue.clear()
        return JSONResponse({"dropped": dropped})
