"""PB_API_ERRORS: every client mistake is a 4xx in the OpenAI error shape; a fault is a 500
that names the request id and nothing else.

The shape is `{"error": {"message", "type", "param", "code"}}`, the one patchbay's own checks
(knobs.PBRequestError) already answer with. Installed on the app:
- FastAPI's own refusals (a body that is not JSON, a field of the wrong type in the typed request
  models of `requests.py`) and every HTTPException upstream raises (its 422 for unexpected
  fields, its 400s and 404s) are translated, with the field named in `param` where known;
- a worker that died answers 503 `engine_unavailable`;
- any other exception is logged with its traceback and answered 500 `internal_error` with the
  request id, never the traceback.
`check_inputs` refuses a prompt of zero tokens before it reaches the batching loop (a request
with nothing to attend to crashed upstream's worker) and applies the context limit to every
generation route, /v1/responses included.
"""

import logging
import re

from .. import knobs

logger = logging.getLogger("transformers._pb.api.errors")

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 409: "invalid_request_error",
         413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error"}


def on() -> bool:
    return bool(knobs.get("PB_API_ERRORS"))


def body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    kind = TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def response(status: int, message: str, code: str | None = None, param: str | None = None, headers=None):
    from fastapi.responses import JSONResponse

    return JSONResponse(body(status, message, code, param), status_code=status, headers=headers)


async def send(send, status: int, message: str, code: str | None = None, headers=()) -> None:
    """The same error answered straight through ASGI, for the connection-level guards that run
    outside FastAPI (auth, the body limit)."""
    import json

    payload = json.dumps(body(status, message, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})


_BRANCH = re.compile(r"^(int|float|str|bool|list|dict|none|json-or-python|literal|constrained-.*|function-.*|"
                     r"tagged-union.*|lax-.*|strict-.*|[A-Z].*|.*\[.*)$")


def _field(loc) -> str | None:
    """`messages[0].content` from pydantic's location tuple: the leading 'body' and the names
    pydantic gives the branches of a union (`int`, `list[str]`, ...) dropped."""
    out = ""
    for p in loc:
        if p == "body" and not out:
            continue
        if isinstance(p, int):
            out += f"[{p}]"
        elif not _BRANCH.match(p):
            out += f".{p}" if out else p
    return out or None


def _validation_message(errors: list[dict]) -> tuple[str, str | None, str]:
    """One message for the first field that is wrong (a union's branches each report it)."""
    first = errors[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON: {detail}".rstrip(": "), None, "invalid_json"
    field = _field(first.get("loc", ()))
    if field is None and kind in ("model_attributes_type", "dict_type", "model_type"):
        return "the request body must be a JSON object", None, "invalid_body"
    if kind == "missing":
        message, code = f"'{field}' is required", "missing_field"
    else:
        same = [e for e in errors if _field(e.get("loc", ())) == field]
        reasons = list(dict.fromkeys(e.get("msg", "invalid value") for e in same))
        got = first.get("input")
        shown = f"<{type(got).__name__}>" if isinstance(got, (dict, list)) else repr(got)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        message, code = f"{field}={shown} is not valid ({'; or '.join(reasons).lower()})", "invalid_value"
    others = {_field(e.get("loc", ())) for e in errors} - {field}
    if others:
        message += f" (and {len(others)} more field{'s' if len(others) > 1 else ''}: {', '.join(sorted(map(str, others)))})"
    return message, field, code


def install(app) -> None:
    from fastapi import HTTPException
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from transformers.cli.serving.utils import CBWorkerDeadError

    @app.exception_handler(RequestValidationError)
    async def _validation(_request, exc: RequestValidationError):
        errors = exc.errors()
        message, field, code = _validation_message(errors) if errors else ("invalid request", None, None)
        return response(400, message, code, field)

    async def _http(_request, exc):
        status = 400 if exc.status_code == 422 else exc.status_code
        if isinstance(exc.detail, list) and exc.detail and isinstance(exc.detail[0], dict) and "loc" in exc.detail[0]:
            message, field, code = _validation_message(exc.detail)  # a handler's own pydantic check
            return response(status, message, code, field)
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(status)
        if status == 400 and detail.startswith("Unexpected fields"):
            code = "unknown_field"
        return response(status, detail, code, headers=getattr(exc, "headers", None))

    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(StarletteHTTPException, _http)

    @app.exception_handler(CBWorkerDeadError)
    async def _dead(request, exc):
        logger.error("request %s: %s", _request_id(request), exc)
        return response(503, "the batching worker has stopped; the server is restarting or must be restarted",
                        "engine_unavailable")

    @app.exception_handler(Exception)
    async def _fault(request, exc: Exception):
        rid = _request_id(request)
        logger.error("request %s failed inside the server", rid, exc_info=exc)
        return response(500, f"internal error while serving request {rid}; the server log has the details",
                        "internal_error")


def _request_id(request) -> str:
    return getattr(request.state, "request_id", None) or request.headers.get("x-request-id") or "?"


def check_inputs(model, inputs, gen_config) -> None:
    """Called by every generation path before a request is queued: a prompt of no tokens is a
    400 (the batching loop cannot run it), and the context limit holds on every route."""
    if not on():
        return
    from . import context

    ids = inputs["input_ids"]
    if context.prompt_length(ids) == 0:
        raise knobs.PBRequestError(400, "the prompt is empty after tokenization (0 tokens); send at least "
                                   "one token of input", code="empty_prompt", param="prompt")
    context.enforce(model, ids, gen_config, "input")
