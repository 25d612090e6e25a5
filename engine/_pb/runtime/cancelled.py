"""PB_CANCELLED_OUTPUTS (0920): in a server, an output no handler takes is dropped, not kept for
ever, and a disconnected stream's handler goes with its request.

A served request gets its outputs through a handler registered with the engine's output router;
an output with no handler goes on the router's shared queue, which only in-process callers
(`generate_batch`, `get_result`) read. When a client goes away the server cancels its request,
but the batching loop still finishes the step in flight and delivers that step's output:
- patchbay's reply paths (the chat path's choices, 0600; 0540's non-streamed one; 0620's
  completions) take the handler away, so that output lands on the shared queue, where nobody
  takes it;
- upstream's streamed paths (its chat, completions and responses streams) cancel and leave the
  handler registered, and a cancelled request never sends the finished output that removes it:
  the handler and the stream state it holds stay.
Either way each disconnect left its last output or its handler behind. In a 6-minute soak with
tracemalloc (W71) 193 disconnecting requests left 173 `GenerationOutput`s on the queue.

With the knob on, a router that has had a handler registered (a server's: every served request
registers one before its first output) drops an output no handler takes, and upstream's streamed
paths take the handler away when they cancel. Replies are untouched: only outputs nobody reads
are dropped. A follower rank of tensor parallelism registers no handler and drains the queue
itself (0200). `/metrics` shows both sides with the knob on or off: `pb_outputs_unclaimed`
(outputs on the shared queue) and `pb_output_handlers` (handlers registered).
"""

from .. import knobs
from .let_go import let_go


def on() -> bool:
    return bool(knobs.get("PB_CANCELLED_OUTPUTS"))


def serving(router) -> None:
    """A handler was registered with `router`: from now on it serves (hook in
    register_result_handler)."""
    router.pb_serving = True


def dropped(router, output) -> bool:
    """True where `router` should drop `output`, which no handler takes: with the knob on, in a
    router that serves."""
    return getattr(router, "pb_serving", False) and on()


def cancel(cb, request_id: str) -> None:
    """Upstream's streamed paths on a disconnect: cancel the request, as upstream; with the knob
    on, take its handler away too (0540's let_go, as patchbay's reply paths do)."""
    if on():
        let_go(cb, request_id)
    else:
        cb.cancel_request(request_id)
