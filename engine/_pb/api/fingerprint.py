"""PB_FINGERPRINT: say which build and which knob values produced each reply, and which tokens.

Every response carries `x-pb-build` (the build id: a hash of the pin and the series) and
`x-pb-knobs` (a hash of the knob values in effect for that request, overrides included).
Every finished completion carries `pb_fingerprint` — a hash of its generated token ids — in
the JSON body, or in the final chunk of a stream, and logs it with the request id. Two
replies with the same fingerprint are the same tokens; the A/B and exactness tools compare
these instead of decoded text.
"""

import hashlib
import json

from ...utils import logging
from .. import knobs


logger = logging.get_logger(__name__)


def of(token_ids) -> str:
    ids = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
    return hashlib.sha256(",".join(str(int(t)) for t in ids).encode()).hexdigest()[:16]


def knob_values() -> str:
    """A short hash of every knob's value for the current request."""
    values = {name: knobs.get(name) for name in sorted(knobs.registry())}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=list).encode()).hexdigest()[:12]


def record(streamer, token_ids) -> None:
    """Keep a streamer's generated ids (called from its put); cheap, and changes no output."""
    if not hasattr(streamer, "_pb_ids"):
        streamer._pb_ids = []
    streamer._pb_ids.extend(int(t) for t in token_ids)


def stamp(result: dict, token_ids, request_id: str) -> dict:
    """Add the fingerprint to a finished, non-streamed response body."""
    if knobs.get("PB_FINGERPRINT"):
        result["pb_fingerprint"] = of(token_ids)
        logger.info(f"patchbay fingerprint request={request_id} tokens={len(token_ids)} fp={result['pb_fingerprint']}")
    return result


def stamp_sse(event: str, streamer, request_id: str) -> str:
    """Add the fingerprint to the final `data: {...}` event of a stream."""
    if not knobs.get("PB_FINGERPRINT") or not event.startswith("data: {"):
        return event
    chunk = json.loads(event[len("data: "):])
    stamp(chunk, getattr(streamer, "_pb_ids", []), request_id)
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


class HeadersMiddleware:
    """Adds the build and knob headers when the request's PB_FINGERPRINT is on. Installed
    innermost, so it runs in the request's own context and sees its knob overrides."""

    def __init__(self, app):
        self.app = app
        self.build_id = knobs.build_id()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start" and knobs.get("PB_FINGERPRINT"):
                headers = list(message.get("headers", []))
                headers += [(b"x-pb-build", self.build_id.encode()), (b"x-pb-knobs", knob_values().encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
