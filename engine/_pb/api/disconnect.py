"""PB_DISCONNECT: a client that goes away frees its slot, streaming or not.

Upstream cancels a streamed request when its client disconnects, but a non-streamed one runs to
its last token for nobody. `Middleware` watches the connection once a request's body has been
read: when the client disconnects before the response has started, the handler's task is
cancelled. Both reply paths then cancel the request in the batching loop: patchbay's chat path
does on any exit (chat.respond's `done`), upstream's non-streamed path through `result`, its
hook in `CBGenerateManager.generate_non_streaming`. A request still queued, prefilling or
decoding is dropped at the loop's next pass and its KV blocks freed. Streamed responses keep
upstream's own handling: the disconnect message is handed on to them unchanged.
"""

import asyncio

from .. import knobs
from ..runtime.let_go import let_go


def on() -> bool:
    return bool(knobs.get("PB_DISCONNECT"))


class Middleware:
    """Pure ASGI: cancels the app's task when the client disconnects before the response starts."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        body_done = asyncio.Event()
        gone: asyncio.Future = asyncio.get_running_loop().create_future()
        started = False

        async def wrapped_receive():
            if body_done.is_set():
                return await asyncio.shield(gone)
            message = await receive()
            if message["type"] == "http.disconnect":
                if not gone.done():
                    gone.set_result(message)
                return message
            if not message.get("more_body", False):
                body_done.set()
            return message

        async def wrapped_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, wrapped_receive, wrapped_send))

        async def watch():
            await body_done.wait()
            message = await receive()
            if not gone.done():
                gone.set_result(message)
            if message["type"] == "http.disconnect" and not started:
                task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await task
        except asyncio.CancelledError:
            if task.cancelled() and not started:
                return  # the client left: nobody to answer
            raise
        finally:
            watcher.cancel()


async def result(cb, request_id: str, future):
    """Upstream's `await future` in the non-streamed path, cancelling the request when the
    handler is cancelled (its client went away)."""
    if not on():
        return await future
    try:
        return await future
    except asyncio.CancelledError:
        let_go(cb, request_id)
        raise
