"""Run by tests/test_varlen_attention.py under Triton's CPU interpreter (TRITON_INTERPRET=1) with
the patched engine first on PYTHONPATH and PB_VARLEN_ATTENTION=1 (PB_VARLEN_FAST=1 for 0400's
prompt blocks): 0370's kernel against upstream's masked sdpa on random steps, a sequence alone
against the same sequence among others, and the tiny model's greedy replies through the batching
loop. Prints one JSON line."""

import functools
import json
import random
import sys
from types import SimpleNamespace

import torch
from transformers.generation.continuous_batching.utils import build_attention_mask
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from transformers._pb.ops import stable_launch as launch_keys, varlen_attention

HEADS, KV_HEADS, DIM = 6, 2, 16
MODULE = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)


def step(seqs: list[tuple[int, int]], pad_q: int, pad_k: int, gen: torch.Generator):
    """A step of (cached, new) token counts: query [1, H, Tq, D], keys/values [1, KVH, Tk, D]
    laid out as upstream's cache update returns them (each sequence's cached keys, then its new
    ones), and the cumulative lengths."""
    cu_q, cu_k = [0], [0]
    for past, new in seqs:
        cu_q.append(cu_q[-1] + new)
        cu_k.append(cu_k[-1] + past + new)
    tq, tk = cu_q[-1] + pad_q, cu_k[-1] + pad_k
    q = torch.randn((1, tq, HEADS, DIM), generator=gen).transpose(1, 2)  # the model's transposed view
    k = torch.randn((1, tk, KV_HEADS, DIM), generator=gen).transpose(1, 2)
    v = torch.randn((1, tk, KV_HEADS, DIM), generator=gen).transpose(1, 2)
    return q, k, v, cu_q, cu_k


def reference(q, k, v, cu_q, cu_k):
    mask = torch.full((1, 1, q.shape[2], k.shape[2]), torch.finfo(q.dtype).min)
    build_attention_mask(mask, cu_q, cu_k)
    out, _ = sdpa_attention_forward(MODULE, q, k, v, mask, scaling=DIM ** -0.5)
    return out


def kernel(q, k, v, cu_q, cu_k):
    kwargs = {"cu_seq_lens_q": torch.tensor(cu_q, dtype=torch.int32),
              "cu_seq_lens_k": torch.tensor(cu_k, dtype=torch.int32)}
    return varlen_attention.forward(MODULE, q, k, v, DIM ** -0.5, kwargs)


def random_step(rng: random.Random, gen: torch.Generator, most: int):
    """1 to `most` sequences, each a fresh prompt, a chunk after cached keys or a decode row, with
    padded query rows and keys: (the sequences' (cached, new) counts, step's tensors)."""
    seqs = [(rng.choice([0, 0, rng.randint(1, 150)]), rng.choice([1, 1, rng.randint(1, 90)]))
            for _ in range(rng.randint(1, most))]
    return seqs, step(seqs, rng.randint(0, 5), rng.randint(0, 7), gen)


def random_steps(count: int = 40) -> dict:
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    worst, padding_rows_zero, mixed = 0.0, True, 0
    for case in range(count):
        seqs, (q, k, v, cu_q, cu_k) = random_step(rng, gen, 5)
        got, want = kernel(q, k, v, cu_q, cu_k), reference(q, k, v, cu_q, cu_k)
        real = cu_q[-1]
        worst = max(worst, (got[:, :real] - want[:, :real]).abs().max().item())
        padding_rows_zero &= bool((got[:, real:] == 0).all())
        mixed += len(seqs) > 1 and max(n for _, n in seqs) > 1 and min(n for _, n in seqs) == 1
    return {"cases": count, "max_abs_diff": worst, "padding_rows_zero": padding_rows_zero,
            "mixed_steps": mixed}


def alone_vs_batched(past: int, new: int) -> dict:
    """One sequence (`past` cached keys, `new` query rows) alone, then second among three with
    padding: are its rows the same bits?"""
    gen = torch.Generator().manual_seed(1)
    q, k, v, cu_q, cu_k = step([(past, new)], 0, 0, gen)
    alone = kernel(q, k, v, cu_q, cu_k)
    bq, bk, bv, bcu_q, bcu_k = step([(13, 1), (past, new), (0, 33)], 3, 5, gen)
    bq[:, :, bcu_q[1]:bcu_q[2]] = q[:, :, :new]
    bk[:, :, bcu_k[1]:bcu_k[2]] = k[:, :, :past + new]
    bv[:, :, bcu_k[1]:bcu_k[2]] = v[:, :, :past + new]
    batched = kernel(bq, bk, bv, bcu_q, bcu_k)[:, bcu_q[1]:bcu_q[2]]
    return {"equal_bits": bool(torch.equal(alone, batched)), "max_abs_diff": (alone - batched).abs().max().item()}


