"""PB_SSE_DONE: end every server-sent-event stream with `data: [DONE]`, as OpenAI does.

Clients such as the openai package stop reading at that line; without it they wait for
the connection to close."""

import json

from .. import knobs


def error_event(message) -> str:
    """The event that ends a stream whose generation or rendering failed."""
    return f"data: {json.dumps({'error': message})}\n\n"


def finish(events):
    """Wrap an SSE async generator; the knob is read now, in the request's context."""
    if not knobs.get("PB_SSE_DONE"):
        return events

    async def with_done():
        try:
            async for part in events:
                yield part
            yield "data: [DONE]\n\n"
        finally:
            # Closing the inner generator is what cancels generation on a client disconnect.
            await events.aclose()

    return with_done()
