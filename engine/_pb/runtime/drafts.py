"""PB_DRAFT_TOKENS: prompt-lookup drafts verified inside continuous batching, the reply unchanged.

A decoding request whose last 4, 3 or 2 tokens occurred earlier in its prompt or reply gets the
tokens that followed that occurrence as drafts (draft_lookup.Lookup). Its step computes its last
token and every draft, each as a decode row of its own: one query token over its own prefix of
the request's cache, the read index repeating the prefix for each row. With the batch-invariant
kernels a row's bits do not depend on the rows beside it, so each row's logits are those of the
serial decode step at its position; each row is then chosen at its own reply position (0630's
draws are keyed by seed and position). The update keeps the drafts that agree with the token
chosen before them, then the model's own token where they first disagree: the serial reply,
several tokens for one step. KV written for rejected drafts lies past the request's length and
its next step overwrites it; prefix blocks are hashed from kept tokens only.

How many tokens a step drafts adapts: one more than the last drafting step kept, at most the
knob's value (W48 measured this rule). A request with a grammar or a thinking budget (0130-0150)
drafts too: row j's mask is the one its grammar gives after the drafts before it
(grammar.Constraint.draft_masks; the grammar is rolled back after), and the budget's forced
`</think>` falls on the row where the serial reply's would. Requests whose choice reads more than
logits, seed, position and such a mask do not draft: forced tokens, penalties, min_tokens,
log-probabilities, tool_choice required's end-of-turn rule, and sampling without 0630 (a
generator's draws depend on how many came before). What a request may draft is decided when it
is added, from its own knobs (pb_knobs), and travels with its state, so every tensor-parallel
rank drafts alike (a row's mask only changes which of its tokens rank 0 chooses). A drafting step
needs the last step's tokens before it is prepared: with the knob set at start, asynchronous
batching (0240) is not chosen, and under asynchronous batching nothing drafts, unless 0860
(PB_DRAFT_ASYNC) keeps it: the loop then waits for a step's tokens only while requests draft
(`after_step`). With 0870 (PB_DRAFT_BACKOFF) a request whose tries keep nothing passes a growing
number of its steps without trying (`_Walk.tried`), so text that does not repeat stops paying for
rejected rows and for the loop's waits.

A drafting row's mask reaches xgrammar as a [1, words] bitmask: its GPU kernel reads a 1-D mask's
stride as the row width and would keep only the first 32 token ids (W54's mismatch on an H100: the
rows of requests under 0150's thinking budget, W55 found and fixed it).
"""

from __future__ import annotations

import dataclasses

from .. import knobs
from .draft_lookup import Lookup

LONGEST, SHORTEST = 4, 2  # the n-gram sizes looked up (W48: 4..2 beat 3..1 on sampled prose)
PROMPT_SLICE = 4096  # prompt tokens a step files in a request's lookup (a 32K prompt: 35 ms at once)


def requested() -> int:
    """The knob's value for the current request (its pb_knobs, else the server's)."""
    return int(knobs.get("PB_DRAFT_TOKENS") or 0)


def backoff() -> int:
    """0870: the most steps a request passes without drafting after tries that kept nothing (0: it
    tries every step)."""
    return int(knobs.get("PB_DRAFT_BACKOFF") or 0)


def pays() -> int:
    """0900: the fewest drafts a try must keep to end 0870's backoff (at least one)."""
    return max(1, int(knobs.get("PB_DRAFT_PAYS") or 0))


def in_async() -> bool:
    """0860: drafting inside asynchronous batching (the knob as the server started)."""
    return bool(knobs.get("PB_DRAFT_ASYNC"))


def decide(cb_config) -> None:
    """Before upstream's (and 0240's) choice: synchronous batching when the server drafts, unless
    0860 drafts inside the asynchronous loop."""
    if requested() > 0 and cb_config.use_async_batching is None and not in_async():
        cb_config.use_async_batching = False


def rows_for(requests: int, most: int) -> int:
    """Logits rows a batch of `requests` needs when each may verify the knob's drafts (a workload
    hint's request count sizes the batch: generate_batch), at most `most`."""
    return min(requests * (1 + max(requested(), 0)), most)


