"""PB_PREFILL_CHUNK: while requests decode, a prompt is prefilled at most this many tokens a step.

A step's token budget (upstream's default 8,192) goes to the decoding rows first, and a prompt
takes what is left. A step that carries thousands of prompt tokens takes far longer than a
decode step, so every stream decoding beside a long prompt gets one token per such step: beside a
120K-token prompt on one H100, 32 streams decoded at the chunk steps' pace for about 10 s
(W64-kv-sizing-load). With the knob set, a prompt's share of a step that also carries decoding
rows is at most the knob's count; a prompt alone (or beside other prompts only) still takes the
whole budget. The long prompt then needs more, shorter steps, and the streams beside it get a
token from each.

Where a prompt is cut changes which chunk computes a position, not what it computes: chunked
prefill reads the same prefix for each position (0760's tail reuse relies on the same), so
replies are unchanged."""

from .. import knobs


def chunk() -> int:
    """The knob: the most prompt tokens a step beside decoding rows gives one request (0: no cap)."""
    return int(knobs.get("PB_PREFILL_CHUNK") or 0)


def budget(state, scheduled: list, token_budget: int) -> int:
    """The token budget `state` may take in this step, given the requests `scheduled` before it."""
    most = chunk()
    if not most or token_budget <= most:
        return token_budget
    from ...generation.continuous_batching.requests import RequestStatus

    if state.status == RequestStatus.DECODING:  # a decoding row (and 0800's drafts) is never cut
        return token_budget
    if any(future.state.status == RequestStatus.DECODING for future in scheduled):
        return most
    return token_budget
