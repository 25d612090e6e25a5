"""Installs patchbay's routes and error handling on the upstream FastAPI app.

Called right after the app is created and before upstream registers its routes, so a
route added here for an existing path takes precedence; each is added only when its knob
is on, so with every knob unset the app is upstream's.
"""

from fastapi import Request
from fastapi.responses import JSONResponse

from . import fingerprint
from .. import knobs


def install(app, model_manager, chat_handler, completion_handler) -> None:
    if knobs.get("PB_TENSOR_PARALLEL"):
        from ..runtime import tp

        tp.install(app)
    # Added before upstream's own middleware, so it sits innermost (see HeadersMiddleware).
    app.add_middleware(fingerprint.HeadersMiddleware)

    @app.exception_handler(knobs.PBRequestError)
    async def _pb_request_error(_request: Request, exc: knobs.PBRequestError):
        return JSONResponse(exc.body(), status_code=exc.status)

    if knobs.get("PB_MODELS_INFO"):
        from . import models

        models.install(app, model_manager)
    if knobs.get("PB_FORCED_DECODING"):
        from . import forced

        forced.install(app)
    if knobs.get("PB_TOKENIZE"):
        from . import tokenize

        tokenize.install(app, chat_handler)
    if knobs.get("PB_METRICS"):
        from . import metrics

        metrics.install(app, chat_handler.generation_state)
