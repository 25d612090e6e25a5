"""Installs patchbay's routes and error handling on the upstream FastAPI app.

Called right after the app is created and before upstream registers its routes, so a
route added here for an existing path takes precedence; each is added only when its knob
is on, so with every knob unset the app is upstream's.
"""

from fastapi import Request
from fastapi.responses import JSONResponse

from . import fingerprint
from .. import knobs


def install(app, model_manager, chat_handler, completion_handler, response_handler=None,
            generation_state=None, transcription_handler=None) -> None:
    if knobs.get("PB_TENSOR_PARALLEL"):
        from ..runtime import tp

        tp.install(app)
    # Added before upstream's own middleware, so it sits innermost (see HeadersMiddleware).
    app.add_middleware(fingerprint.HeadersMiddleware)

    @app.exception_handler(knobs.PBRequestError)
    async def _pb_request_error(_request: Request, exc: knobs.PBRequestError):
        return JSONResponse(exc.body(), status_code=exc.status)

    if knobs.get("PB_API_ERRORS"):
        from . import errors, requests

        errors.install(app)
        requests.install(app, {"chat": chat_handler, "completion": completion_handler,
                               "response": response_handler, "transcription": transcription_handler})
    if knobs.get("PB_FAULT_ISOLATION") and generation_state is not None:
        from ..runtime import faults

        faults.watch(generation_state)
    _outermost(app)
    if knobs.get("PB_SERVED_NAMES"):
        from . import served

        try:
            served.check_at_start(model_manager.force_model)
        except knobs.KnobError as e:
            import sys

            sys.stderr.write(f"patchbay: refusing to start: PB_SERVED_NAMES=1: {e}\n")
            raise SystemExit(2) from None
    if knobs.get("PB_MODELS_INFO") or knobs.get("PB_SERVED_NAMES"):
        from . import models

        models.install(app, model_manager)
    if knobs.get("PB_FORCED_DECODING"):
        from . import forced

        forced.install(app)
    if knobs.get("PB_TOKENIZE"):
        from . import tokenize

        tokenize.install(app, chat_handler)
    if knobs.get("PB_COMPLETIONS"):
        from . import completions

        completions.install(app, chat_handler)
    if knobs.get("PB_METRICS"):
        from . import metrics

        metrics.install(app, generation_state or chat_handler.generation_state)


def _outermost(app) -> None:
    """Wrap the whole middleware stack (upstream's included, which registers after this) in
    the connection-level guards whose knobs are on: from the outside in, the key, the body
    limit, disconnects."""
    from . import auth, disconnect, limits

    guards = []
    if knobs.get("PB_DISCONNECT"):
        guards.append(disconnect.Middleware)
    if knobs.get("PB_MAX_BODY_MB"):
        limit = limits.limit_bytes()
        guards.append(lambda inner: limits.BodyLimit(inner, limit))
    if knobs.get("PB_AUTH"):
        guards.append(auth.guard())  # outermost: nothing is read before the key is checked
    if not guards:
        return
    build = app.build_middleware_stack

    def build_guarded():
        stack = build()
        for guard in guards:
            stack = guard(stack)
        return stack

    app.build_middleware_stack = build_guarded