class Drafting:
    """The batch processor's drafting: whether its batches choose plain argmax tokens, and counts.
    Under 0860 also the asynchronous loop's state: whether a launched step awaits its update (its
    tokens are unknown, so nothing may draft), and whether the step just prepared drafted."""

    def __init__(self, batch_greedy: bool, asynchronous: bool = False):
        self.batch_greedy = batch_greedy
        self.asynchronous = asynchronous
        # the loop's first step is launched without an update (upstream's bootstrap), so from the
        # start of an asynchronous loop a step is taken to be in flight until one is waited for
        self.in_flight = asynchronous
        self.step_drafted = False
        self.steps = 0  # request steps that verified drafts
        self.drafted = 0  # tokens drafted
        self.accepted = 0  # of them, kept
        self.waits = 0  # 0860: steps the asynchronous loop waited for
        self.passed = 0  # 0870: request steps that passed without trying, backing off


def attach(processor) -> None:
    """At the processor's start: drafting for synchronous batching, and with 0860 for
    asynchronous batching too."""
    asynchronous = bool(processor.use_async_batching)
    drafting = not asynchronous or in_async()
    processor.scheduler._pb_drafting = Drafting(
        not processor.do_sample and not processor.return_logprobs and not processor.logit_processor.do_processing,
        asynchronous,
    ) if drafting else None


def _loop(processor):
    """0860's state when the processor drafts inside asynchronous batching, else None."""
    drafting = getattr(getattr(processor, "scheduler", None), "_pb_drafting", None)
    return drafting if drafting is not None and drafting.asynchronous else None


def update_previous(processor) -> bool:
    """The loop, after launching a step: whether to update the step before it (upstream's
    asynchronous order). False when that step was already waited for and updated (0860)."""
    drafting = _loop(processor)
    if drafting is None:
        return True
    before, drafting.in_flight = drafting.in_flight, True
    return before


def in_flight(processor) -> bool:
    """At the loop's end: whether the last launched step still awaits its update."""
    drafting = _loop(processor)
    return drafting is None or drafting.in_flight


def _within_limit(scheduler) -> bool:
    """0820: whether the scheduler holds no more requests (decoding, prefilling or waiting) than
    PB_DRAFT_STREAMS (0: any number)."""
    streams = int(knobs.get("PB_DRAFT_STREAMS") or 0)
    return not streams or len(scheduler.active_requests) + len(scheduler.waiting_requests) <= streams


def _drafts_now(state, drafting) -> bool:
    """Whether a request may draft in its next step: allowed to (admit), decoding, and its choice
    the batch's argmax where it needs that."""
    from ...generation.continuous_batching.requests import RequestStatus

    limit, needs_greedy = state.__dict__.get("_pb_draft", (0, False))
    return limit > 0 and state.status == RequestStatus.DECODING and (drafting.batch_greedy or not needs_greedy)


def _may_draft(scheduler, drafting) -> bool:
    """Whether a step prepared now could draft for some request (extend's own rules)."""
    return _within_limit(scheduler) and any(_drafts_now(state, drafting) and not _backing_off(state)
                                            for state in scheduler.active_requests.values())


def _backing_off(state) -> bool:
    """0870: whether the request's next step passes without trying (its walk's count of steps to
    pass is not spent)."""
    walk = state.__dict__.get("_pb_walk")
    return walk is not None and walk.skip > 0


def after_step(processor) -> None:
    """0860, the loop after launching a step and updating the one before: wait for this step and
    update it now when it verified drafts (the next step's inputs are its kept tokens, which no
    carry-over can place) or when a step prepared next could draft. The IO pair it used then
    carries nothing over into the next step: the host writes the tokens itself."""
    drafting = _loop(processor)
    if drafting is None:
        return
    drafted, drafting.step_drafted = drafting.step_drafted, False
    if not drafted and not _may_draft(processor.scheduler, drafting):
        return
    ios = processor.inputs_and_outputs
    ios.swap_io_pairs()  # back to the pair of the step just launched (its launch swapped)
    try:
        processor.update_batch()  # waits for the step's outputs
    except Exception:
        # Left on this step's pair, so 0510 fails the requests of the step that faulted. Nothing is
        # in flight after it: the next step is prepared into this pair and carries nothing over
        # from the other one (updated already).
        drafting.in_flight = False
        ios.io_pairs[1 - ios.current_pair].host_io.req_id_to_new_token_position = {}
        raise
    ios.io_pairs[ios.current_pair].host_io.req_id_to_new_token_position = {}
    ios.swap_io_pairs()
    drafting.in_flight = False
    drafting.waits += 1


