"""PB_BATCHED_SAMPLER: every row with its own settings chosen in one pass over the batch.

0100's hook chooses row by row (a softmax, a sort and a draw from a CPU generator for each
sampled row, each draw a wait for the GPU), so sampled decoding ran at a fraction of greedy's
speed. Here the rows of one step are processed together: their logits gathered into one
[rows, vocab] tensor, the biases, penalties and masks written in, then temperature, top-k,
top-p and min-p for all of them at once, and one draw.

The draw is an exponential race (argmax of p / E, E ~ Exp(1), which picks token t with
probability p_t), and E comes from a counter-based generator: a hash of the request's seed,
the reply position and the token id. So a row's token depends on its own logits, seed and
position only, never on which rows share the step or how many: a seeded reply is the same
alone or batched, and replayable. A request without a seed gets one from the server's
generator when it registers. Integer hashing is exact on every device; the float steps after
it are per-row operations.

The host waits for the step's tokens only when a row needs them (penalties, grammars, forced
replies, min_tokens, repetition_penalty, logprobs); rows that only sample keep a position
counter on the host and their tokens stay on the device.
"""

import random
import threading

import torch

from . import grammar_overlap, sampler_graph, sort_free

MASK32 = 0xFFFFFFFF
_server_rng = random.Random()  # seeded from the OS at import: unseeded requests' seeds


def draw_seed() -> int:
    return _server_rng.getrandbits(63)


def _fmix32(h):
    """The 32-bit finalizer of a well-known hash: a bijection that scrambles every bit. `h` is
    an int or an int64 tensor holding values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def row_key(seed: int, position: int) -> int:
    """A 32-bit key for (seed, position), computed on the host."""
    h = _fmix32((position * 0x9E3779B9) & MASK32)
    h = _fmix32(h ^ ((seed >> 32) & MASK32))
    return _fmix32(h ^ (seed & MASK32))


def exponentials(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """E ~ Exp(1) for each (row key, token id): keys [rows, 1] int64, token_ids [rows, n] int64."""
    h = _fmix32((keys ^ ((token_ids * 0x27D4EB2F) & MASK32)) & MASK32)
    return -torch.log(uniform(h))


def uniform(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes -> float32 in (0, 1), never 0 or 1: 23 bits, so x + 0.5 is exact in float32 (with
    24, x = 2**24 - 1 rounded up to 1.0, its E to 0, and a token of probability 0 won the race)."""
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def reads_reply(spec) -> bool:
    """Whether the row's choice reads the reply so far, or its log-probabilities are wanted, other
    than through a mask: forced tokens, penalties, min_tokens, logprobs."""
    return bool(spec.forced is not None or spec.presence_penalty or spec.frequency_penalty
                or spec.repetition_penalty != 1.0 or spec.min_tokens or spec.logprobs)


def needs_tokens(spec) -> bool:
    """Whether the host must see this row's token each step (its later steps read it)."""
    return spec.mask is not None or reads_reply(spec)


