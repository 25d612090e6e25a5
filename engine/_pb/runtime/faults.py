"""PB_FAULT_ISOLATION: a fault inside the batching loop costs the requests of that step, not the
server; a worker that dies anyway takes the process down, so a supervisor restarts it.

Upstream's loop treats any exception as fatal: it fails every request, records the error and
stops, while the HTTP server lives on answering 503 to everyone until someone restarts it.
Here one pass of the loop (`loop_body`) that raises fails the requests it was serving (each gets
the error, its slot and KV blocks are freed; see `fail_step` for the decoding requests it keeps)
and the loop goes on with the rest; only
`MAX_CONSECUTIVE` faults in a row with no good pass between them (a broken device, say) end it
as upstream does. Under tensor parallelism every rank must take the same path, so a fault there
stays fatal (the ranks' heartbeat, 0200, already ends the group).

`watch` runs in the HTTP process: when the worker has died it logs why and exits with
EXIT_CODE, so `serve.sh watch` / the container's restart policy brings a fresh server up
instead of one that lingers half alive. Not under tensor parallelism: there a dead worker
follows a lost peer, which 0200 already answers (503 `tp_peer_lost` on rank 0, the follower
exits) and `status` / `watch` see as a dead rank.
"""

import logging
import os
import sys
import threading
import time

from .. import knobs
from . import drafts

logger = logging.getLogger("transformers._pb.runtime.faults")

MAX_CONSECUTIVE = 3
EXIT_CODE = 70  # EX_SOFTWARE
POLL_S = 0.5


class _State:
    consecutive = 0
    isolated = 0  # faults absorbed since start (the tests read it through the log)


state = _State()


def on() -> bool:
    return bool(knobs.get("PB_FAULT_ISOLATION"))


def loop_body(manager, batch_processor, bootstrapping: bool) -> bool:
    """One pass of upstream's generation loop, with a fault failing only the requests it served."""
    if not on() or _distributed(manager):
        return manager._generation_loop_body(batch_processor, bootstrapping)
    try:
        more = manager._generation_loop_body(batch_processor, bootstrapping)
    except Exception as error:
        state.consecutive += 1
        if state.consecutive > MAX_CONSECUTIVE:
            logger.error("batching loop: %d faults in a row; stopping the worker", state.consecutive)
            raise
        state.isolated += 1
        failed = fail_step(batch_processor, error)
        logger.error("batching loop: a step failed (%s: %s); failed its %d request(s) %s, the others carry on",
                     type(error).__name__, error, len(failed), ", ".join(failed), exc_info=error)
        return True
    state.consecutive = 0
    return more


def _distributed(manager) -> bool:
    helper = getattr(manager, "distributed_helper", None)
    return helper is not None and getattr(helper, "tp_size", 1) > 1


def _batch_states(batch_processor) -> list:
    io = batch_processor.inputs_and_outputs
    pairs = getattr(io, "io_pairs", None)
    if pairs is not None:  # async batching: the pair in flight
        io = pairs[io.current_pair].host_io
    return [future.state for future in getattr(io, "requests_in_batch", None) or []]


def fail_step(batch_processor, error: Exception) -> list[str]:
    """Fail the requests of the step that raised, and free their slots.

    A request that was only decoding (one token, a reply already begun) is kept for the next
    pass when others in the step were new: rerunning its token writes the same KV entry again.
    When the step held decoding requests alone, or the last pass faulted too, all of them fail;
    when the step is unknown, every active request does."""
    from ...generation.continuous_batching.requests import RequestStatus

    scheduler = batch_processor.scheduler
    try:
        states = [s for s in _batch_states(batch_processor) if s.request_id in scheduler.active_requests]
    except Exception:
        states = []
    if not states:
        states = list(scheduler.active_requests.values())
    # a drafting request (0800) moved its length past rows it never verified: it is not kept
    decoding = [s for s in states if s.generated_len() > 0 and len(s.tokens_to_process) == 1
                and not drafts.drafts_of(s)]
    doomed = [s for s in states if s not in decoding] if state.consecutive == 1 else states
    failed = []
    for request in doomed or states:
        try:
            batch_processor._handle_request_error(error, request)
        finally:
            scheduler.finish_request(request.request_id)
            # Its error is delivered. Under async batching the other step in flight may hold it too,
            # and upstream's update skips only FINISHED (or PENDING) requests there: a FAILED one
            # would be updated against the blocks just freed, and that fault would fail the others.
            request.status = RequestStatus.FINISHED
        failed.append(str(request.request_id))
    return failed


def watch(generation_state, exit=os._exit) -> threading.Thread | None:
    """Exit the process when the batching worker has died (started with the app)."""
    if not on() or knobs.get("PB_TENSOR_PARALLEL"):
        return None  # under TP, 0200 owns a lost peer: rank 0 answers 503 and the follower exits

    def run() -> None:
        while True:
            time.sleep(POLL_S)
            try:
                alive = generation_state.is_cb_alive()
            except Exception:
                alive = True
            if not alive:
                reason = _fatal_error(generation_state)
                sys.stderr.write(f"patchbay: the batching worker died ({reason}); exiting with code {EXIT_CODE} "
                                 "so the supervisor starts a fresh server\n")
                sys.stderr.flush()
                exit(EXIT_CODE)
                return

    thread = threading.Thread(target=run, name="pb-worker-watch", daemon=True)
    thread.start()
    return thread


def _fatal_error(generation_state) -> str:
    manager = getattr(generation_state, "_cb_manager", None)
    cb = getattr(manager, "_cb", None)
    error = cb.background_thread_status.fatal_error if cb is not None else None
    return f"{type(error).__name__}: {error}" if error is not None else "no error recorded"