def admit(state) -> None:
    """When a request is added (on the thread that took it, where its pb_knobs apply): the most it
    may draft, and whether that needs the batch's own choice to be the argmax (no Spec)."""
    from . import batched_sampler, sampler

    limit = requested()
    if limit <= 0:
        return
    spec = sampler._specs.get(state.request_id)
    if spec is None:
        state._pb_draft = (limit, True)
        return
    chooses_alone = spec.batched or not spec.do_sample or spec.temperature == 0
    if not batched_sampler.reads_reply(spec) and chooses_alone and (spec.mask is None or _masks_drafts(spec.mask)):
        state._pb_draft = (limit, False)


def _budget_of(mask):
    """0150's thinking budget when `mask` is one (it wraps the request's constraint), else None."""
    return mask if hasattr(mask, "end_think") and hasattr(mask, "make_inner") else None


def _masks_drafts(mask) -> bool:
    """Whether rows after drafts can get this mask's later masks: a grammar constraint, alone or
    in a thinking budget without tool_choice required's end-of-turn rule."""
    budget = _budget_of(mask)
    if budget is not None:
        return budget.stops is None and hasattr(budget.inner, "draft_masks")
    return hasattr(mask, "draft_masks")


class _RowMask:
    """Row j's mask in a drafting step: the bitmask its grammar gives after the drafts before it,
    or the thinking budget's forced `</think>` (as 0150 writes it: that token's score 0, every
    other one -inf)."""

    def __init__(self, bits, force: int | None):
        self.bits, self.force = bits, force

    def __call__(self, spec, scores):
        if self.force is not None:
            scores.fill_(float("-inf"))
            scores[self.force] = 0.0
            return scores
        import xgrammar as xgr

        # as [1, words]: xgrammar's GPU kernel takes a 1-D mask's row stride (1) for its width and
        # reads only the first word, every later token -inf (W55: the cause of W54's mismatch)
        xgr.apply_token_bitmask_inplace(scores.view(1, -1), self.bits.view(1, -1).to(scores.device))
        return scores


def _row_masks(state, spec, drafts: tuple) -> list:
    """The masks of rows 1..len(drafts) of a drafting request with a mask; notes on the state the
    row where a budget's thinking began, for the update."""
    budget = _budget_of(spec.mask)
    constraint = budget.inner if budget is not None else spec.mask
    phases: list = []
    bits = constraint.draft_masks(spec, list(drafts), phases)
    began = budget.began if budget is not None else None
    base = len(spec.tokens)
    masks = []
    for i in range(len(drafts) + 1):
        # rows after a draft the grammar refuses are never kept: they reuse the last mask
        phase, row = phases[min(i, len(phases) - 1)], bits[min(i, len(bits) - 1)]
        force = None
        if budget is not None and phase == "think":
            if began is None:
                began = base + i
                state._pb_began_row = i
            if base + i - began >= budget.budget:
                force = budget.end_think
        masks.append(_RowMask(row, force))
    return masks[1:]


class _Walk:
    """A request's lookup over its prompt and reply, its next draft length, and 0870's backoff."""

    def __init__(self, limit: int):
        self.lookup = Lookup((), LONGEST, SHORTEST)
        self.length = limit
        self.misses = 0  # 0870: tries in a row that kept nothing (0900: too little)
        self.skip = 0  # 0870: steps to pass before the next try

    def tried(self, kept: int, drafted: int = 0) -> None:
        """0870: after a try that kept `kept` of `drafted` drafts (0: the lookup found none, or
        every draft was rejected): after the n-th such try in a row the request passes 2**n steps,
        at most the knob's count, before it tries again; a try that keeps one ends the backoff.
        0900: one that keeps PB_DRAFT_PAYS, or every draft it had (the draft length grows one a
        try, so a short try cannot keep more), ends it; fewer count as a miss."""
        most = backoff()
        if kept >= pays() or (kept and kept == drafted) or not most:
            self.misses = self.skip = 0
            return
        self.misses += 1
        self.skip = min(1 << min(self.misses, 30), most)


