"""PB_MAX_BODY_MB and PB_PREP_THREAD: one request's size or CPU work never holds up the others.

`BodyLimit` refuses a body over PB_MAX_BODY_MB MiB with a 413 in the OpenAI shape: at once when
Content-Length says so, otherwise as soon as the bytes read pass the limit, before anything
parses them (a 20 MB chat body used to freeze every client for the seconds its template and
tokenizer took, before its 400).

`prepare` runs a request's CPU work (the chat template, tokenizing) on one worker thread
instead of the event loop, so /health and the other streams keep being served meanwhile. One
thread: the tokenizer is used by one preparation at a time, as before. The request's context
(its per-request knobs) goes with the call.
"""

import asyncio
import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor

from .. import knobs

_executor: ThreadPoolExecutor | None = None


def limit_bytes() -> int:
    return int(knobs.get("PB_MAX_BODY_MB")) * 1024 * 1024


class BodyLimit:
    """Pure ASGI middleware: a 413 for a body over the limit."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(send, int(length))
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge(seen)
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except _TooLarge as e:
            if not started:
                await self._refuse(send, e.seen, at_least=True)

    async def _refuse(self, send, size: int, at_least: bool = False):
        from . import errors

        mib = self.limit // (1024 * 1024)
        what = f"more than {size} bytes" if at_least else f"{size} bytes"
        await errors.send(send, 413, f"the request body is {what}; this server accepts at most {mib} MiB "
                          "(PB_MAX_BODY_MB)", "request_too_large", [(b"connection", b"close")])


class _TooLarge(Exception):
    def __init__(self, seen: int):
        self.seen = seen


async def prepare(fn, *args, heavy: bool = True, **kwargs):
    """fn(*args, **kwargs) off the event loop when PB_PREP_THREAD is on and the call is `heavy` (it
    may compile a grammar), inline otherwise: a round trip to the thread costs more than a call that
    only finds nothing to do (a request without response_format or strict tools, most of them)."""
    if not heavy or not knobs.get("PB_PREP_THREAD"):
        return fn(*args, **kwargs)
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pb-prep")
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_executor, call)