def _rows_tensor(values, device, dtype):
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _write_processing(rows, scores: torch.Tensor) -> None:
    """logit_bias, OpenAI's penalties, vLLM's repetition penalty and min_tokens, then masks,
    in 0100's order, onto the gathered scores [rows, vocab]."""
    device = scores.device
    bias_r, bias_t, bias_v = [], [], []
    for r, spec in enumerate(rows):
        for token, value in spec.logit_bias.items():
            bias_r.append(r), bias_t.append(token), bias_v.append(value)
    if bias_r:
        scores.index_put_((_rows_tensor(bias_r, device, torch.long), _rows_tensor(bias_t, device, torch.long)),
                          _rows_tensor(bias_v, device, scores.dtype), accumulate=True)
    pen_r, pen_t, pen_v = [], [], []
    for r, spec in enumerate(rows):
        if spec.tokens and (spec.presence_penalty or spec.frequency_penalty):
            counts: dict = {}
            for t in spec.tokens:
                counts[t] = counts.get(t, 0) + 1
            for t, c in counts.items():
                pen_r.append(r), pen_t.append(t), pen_v.append(-(spec.frequency_penalty * c + spec.presence_penalty))
    if pen_r:
        scores.index_put_((_rows_tensor(pen_r, device, torch.long), _rows_tensor(pen_t, device, torch.long)),
                          _rows_tensor(pen_v, device, scores.dtype), accumulate=True)
    rep_r, rep_t, rep_p = [], [], []
    for r, spec in enumerate(rows):
        if spec.repetition_penalty != 1.0:
            seen = set(spec.prompt_ids) | set(spec.tokens)
            rep_r += [r] * len(seen)
            rep_t += list(seen)
            rep_p += [spec.repetition_penalty] * len(seen)
    if rep_r:
        index = (_rows_tensor(rep_r, device, torch.long), _rows_tensor(rep_t, device, torch.long))
        values, penalty = scores[index], _rows_tensor(rep_p, device, scores.dtype)
        scores[index] = torch.where(values > 0, values / penalty, values * penalty)
    sup_r, sup_t = [], []
    for r, spec in enumerate(rows):
        if len(spec.tokens) < spec.min_tokens and spec.suppress:
            sup_r += [r] * len(spec.suppress)
            sup_t += list(spec.suppress)
    if sup_r:
        scores[_rows_tensor(sup_r, device, torch.long), _rows_tensor(sup_t, device, torch.long)] = float("-inf")
    for r, spec in enumerate(rows):
        if spec.mask is not None:
            row = scores[r]
            masked = spec.mask(spec, row)
            if masked.data_ptr() != row.data_ptr():  # a mask that made a new tensor
                scores[r] = masked
    grammar_overlap.apply(scores)  # 0640: the bitmasks of the rows it prepared, all at once


CHUNK = 16  # rows sampled together: bounds the step's temporaries (about 10 of [CHUNK, vocab] x 8 bytes)

# A row's way through the draw, chosen by its own settings and its request's knobs, never by its
# neighbours' (so are its bits): "whole" races over the whole vocabulary in token order (nothing
# to cut), "sorted" sorts the row for its cuts, "free" cuts without a sort (PB_SORT_FREE). A
# chunk's kind names the ways its rows take, joined by "+" in this order.
PATHS = ("whole", "sorted", "free")
KINDS = tuple("+".join(p for i, p in enumerate(PATHS) if mask >> i & 1) for mask in range(1, 1 << len(PATHS)))


def path(spec, vocab: int) -> str:
    if 0 < spec.top_k < vocab:
        return "sorted"  # top-p then weighs the top k alone: PB_SORT_FREE leaves these to the sort
    if spec.sort_free:
        return "free"
    return "whole" if spec.top_p >= 1.0 and not spec.min_p else "sorted"