def stable_launch() -> dict:
    """0450: a step of 70 sequences (prompt chunks among decode rows, the last prompt past the
    first 64) with the prompt kernel's sequence count taken 64 at a time (PB_STABLE_LAUNCH) and in
    one pass (0370's launch): the same bits, and upstream's result."""
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    seqs = [(rng.randint(0, 20), rng.choice([1, 1, 1, rng.randint(2, 9)])) for _ in range(68)]
    seqs += [(5, 140), (0, 1)]  # a prompt of two blocks, 69th, then a decode row
    q, k, v, cu_q, cu_k = step(seqs, 2, 3, gen)
    launch_keys.STABLE = False
    once = kernel(q, k, v, cu_q, cu_k)
    launch_keys.STABLE = True
    chunked = kernel(q, k, v, cu_q, cu_k)
    launch_keys.STABLE = False
    want = reference(q, k, v, cu_q, cu_k)
    real = cu_q[-1]
    return {"sequences": len(seqs), "prompts": sum(n > 1 for _, n in seqs),
            "equal_bits": bool(torch.equal(once, chunked)),
            "max_abs_diff": (chunked[:, :real] - want[:, :real]).abs().max().item()}


def split_decode() -> dict:
    """0740: decode rows of one to many parts (keys past PART_BLOCKS blocks) among a prompt chunk
    and padding, against upstream's masked sdpa; a long row alone against batched, and whatever
    the programs' count; rows of one part against 0370's bits; the part count's cap."""
    gen = torch.Generator().manual_seed(4)
    seqs = [(0, 1), (510, 1), (511, 1), (512, 1), (1300, 1), (40, 30), (2899, 1)]
    q, k, v, cu_q, cu_k = step(seqs, 2, 3, gen)
    got, want = kernel(q, k, v, cu_q, cu_k), reference(q, k, v, cu_q, cu_k)
    real = cu_q[-1]
    report = {"max_abs_diff": (got[:, :real] - want[:, :real]).abs().max().item(),
              "padding_rows_zero": bool((got[:, real:] == 0).all())}
    varlen_attention.SPLIT = False
    unsplit = kernel(q, k, v, cu_q, cu_k)
    varlen_attention.SPLIT = True
    short = [i for i, (past, new) in enumerate(seqs) if new == 1 and past + new <= 512]
    report["one_part_rows_equal_0370"] = all(torch.equal(got[0, cu_q[i]], unsplit[0, cu_q[i]]) for i in short)
    report["long_rows_differ_from_0370"] = all(not torch.equal(got[0, cu_q[i]], unsplit[0, cu_q[i]]) for i in (4, 6))
    # the long row alone, and with one program a KV head and with seven
    lone = [(2899, 1)]
    lq, lk, lv, lcu_q, lcu_k = step(lone, 0, 0, gen)
    q[:, :, -3] = lq[:, :, 0]  # the step's last real row is the long one: its keys are the step's last
    k[:, :, cu_k[-2]:cu_k[-1]], v[:, :, cu_k[-2]:cu_k[-1]] = lk, lv
    batched = kernel(q, k, v, cu_q, cu_k)[:, real - 1:real]
    alone = kernel(lq, lk, lv, lcu_q, lcu_k)
    programs = varlen_attention._programs
    counts = {}
    for count in (1, 7):
        varlen_attention._programs = lambda device, kv_heads, count=count: count
        counts[count] = kernel(lq, lk, lv, lcu_q, lcu_k)
    varlen_attention._programs = programs
    report["alone_vs_batched_equal_bits"] = bool(torch.equal(alone, batched))
    report["programs_equal_bits"] = all(torch.equal(alone, c) for c in counts.values())
    # at most two parts a row: the 2,900-key row's 23 blocks in parts of 12 and 11
    varlen_attention.MAX_PARTS = 2
    capped = kernel(lq, lk, lv, lcu_q, lcu_k)
    varlen_attention.MAX_PARTS = 64
    report["capped_max_abs_diff"] = (capped - reference(lq, lk, lv, lcu_q, lcu_k)).abs().max().item()
    report["capped_differs"] = not torch.equal(capped, alone)
    # 70 rows: the parts counted over two chunks of SEQ_CHUNK sequences, long rows past the first 64
    rng = random.Random(5)
    many = [(rng.choice([rng.randint(0, 60), rng.randint(500, 1400)]), 1) for _ in range(68)] + [(30, 9), (1100, 1)]
    mq, mk, mv, mcu_q, mcu_k = step(many, 1, 2, gen)
    real = mcu_q[-1]
    report["many_rows"] = len(many)
    report["many_max_abs_diff"] = (kernel(mq, mk, mv, mcu_q, mcu_k)[:, :real]
                                   - reference(mq, mk, mv, mcu_q, mcu_k)[:, :real]).abs().max().item()
    return report


