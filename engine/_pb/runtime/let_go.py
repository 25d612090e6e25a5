"""Letting a request go (0540): the one way patchbay's reply paths give up a request.

A served request's outputs reach its reply through a handler registered with the engine's output
router. A reply path that stops waiting (its client left, or a stop string ended the reply before
the engine did) cancels the request in the batching loop and takes the handler away, under the
router's lock as the router delivers, so nothing of the request stays registered. 0540's
non-streamed result, the chat path's choices (0600), the completions path (0620) and, with 0920
on, upstream's streamed paths call `let_go`.
"""


def let_go(cb, request_id: str) -> None:
    """Cancel `request_id` in `cb` (the batching manager) and remove its output handler."""
    cb.cancel_request(request_id)
    with cb.output_router._lock:
        cb.output_router.result_handlers.pop(request_id, None)