def _sample(rows, scores: torch.Tensor) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p for every row at once, then the race: token ids [rows].
    Rows go in chunks of CHUNK: upstream sizes the KV pool from the memory left at start, so the
    sampler's working set must stay small. A row's token never depends on its chunk."""
    if len(rows) > CHUNK:
        return torch.cat([_sample(rows[i:i + CHUNK], scores[i:i + CHUNK]) for i in range(0, len(rows), CHUNK)])
    vocab = scores.shape[-1]
    ways = [path(spec, vocab) for spec in rows]
    kind = "+".join(p for p in PATHS if p in ways)
    # One copy to the device for every row's settings (float64 holds the 32-bit keys exactly).
    params = [[spec.temperature or 1.0 for spec in rows],
              [spec.top_k if 0 < spec.top_k < vocab else vocab for spec in rows],
              [spec.top_p for spec in rows], [spec.min_p for spec in rows],
              [row_key(spec.seed, spec.position) for spec in rows], [float(PATHS.index(w)) for w in ways]]
    if all(spec.graphed for spec in rows) and sampler_graph.usable(scores):
        return sampler_graph.race(scores, params, kind)  # 0650: one replay instead of ~50 launches
    return race(scores, _rows_tensor(params, scores.device, torch.float64), kind)


def race(scores: torch.Tensor, params: torch.Tensor, kind: str) -> torch.Tensor:
    """The draw on the device alone, no host work (so a CUDA graph can hold it): scores [rows,
    vocab] float32, params [6, rows] float64 (temperature, top_k, top_p, min_p, the row's key,
    the row's index in PATHS); `kind` (one of KINDS) says which ways the rows take: each is
    computed for every row, each row keeping its own."""
    device, vocab = scores.device, scores.shape[-1]
    temperature, top_p, min_p = params[0, :, None].float(), params[2, :, None].float(), params[3, :, None].float()
    keys = params[4, :, None].long()
    scaled = scores / temperature
    drawn = {}
    ways = kind.split("+")
    if "whole" in ways:
        ids = torch.arange(vocab, device=device)[None, :]
        drawn["whole"] = (torch.softmax(scaled, dim=-1) / exponentials(keys, ids)).argmax(dim=-1)
    if "sorted" in ways:
        ordered, order = scaled.sort(dim=-1, descending=True, stable=True)
        rank = torch.arange(vocab, device=device)[None, :]
        ordered = ordered.masked_fill(rank >= params[1, :, None].long(), float("-inf"))
        probs = torch.softmax(ordered, dim=-1)
        probs = probs.masked_fill(probs < min_p * probs[:, :1], 0.0)
        before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill((before >= top_p) & (rank > 0), 0.0)  # the first is always kept
        weighted = probs / exponentials(keys, order)
        drawn["sorted"] = order.gather(1, weighted.argmax(dim=-1, keepdim=True)).squeeze(1)
    if "free" in ways:
        drawn["free"] = sort_free.race(scaled, top_p[:, 0], min_p[:, 0], keys[:, 0])  # 0660
    picks = drawn[ways[0]]
    for way in ways[1:]:
        picks = torch.where(params[5] == PATHS.index(way), drawn[way], picks)
    return picks


def choose_rows(rows, raw: torch.Tensor, index: list) -> torch.Tensor:
    """The tokens of `rows` (their Specs) from raw logits [num_logits, vocab] at `index`, on the
    logits' device; each Spec's position moves on by one, and rows that need their tokens on
    the host get them."""
    catch_up()  # 0640: the tokens the last step chose, before anything reads them
    forced = [r for r, spec in enumerate(rows) if spec.forced is not None]
    free = [r for r, spec in enumerate(rows) if spec.forced is None]
    grammar_overlap.prepare([rows[r] for r in free], raw.device)  # 0640: before any GPU work of the step
    picks = torch.empty(len(rows), dtype=torch.long, device=raw.device)
    if forced:
        tokens = [rows[r].forced[len(rows[r].tokens)] if len(rows[r].tokens) < len(rows[r].forced)
                  else rows[r].forced_end for r in forced]
        picks[_rows_tensor(forced, raw.device, torch.long)] = _rows_tensor(tokens, raw.device, torch.long)
    if free:
        subset = [rows[r] for r in free]
        scores = raw.index_select(0, _rows_tensor([index[r] for r in free], raw.device, torch.long)).float()
        _write_processing(subset, scores)
        sampled = [r for r, spec in enumerate(subset) if spec.do_sample and spec.temperature != 0]
        if len(sampled) == len(subset):
            chosen = _sample(subset, scores)
        else:
            chosen = scores.argmax(dim=-1)
            if sampled:
                at = _rows_tensor(sampled, raw.device, torch.long)
                chosen[at] = _sample([subset[r] for r in sampled], scores.index_select(0, at))
        if forced:
            picks[_rows_tensor(free, raw.device, torch.long)] = chosen
        else:
            picks = chosen
    for spec in rows:
        spec.position += 1
    host = [r for r, spec in enumerate(rows) if needs_tokens(spec)]
    # 0640: rows whose request has it get their tokens (and log-probabilities) by their next step,
    # copied now without a wait; the others wait here.
    later = [r for r in host if rows[r].overlap]
    if later:
        _to_host_later([rows[r] for r in later], raw, [index[r] for r in later],
                       picks.index_select(0, _rows_tensor(later, raw.device, torch.long)))
        host = [r for r in host if r not in set(later)]
    if host:
        _to_host([rows[r] for r in host], raw, [index[r] for r in host],
                 picks.index_select(0, _rows_tensor(host, raw.device, torch.long)))
    return picks


def _logprobs(specs: list, raw: torch.Tensor, index: list, tokens: torch.Tensor):
    """On the device, for the rows of `specs` that want them: the chosen tokens' log-probabilities
    [n] and the top ones (values, ids [n, k]); None where no row wants them."""
    wanted = [j for j, spec in enumerate(specs) if spec.logprobs]
    if not wanted:
        return None, None, None
    at = _rows_tensor(wanted, raw.device, torch.long)
    lp = torch.log_softmax(raw.index_select(0, _rows_tensor([index[j] for j in wanted], raw.device,
                                                            torch.long)).float(), dim=-1)
    chosen = lp.gather(1, tokens.index_select(0, at)[:, None]).squeeze(1)
    k = max(specs[j].top_logprobs for j in wanted)
    values, ids = lp.topk(k, dim=-1) if k else (None, None)
    return chosen, values, ids


def _record(specs: list, tokens: list, chosen, values, ids) -> None:
    """Host lists into the Specs: each row's token, and its log-probabilities when it wants them."""
    n = 0
    for spec, token in zip(specs, tokens):
        spec.tokens.append(int(token))
        if spec.logprobs:
            spec.chosen_logprobs.append(float(chosen[n]))
            if spec.top_logprobs:
                spec.top.append(list(zip(ids[n][:spec.top_logprobs], values[n][:spec.top_logprobs])))
            n += 1


def _to_host(specs: list, raw: torch.Tensor, index: list, tokens: torch.Tensor) -> None:
    """One wait for the step: the tokens (and log-probabilities) of the rows whose state reads them."""
    chosen, values, ids = _logprobs(specs, raw, index, tokens)
    _record(specs, tokens.tolist(), *(None if t is None else t.tolist() for t in (chosen, values, ids)))


_later: list = []  # (event, host tensors, specs): earlier steps' tokens on their way to the host
_later_lock = threading.Lock()


def _to_host_later(specs: list, raw: torch.Tensor, index: list, tokens: torch.Tensor) -> None:
    parts = [tokens, *_logprobs(specs, raw, index, tokens)]
    event = None
    if tokens.is_cuda:
        copies = []
        for t in parts:
            if t is not None:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                t = host.copy_(t, non_blocking=True)
            copies.append(t)
        parts = copies
        event = torch.cuda.Event()
        event.record()
    with _later_lock:
        _later.append((event, parts, specs))


def catch_up() -> None:
    """Into their Specs, what earlier steps copied. The engine calls this before a step reads any
    Spec's tokens (by then the next step's forward is queued: the GPU keeps busy while this
    waits); a reply calls it when a token's log-probability has not arrived yet (its step is
    done by then: upstream has read its token)."""
    with _later_lock:
        for event, parts, specs in _later:
            if event is not None:
                event.synchronize()
            _record(specs, *(None if t is None else t.tolist() for t in parts))
        _later.clear()


def settle(spec, count: int) -> None:
    """Make sure `spec` holds the log-probabilities of its first `count` tokens (0640 copies them
    a step late)."""
    if spec is not None and spec.logprobs and len(spec.chosen_logprobs) < count:
        catch_up()