def attn_grid() -> dict:
    """0940: steps run with the launches sized to the step (varlen_attention.GRID) against 0370's
    and 0740's launches: a step of many short prompts (more query blocks than the prompt kernel's
    programs, so programs take several in turn) among decode rows, with padding sequences of no
    tokens as the batching loop pads them; a step of decode rows alone (one part to many); random
    steps. Every output the same bits, and the many-prompt step upstream's result."""
    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    prompts = [(rng.choice([0, rng.randint(1, 200)]), rng.randint(2, 60)) for _ in range(10)] + [(40, 300)]
    rows = [(rng.randint(0, 1300), 1) for _ in range(9)]
    mixed = prompts[:5] + rows[:4] + prompts[5:] + rows[4:] + [(0, 0), (0, 0)]
    decode = [(rng.choice([rng.randint(0, 120), rng.randint(500, 2900)]), 1) for _ in range(12)] + [(0, 0)]
    steps = [step(mixed, 3, 4, gen), step(decode, 1, 2, gen)]
    for _ in range(8):
        steps.append(random_step(rng, gen, 6)[1])
    outs = {}
    for grid in (False, True):
        varlen_attention.GRID = grid
        outs[grid] = [kernel(*s) for s in steps]
    varlen_attention.GRID = False
    q, k, v, cu_q, cu_k = steps[0]
    blocks = sum(-(-n // varlen_attention.BLOCK_M) for _, n in mixed if n > 1)
    real = cu_q[-1]
    return {"steps": len(steps), "mixed_blocks": blocks,
            "mixed_programs": -(-q.shape[2] // varlen_attention.BLOCK_M) + varlen_attention.GRID_EXTRA,
            "equal_bits": [bool(torch.equal(a, b)) for a, b in zip(outs[False], outs[True])],
            "mixed_max_abs_diff": (outs[True][0][:, :real] - reference(q, k, v, cu_q, cu_k)[:, :real]).abs().max().item()}


def verify_rows(past: int = 700, drafts: int = 4) -> dict:
    """What drafted == serial needs of attention: a sequence's last token and `drafts` guesses
    after it, attended in one step as one decode row each over its own prefix of the keys (the
    cache read through an index that repeats the prefix's rows, as 0750 reads pages), among
    another sequence's decode row and a prompt chunk, against the serial decode steps one at a
    time. Also the same rows as one prompt chunk (the prompt kernel's order of sums)."""
    gen = torch.Generator().manual_seed(6)
    new = drafts + 1
    q, k, v, _, _ = step([(past, new)], 0, 0, gen)
    serial = [kernel(q[:, :, j:j + 1], k[:, :, :past + j + 1], v[:, :, :past + j + 1], [0, 1], [0, past + j + 1])
              for j in range(new)]
    # the step: a decode row of 300 keys, the verify rows, a prompt chunk of 20 after 10 cached
    oq, ok, ov, _, _ = step([(299, 1)], 0, 0, gen)
    pq, pk, pv, _, _ = step([(10, 20)], 0, 0, gen)
    query = torch.cat([oq, q, pq], dim=2)
    cache_k, cache_v = torch.cat([ok, k, pk], dim=2), torch.cat([ov, v, pv], dim=2)  # the pages' rows
    first = ok.shape[2]
    index = list(range(first))
    cu_q, cu_k = [0, 1], [0, first]
    for j in range(new):
        index += range(first, first + past + j + 1)
        cu_q.append(cu_q[-1] + 1)
        cu_k.append(cu_k[-1] + past + j + 1)
    second = first + k.shape[2]
    index += range(second, second + pk.shape[2])
    cu_q.append(cu_q[-1] + 20)
    cu_k.append(cu_k[-1] + pk.shape[2])
    as_tensor = functools.partial(torch.tensor, dtype=torch.int32)
    got = varlen_attention._attend(query, cache_k, cache_v, DIM ** -0.5, as_tensor(cu_q), as_tensor(cu_k),
                                   index=torch.tensor(index, dtype=torch.int64), fast=False)
    rows = [got[:, 1 + j:2 + j] for j in range(new)]
    chunk = kernel(q, k, v, [0, new], [0, past + new])
    return {"rows": new, "equal_bits": all(torch.equal(r, s) for r, s in zip(rows, serial)),
            "max_abs_diff": max((r - s).abs().max().item() for r, s in zip(rows, serial)),
            "as_prompt_chunk_equal_bits": all(torch.equal(chunk[:, j:j + 1], serial[j]) for j in range(new)),
            "as_prompt_chunk_max_abs_diff": max((chunk[:, j:j + 1] - serial[j]).abs().max().item()
                                                for j in range(new))}


def batching_run(model_dir: str, text: str, lengths: tuple, new_tokens: int):
    """The tiny model in float32 with sdpa, prompts of `lengths` tokens cut from `text` repeated, a
    greedy config of `new_tokens` and a batching config of 16 pages and steps of at most 256 tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    words = text.split()
    prompts = [tok(" ".join(words[i % len(words)] for i in range(n)))["input_ids"][:n] for n in lengths]
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return model, prompts, config, ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=256)


def same_bits(a: list, b: list) -> bool:
    """Two runs' recorded attention outputs: as many, each pair the same bits."""
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def cache_read(model_dir: str) -> dict:
    """0750: the tiny model's greedy replies to prompts of 20 to 400 tokens through the batching
    loop, steps of at most 256 tokens (the long prompt in chunks after its cached keys, beside
    decode rows), with the attention reading the cache's pages and with upstream's gather: every
    attention output the same bits, and the replies the same."""
    model, prompts, config, cb = batching_run(
        model_dir, "the cache holds every key a request has read so far and the step reads them again", (400, 150, 20), 10)
    real = varlen_attention._attend
    outputs, indexed = [], []

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        outputs.append(out.clone())
        indexed.append(len(args) > 6 and args[6] is not None)
        return out

    varlen_attention._attend = recording
    runs = {}
    for read in (False, True):
        varlen_attention.READ_CACHE = read
        outputs.clear(), indexed.clear()
        outs = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb,
                                    progress_bar=False)
        runs[read] = {"replies": [outs[r].generated_tokens for r in sorted(outs)], "outputs": list(outputs),
                      "indexed": sum(indexed)}
    varlen_attention._attend = real
    a, b = runs[False], runs[True]
    return {"calls": len(b["outputs"]), "indexed_calls": b["indexed"], "gather_run_indexed": a["indexed"],
            "same_calls": len(a["outputs"]) == len(b["outputs"]),
            "equal_bits": same_bits(a["outputs"], b["outputs"]),
            "replies_equal": a["replies"] == b["replies"], "reply_lengths": [len(r) for r in b["replies"]],
            "prompt_lengths": [len(p) for p in prompts]}


def decode_graphs(model_dir: str) -> dict:
    """0930: the tiny model's greedy replies through the batching loop with padded step shapes (as
    CUDA graphs pad them; here the padded forward runs eagerly), with PB_DECODE_GRAPHS at 0, 1 and
    2: the graph key each step would replay, every attention output's bits and the replies. The
    400-token prompt is cut into steps of 256 tokens, its later chunks beside decode rows, and the
    contexts grow across several of 0230's KV buckets."""
    from transformers.generation.continuous_batching import model_runner as runner_module

    from transformers._pb.runtime import decode_graphs as wide, graph_after, kv_sizing

    kv_sizing.at_load()  # 0850 (the job's knobs): no masks, as the server's load would set
    model, prompts, config, cb = batching_run(
        model_dir, "a decode step reads every key its row has and writes one more at the end of it", (400, 150, 20), 40)
    runner_class = runner_module.ModelRunner
    real_init, real_compute, real_attend, knob = (runner_class.__init__, runner_class.compute_batch,
                                                 varlen_attention._attend, wide.on)
    outputs, keys, caps = [], [], set()

    def padded_init(self, *args, **kwargs):  # the shapes graphs would replay, run eagerly
        real_init(self, *args, **kwargs)
        self.pad_inputs = True

    def compute(self, *args, **kwargs):
        io = graph_after._device_io(self.inputs_and_outputs)
        keys.append((list(io._get_graph_key()), bool(wide.wide(io))))
        caps.add(self.cache.max_tokens_read)
        return real_compute(self, *args, **kwargs)

    def recording(*args, **kwargs):
        out = real_attend(*args, **kwargs)
        outputs.append(out.clone())
        return out

    runner_class.__init__, runner_class.compute_batch, varlen_attention._attend = padded_init, compute, recording
    runs = {}
    try:
        for level in (0, 1, 2):
            wide.on = lambda level=level: level
            outputs.clear(), keys.clear()
            outs = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb,
                                        progress_bar=False)
            steps = keys[1:]  # the first is upstream's warm-up at the largest sizes
            runs[level] = {"replies": [outs[r].generated_tokens for r in sorted(outs)], "outputs": list(outputs),
                           "steps": len(steps), "wide_steps": sum(w for _, w in steps),
                           "keys": sorted({tuple(k) for k, _ in steps})}
    finally:
        runner_class.__init__, runner_class.compute_batch = real_init, real_compute
        varlen_attention._attend, wide.on = real_attend, knob
        kv_sizing.restore()
    base = runs[0]
    return {"cap": sorted(caps), "prompt_lengths": [len(p) for p in prompts],
            "reply_lengths": [len(r) for r in base["replies"]],
            **{f"level{level}": {"steps": run["steps"], "wide_steps": run["wide_steps"],
                                  "keys": [list(k) for k in run["keys"]],
                                  "equal_bits": same_bits(run["outputs"], base["outputs"]),
                                  "replies_equal": run["replies"] == base["replies"]}
               for level, run in runs.items()}}


def tiny_replies(model_dir: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    prompts = [tok(t)["input_ids"] for t in ("def fibonacci(n):", "The quick brown fox jumps over", "import os\n")]
    config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    calls = []
    real = varlen_attention._attend  # both ways in: forward, and 0750's forward_from_cache

    def counted(*args, **kwargs):
        calls.append(True)
        return real(*args, **kwargs)

    cb = ContinuousBatchingConfig(num_blocks=16)  # upstream sizes the pool from free memory: seconds a run here
    varlen_attention._attend = counted
    replies = {}
    for name, enabled in (("upstream", False), ("kernel", True)):
        varlen_attention.ENABLED = enabled
        outs = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb,
                                    progress_bar=False)
        replies[name] = [outs[r].generated_tokens for r in sorted(outs)]
    varlen_attention._attend = real
    return {"equal": replies["upstream"] == replies["kernel"], "kernel_steps": sum(calls),
            "replies": replies["kernel"]}


varlen_attention.at_load()
probe = step([(3, 5)], 0, 0, torch.Generator().manual_seed(2))
report = {"enabled": varlen_attention.ENABLED, "fast": varlen_attention.FAST,
          "descriptors": varlen_attention.FAST and varlen_attention._descriptors(probe[1], probe[2]) is not None,
          "random": random_steps(), "alone_vs_batched": alone_vs_batched(40, 70),
          "decode_alone_vs_batched": alone_vs_batched(150, 1), "stable_launch": stable_launch(),
          "split_on": varlen_attention.SPLIT, "read_cache_on": varlen_attention.READ_CACHE,
          "fewer_on": varlen_attention.FEWER,
          "verify_rows": verify_rows(), "attn_grid": attn_grid()}
if varlen_attention.SPLIT:
    report["split"] = split_decode()
if len(sys.argv) > 1:
    report["tiny"] = tiny_replies(sys.argv[1])
    if varlen_attention.READ_CACHE:
        report["cache_read"] = cache_read(sys.argv[1])
    if varlen_attention.READ_CACHE and varlen_attention.SPLIT:
        report["decode_graphs"] = decode_graphs(sys.argv[1])
print(json.dumps(report))