def extend(scheduler, state, request_tokens: list, token_budget: int, cache_budget: int,
           request_budget: int) -> list:
    """The scheduler's tokens for a decoding request: its last token and, where it drafts, the
    drafts; each becomes a row of the step, reading its own prefix of the cache."""
    state.__dict__.pop("_pb_drafts", None)  # the last step's, verified
    drafting = getattr(scheduler, "_pb_drafting", None)
    if drafting is None or not _drafts_now(state, drafting) or len(request_tokens) != 1:
        return request_tokens
    limit = state._pb_draft[0]
    walk = state.__dict__.get("_pb_walk")
    if walk is None:
        walk = state._pb_walk = _Walk(limit)
    if walk.skip:  # 0870: backing off, a step of its own passed (also one prepared while another is in flight)
        walk.skip -= 1
        drafting.passed += 1
        return request_tokens
    if (scheduler.cache.read_cache_limit is not None
            or drafting.in_flight  # 0860: the last step's token is not known yet
            or not _within_limit(scheduler)):  # 0820: no drafts past this many requests held
        return request_tokens
    known = len(walk.lookup.ids)
    if known < len(state.initial_tokens):
        # a long prompt is filed a slice a step (about 4 ms a slice here), not in one stall of
        # every stream; the request drafts once the lookup holds its prompt
        walk.lookup.extend(state.initial_tokens[known:known + PROMPT_SLICE])
        if len(walk.lookup.ids) < len(state.initial_tokens):
            return request_tokens
        known = len(walk.lookup.ids)
    walk.lookup.extend(state.generated_tokens[known - len(state.initial_tokens):])
    most = min(walk.length, limit, state._new_tokens_limit - state.generated_len() - 1, token_budget - 1,
               request_budget - 1)
    guess = walk.lookup.propose(most) if most > 0 else []
    if most > 0 and not guess:
        walk.tried(0)  # 0870: a try that found nothing (under 0860 the loop waited for it)
    past = state.position_offset
    while guess and read_needed(past, len(guess)) > cache_budget:
        guess = guess[:-1]
    if guess and not scheduler.cache.can_store_request_tokens(state, len(guess) + 1, dry_run=True):
        guess = []
    if not guess:
        return request_tokens
    state._pb_drafts = tuple(guess)
    drafting.step_drafted = True  # 0860: the loop waits for this step
    state.tokens_to_process = list(request_tokens) + guess
    return state.tokens_to_process


def read_needed(past: int, drafts: int) -> int:
    """Cache entries a step's rows read before their own: past, past + 1, ..., past + drafts."""
    return (drafts + 1) * past + drafts * (drafts + 1) // 2


def drafts_of(state) -> tuple:
    return state.__dict__.get("_pb_drafts", ())


def cache_read(state, past: int) -> int:
    """The scheduler's cache budget for the request's step."""
    drafts = drafts_of(state)
    return read_needed(past, len(drafts)) if drafts else past


def rows(state) -> int:
    """Sequences the request's step adds to the batch (each a logits row)."""
    return 1 + len(drafts_of(state))


def complete_blocks(state, counted: dict) -> dict:
    """The blocks a step completes, as the scheduler counts them: a drafting step's are counted at
    its update, from the tokens it kept."""
    return {} if drafts_of(state) else counted


def add_rows(io, future_state, input_ids, position_ids, cu_q, cu_k, logits_indices, read_index, write_index) -> bool:
    """A drafting request's rows in the step being prepared (False: not drafting, upstream's way).
    Row j is token j at position past + j, one query token over the cache up to its own entry."""
    from ...generation.continuous_batching.requests import TMP_TOKEN_ID

    state = future_state.state
    drafts = drafts_of(state)
    if not drafts:
        return False
    if io.use_block_table:
        raise RuntimeError("a drafting request in a decode fast-path step")  # the scheduler turns it off
    past = state.position_offset
    tokens = state.tokens_to_process
    for j, token in enumerate(tokens):
        input_ids.append(token)
        position_ids.append(past + j)
        cu_q.append(cu_q[-1] + 1)
        for layer_type, allocator in io.cache.cache_allocators.items():
            seqlen_k = allocator.get_seqlen_k(past + j, 1)
            cu_k[layer_type].append(cu_k[layer_type][-1] + seqlen_k)
            io.max_length_k[layer_type] = max(io.max_length_k[layer_type], seqlen_k)
        io.cache.extend_read_and_write_indices(state.request_id, past + j, 1, read_index, write_index)
        logits_indices.append(cu_q[-1] - 1)
    io.max_length_q = max(io.max_length_q, 1)
    io.req_id_to_new_token_position[state.request_id] = logits_indices[-len(tokens)]
    state.position_offset = past + len(tokens)
    state.tokens_to_process = [TMP_TOKEN_ID]
    return True


def logit_rows(requests_in_batch) -> list:
    """(request state, row of its step) for each logits row, in order."""
    return [(fs.state, j) for fs in requests_in_batch if fs.has_new_token for j in range(rows(fs.state))]


