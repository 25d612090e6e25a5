"""Per-request token choice inside continuous batching.

Upstream's batch freezes its sampling settings from the first request it sees. A request
that registers a `Spec` here gets its own: temperature, top_p, top_k, min_p, presence and
frequency penalties, logit_bias, vLLM's repetition_penalty and min_tokens, a seed, log-probabilities of the chosen and top tokens,
forced tokens (teacher forcing) and a token mask (grammar). The hook runs after upstream
has sampled the whole batch and overwrites only the rows of requests that have a Spec, so
every other row keeps upstream's token bit for bit, and with no Spec registered it does
nothing at all.

A Spec keeps its own list of the tokens it chose: with async batching the request state
lags a step behind, the Spec never does.
"""

import threading
from dataclasses import dataclass, field

import torch

from .. import knobs
from . import batched_sampler, drafts, grammar_overlap, graphs, sampler_graph, sort_free, tp


_specs: dict = {}
_lock = threading.Lock()


@dataclass
class Spec:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict = field(default_factory=dict)  # token id -> bias
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    forced: list | None = None  # token ids to emit, in order
    forced_end: int | None = None  # emitted once `forced` is used up (an end-of-turn token)
    mask: object = None  # callable(spec, scores) -> scores, e.g. a grammar's bitmask
    repetition_penalty: float = 1.0  # on the prompt's and the reply's tokens (1: none)
    prompt_ids: list = field(default_factory=list)  # what repetition_penalty also counts
    min_tokens: int = 0  # no token of `suppress` before this many tokens
    suppress: tuple = ()
    # Filled while the request runs:
    tokens: list = field(default_factory=list)
    chosen_logprobs: list = field(default_factory=list)  # per token: float
    top: list = field(default_factory=list)  # per token: [(id, logprob), ...]
    generator: object = None
    position: int = 0  # tokens chosen so far (PB_BATCHED_SAMPLER's counter-based draws)
    batched: bool = False  # PB_BATCHED_SAMPLER, as the request had it
    overlap: bool = False  # PB_GRAMMAR_OVERLAP (with PB_BATCHED_SAMPLER), as the request had it
    graphed: bool = False  # PB_SAMPLER_GRAPH (with PB_BATCHED_SAMPLER), as the request had it
    sort_free: bool = False  # PB_SORT_FREE (with PB_BATCHED_SAMPLER), as the request had it

    @property
    def plain_greedy(self) -> bool:
        return (not self.do_sample and not self.logprobs and self.forced is None and self.mask is None
                and not self.logit_bias and not self.presence_penalty and not self.frequency_penalty
                and self.repetition_penalty == 1.0 and not self.min_tokens)


def batched() -> bool:
    return bool(knobs.get("PB_BATCHED_SAMPLER"))


def register(request_id: str, spec: Spec) -> None:
    spec.batched = batched()
    spec.overlap = spec.batched and grammar_overlap.on()
    spec.graphed = spec.batched and sampler_graph.on()
    spec.sort_free = spec.batched and sort_free.on()
    if spec.batched:
        if spec.seed is None:
            spec.seed = batched_sampler.draw_seed()
    elif spec.do_sample:
        spec.generator = torch.Generator(device="cpu")  # its own: the global generator is left alone
        if spec.seed is not None:
            spec.generator.manual_seed(spec.seed)
        else:
            spec.generator.seed()
    with _lock:
        _specs[request_id] = spec


def release(request_id: str) -> None:
    with _lock:
        _specs.pop(request_id, None)


def _rows(runner) -> list:
    """(request state, row of its step) behind each logits row of the batch being computed: a
    drafting request (0800) has a row per verified token."""
    io = runner.inputs_and_outputs
    if hasattr(io, "io_pairs"):
        io = io.io_pairs[io.current_pair].host_io
    return drafts.logit_rows(io.requests_in_batch)


def _batch_is_greedy(runner) -> bool:
    """Whether the batch's own choice is the argmax of the raw logits: no sampling, no logits
    processors, no logprobs (their softmax could tie two rows' close logits)."""
    return not runner.do_sample and not runner.return_logprobs and not runner.logit_processor.do_processing


def override(runner, logits: torch.Tensor, output_ids: torch.Tensor) -> None:
    """The hook: rechoose the next token of every row whose request has a Spec."""
    graphs.note_capture(logits)
    _override(runner, logits, output_ids)
    tp.sync_tokens(output_ids)


