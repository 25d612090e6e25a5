"""PB_SERVED_NAMES: the model is known to clients by short served names, never by its path.

Upstream pins the server to the checkpoint path it was started with: clients must send that
absolute path as `model`, replies echo `<path>@main`, and a wrong name is a 400 whose detail
quotes the path. With the knob on, the names come from `SERVED_MODEL_NAME` (comma-separated,
the first is the one replies echo, the rest are aliases; set by patchbay's launcher from the
config) or, when it is unset, the checkpoint folder's own name. A request naming one of them,
or the path itself, or no model at all, is served; any other name is a 404 `model_not_found`
listing the served names. `/v1/models` (0040) lists the names, with the context length.
"""

import functools
import os
import re

from .. import knobs

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


def on() -> bool:
    return bool(knobs.get("PB_SERVED_NAMES"))


def default_name(model: str) -> str:
    """The checkpoint folder's name: `/srv/models/GLM-4.5-Air/` and `zai-org/GLM-4.5-Air@main`
    are both `GLM-4.5-Air`."""
    return model.split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1]


@functools.cache
def names(force_model: str) -> tuple[str, ...]:
    """The served names of the pinned model, first the one replies echo."""
    raw = os.environ.get("SERVED_MODEL_NAME", "").strip()
    found = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip())) or (default_name(force_model),)
    for name in found:
        if not NAME_RE.fullmatch(name):
            raise knobs.KnobError(f"SERVED_MODEL_NAME: {name!r} is not a model name (allowed: letters, digits and "
                                  "._:/@+-, at most 128 characters, starting with a letter or digit)")
    return found


def check_at_start(force_model: str | None) -> None:
    """A bad SERVED_MODEL_NAME stops the server at start, named (not at its first request)."""
    if on() and force_model:
        names(force_model)


def resolve(model_manager, body: dict) -> None:
    """Before upstream resolves the model: a served name (or none) becomes the pinned path; an
    unknown one is a 404 that names what is served and not the path."""
    pinned = model_manager.force_model
    if not on() or pinned is None:
        return
    requested = body.get("model")
    served = names(pinned)
    if requested is None or requested in served or requested == pinned:
        body["model"] = pinned
        return
    raise knobs.PBRequestError(404, f"The model '{requested}' does not exist (served: {', '.join(served)})",
                               code="model_not_found", param="model")


def echo(model_manager, model_id: str) -> str:
    """The model name a reply carries: the first served name (upstream: `<path>@main`)."""
    pinned = model_manager.force_model
    if not on() or pinned is None:
        return model_id
    return names(pinned)[0]