def processor_rows(requests_in_batch) -> list:
    """The batch's requests with new tokens, one entry per logits row (upstream's logits processors
    take their per-request settings row by row)."""
    return [fs for fs in requests_in_batch if fs.has_new_token for _ in range(rows(fs.state))]


def row_spec(state, j: int, spec):
    """The sampler's Spec for row j of the request's step: row 0 is the request's own; row j
    chooses at reply position + j, with the drafts before it as its reply so far."""
    drafts = drafts_of(state)
    if spec is None or not drafts:
        return spec
    if j == 0:
        from . import batched_sampler

        batched_sampler.catch_up()  # 0640: the Spec holds every token chosen before this step
        state._pb_spec_base = (len(spec.tokens), spec.position)
        state._pb_row_masks = _row_masks(state, spec, drafts) if spec.mask is not None else None
        return spec
    masks = state.__dict__.get("_pb_row_masks")
    return dataclasses.replace(spec, tokens=list(spec.tokens) + list(drafts[:j]), position=spec.position + j,
                               mask=masks[j - 1] if masks else spec.mask, overlap=False)


def update(processor, future_state, new_tokens: list, logprobs, index: int, pending_outputs: list) -> int | None:
    """A drafting request's update (None: not drafting, upstream's way): keep the drafts its rows
    agree with and the first row token after them; the index of the next request's first row."""
    from . import batched_sampler, sampler, tail_reuse

    state = future_state.state
    drafts = drafts_of(state)
    if not drafts:
        return None
    batched_sampler.catch_up()  # 0640: rows' tokens it copies a step late are in their Specs first
    chosen = new_tokens[index:index + len(drafts) + 1]
    kept = 0
    while kept < len(drafts) and chosen[kept] == drafts[kept]:
        kept += 1
    past = state.position_offset - len(drafts) - 1
    _mark_blocks(processor.cache, state, past, drafts[:kept])  # before a token may finish the request
    appended, finished = 0, False
    for j in range(kept + 1):
        appended += 1
        if state.update_and_check_completion(chosen[j], logprobs[index + j] if logprobs is not None else None):
            finished = True
            break
    state.position_offset = past + appended  # what serial steps leave: the last token's KV is not written
    state._pb_drafts = ()
    spec = sampler._specs.get(state.request_id)
    base = state.__dict__.pop("_pb_spec_base", None)
    began_row = state.__dict__.pop("_pb_began_row", None)
    state._pb_row_masks = None
    if spec is not None and base is not None:
        tokens_before, position_before = base
        if spec.position > position_before:
            spec.position = position_before + appended
        if len(spec.tokens) > tokens_before:
            spec.tokens[tokens_before:] = chosen[:appended]
        budget = _budget_of(spec.mask)
        if budget is not None and budget.began is None and began_row is not None and began_row < appended:
            budget.began = tokens_before + began_row  # the thinking began on a kept row
    walk = state._pb_walk
    walk.length = min(state._pb_draft[0], kept + 1)
    walk.tried(kept, len(drafts))  # 0870, 0900
    drafting = processor.scheduler._pb_drafting
    drafting.steps += 1
    drafting.drafted += len(drafts)
    drafting.accepted += kept
    if finished:
        tail_reuse.keep(processor.cache, state, processor.inputs_and_outputs.compute_stream)  # 0760
        processor.scheduler.finish_request(state.request_id)
        processor.scheduler.block_new_requests = False
    if state.streaming or finished:
        pending_outputs.append(state.to_generation_output())
    return index + len(drafts) + 1


def _mark_blocks(cache, state, past: int, kept: tuple) -> None:
    """Hash the prefix blocks this step completed with tokens it kept: positions past .. past + kept."""
    if not cache.allow_block_sharing:
        return
    tokens = state.initial_tokens + state.generated_tokens + list(kept)
    for allocator in cache.cache_allocators.values():
        page = allocator.tokens_per_page
        complete = (past % page + len(kept) + 1) // page
        if complete:
            allocator.mark_complete_blocks(state.request_id, tokens, complete)


def stats(processor) -> dict | None:
    """/metrics' counters (None when the processor does not draft)."""
    drafting = getattr(getattr(processor, "scheduler", None), "_pb_drafting", None)
    if drafting is None:
        return None
    return {"steps": drafting.steps, "drafted": drafting.drafted, "accepted": drafting.accepted,
            "waits": drafting.waits, "passed": drafting.passed}