def _override(runner, logits: torch.Tensor, output_ids: torch.Tensor) -> None:
    # Never inside a CUDA-graph capture: a replay would not run this code (the reply path
    # refuses such requests up front; this keeps a capture from failing if one slips through).
    if not _specs or (logits.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    rows = [(i, drafts.row_spec(state, j, _specs.get(state.request_id))) for i, (state, j) in enumerate(_rows(runner))]
    # A plain greedy request in a batch that is itself plain greedy already has its token (the
    # batch's argmax of the same float32 logits): such rows are left alone, so an all-greedy
    # batch costs no extra kernels and no wait for the step's logits.
    skip_greedy = _batch_is_greedy(runner)
    rows = [(i, spec) for i, spec in rows if spec is not None and not (skip_greedy and spec.plain_greedy)]
    if not rows:
        return
    raw = logits[0]  # [num_logits, vocab], float32, before any processor
    together = [(i, spec) for i, spec in rows if spec.batched]  # each row as its own request chose
    if together:
        index = [i for i, _ in together]
        picks = batched_sampler.choose_rows([spec for _, spec in together], raw, index)
        output_ids[0, torch.tensor(index, dtype=torch.long).to(raw.device, non_blocking=True)] = \
            picks.to(output_ids.dtype)
        rows = [(i, spec) for i, spec in rows if not spec.batched]
        if not rows:
            return
    greedy = [i for i, spec in rows if spec.plain_greedy]
    if greedy:
        index = torch.tensor(greedy, device=raw.device)
        picks = raw.index_select(0, index).argmax(dim=-1)
        output_ids[0, index] = picks.to(output_ids.dtype)
        for (i, spec), token in zip([r for r in rows if r[1].plain_greedy], picks.tolist()):
            spec.tokens.append(int(token))
    for i, spec in rows:
        if spec.plain_greedy:
            continue
        token = choose(spec, raw[i])
        output_ids[0, i] = token


def choose(spec: Spec, raw: torch.Tensor) -> int:
    """One row: the token this request's settings pick from its raw logits."""
    logprobs = torch.log_softmax(raw.float(), dim=-1)
    if spec.forced is not None:
        k = len(spec.tokens)
        token = spec.forced[k] if k < len(spec.forced) else spec.forced_end
    else:
        scores = raw.float().clone()
        if spec.logit_bias:
            ids = torch.tensor(list(spec.logit_bias), device=scores.device)
            scores[ids] += torch.tensor(list(spec.logit_bias.values()), device=scores.device, dtype=scores.dtype)
        if spec.tokens and (spec.presence_penalty or spec.frequency_penalty):
            ids, counts = torch.unique(torch.tensor(spec.tokens, device=scores.device), return_counts=True)
            scores[ids] -= spec.frequency_penalty * counts.to(scores.dtype) + spec.presence_penalty
        if spec.repetition_penalty != 1.0:
            seen = torch.unique(torch.tensor(spec.prompt_ids + spec.tokens, dtype=torch.long, device=scores.device))
            values = scores[seen]
            scores[seen] = torch.where(values > 0, values / spec.repetition_penalty, values * spec.repetition_penalty)
        if len(spec.tokens) < spec.min_tokens and spec.suppress:
            scores[list(spec.suppress)] = float("-inf")
        if spec.mask is not None:
            scores = spec.mask(spec, scores)
        token = _pick(spec, scores)
    spec.tokens.append(int(token))
    if spec.logprobs:
        spec.chosen_logprobs.append(float(logprobs[token]))
        if spec.top_logprobs:
            values, ids = logprobs.topk(spec.top_logprobs)
            spec.top.append(list(zip(ids.tolist(), values.tolist())))
    return int(token)


def _pick(spec: Spec, scores: torch.Tensor) -> int:
    if not spec.do_sample or spec.temperature == 0:
        return int(scores.argmax())
    scores = scores / spec.temperature
    if spec.top_k and spec.top_k < scores.numel():
        kth = scores.topk(spec.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if spec.min_p:
        probs = probs.masked_fill(probs < spec.min_p * probs.max(), 0.0)
    if spec.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < spec.top_p  # always keeps the first
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=spec.generator))
