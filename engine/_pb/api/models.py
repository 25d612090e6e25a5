"""PB_MODELS_INFO: `/v1/models` lists the served model first, with `max_model_len` and
`context_length`, and never answers 500 when there is no Hugging Face cache to scan
(upstream scans the cache only and fails when it is missing). With PB_SERVED_NAMES it lists
the served names alone (no path, no cache scan: nothing else would be served)."""

import logging
import time

from fastapi.responses import JSONResponse

from . import served
from .context import max_model_len


logger = logging.getLogger(__name__)


def served_entries(model_manager, created: int) -> list[dict]:
    entries = []
    for model_id, timed in list(model_manager.loaded_models.items()):
        model = getattr(timed, "model", None)
        limit = max_model_len(model.config) if model is not None else None
        name = model_id[: -len("@main")] if model_id.endswith("@main") else model_id
        pinned = model_manager.force_model
        for shown in served.names(pinned) if served.on() and pinned else (name,):
            entry = {"id": shown, "object": "model", "created": created, "owned_by": "patchbay"}
            if limit is not None:
                entry["max_model_len"] = entry["context_length"] = limit
            entries.append(entry)
    return entries


def install(app, model_manager) -> None:
    started = int(time.time())

    @app.get("/v1/models")
    @app.options("/v1/models")
    def list_models():
        listed = served_entries(model_manager, started)
        if served.on():
            return JSONResponse({"object": "list", "data": listed})
        try:
            cached = model_manager.get_gen_models()
        except Exception as e:  # no cache folder, unreadable cache: the served model still lists
            logger.warning("patchbay: skipped the model cache scan: %s", e)
            cached = []
        ids = {e["id"] for e in listed}
        return JSONResponse({"object": "list", "data": listed + [e for e in cached if e["id"] not in ids]})
