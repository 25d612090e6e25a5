"""PB_PREFILL_TURNS (0880): a long prompt's prefill takes turns with the short prompts behind it.

Upstream's FIFO scheduler puts the requests that decode first, then the one already prefilling,
then the waiting ones. A prompt longer than a step's token budget is prefilled a chunk a step,
and each chunk takes what is left of the budget: every request that arrives meanwhile waits
for the whole prompt before its own first step. With a 120K-token prompt beside 32 streams on one
H100, every stream's next request waited about 10 s for its first token (W64-kv-sizing-load).

With the knob on, every other step orders the requests that prefill (waiting or begun) by the
prompt tokens they have left, shortest first: a short prompt behind a long one starts within
two steps, and the long one still leads every other step, so it never waits for more than one
step at a time however many short prompts come. The steps between keep upstream's order.
Decoding requests go first as before. Which requests share a step changes; what a row computes
does not (batched == alone), so replies are the same."""

from .. import knobs


def on() -> bool:
    return bool(knobs.get("PB_PREFILL_TURNS"))


def order(scheduler, prefilling: list) -> list:
    """The prefilling candidates of this step (begun first, then waiting, in arrival order), in the
    order they take the step's budget."""
    if not on() or len(prefilling) < 2:
        return prefilling
    turn = scheduler.__dict__.get("_pb_prefill_turn", False)
    scheduler._pb_prefill_turn = not turn
    if turn:
        return prefilling
    return sorted(prefilling, key=lambda state: len(state.remaining_prefill_tokens))  # stable: ties by arrival
