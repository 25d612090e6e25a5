"""PB_STABLE_LAUNCH: Triton launch keys that do not follow the batch, compiled when the model loads,
so no request waits for the compiler.

Triton compiles a kernel once per launch key: its constexprs, its warps, and for each int argument
whether it is 1, a multiple of 16 or neither. Two kernels of the production set had keys that
follow the step (W15 compile-stalls-tp2-api):
- 0370's prompt attention took the step's sequence count rounded up to a power of two (SEQ_P2);
- 0220's expert sort (`align`) took the step's pairs and blocks rounded up to powers of two, and
  4 or 8 warps by the pairs.
Each new value was a compile of 0.2-1.8 s in the middle of serving, and every request of that step
waited for it: W15 saw 5 of 16 passes' first tokens wait 1.6-2.0 s.

With the knob on:
- the attention counts a step's sequences SEQ_CHUNK at a time (a loop), so only the sequence
  count's int class (1, a multiple of 16, other) is left in its key;
- the sort launches at 64, 128 or 256 pairs (ALIGN_MAX_PAIRS), masked to the step's pairs as
  before. Always launching at 256 removed its compiles too, but cost a decode step 10 % at one
  stream (W15 stable-launch-v1);
- `after_load` then runs both on dummy steps of every key a step can produce (the sort for every
  token count up to ALIGN_MAX_PAIRS pairs, the attention for 1, 2 and 16 sequences), so they are
  compiled, or read from Triton's disk cache, before the server takes requests.
Both are integer work: the results are the same bits.
"""

import sys
import time
from types import SimpleNamespace

import torch

from .. import knobs

STABLE = False  # set by at_load: 0370's attention and 0220's sort read it at every launch
ATTENTION_WARM_SEQUENCES = (1, 2, 16)  # one sequence count of each int class of the kernel's key


def on() -> bool:
    return bool(knobs.get("PB_STABLE_LAUNCH"))


def at_load() -> None:
    """The model-load hook: fix the two kernels' launch keys."""
    global STABLE
    STABLE = on()
    if STABLE:
        sys.stderr.write("patchbay: PB_STABLE_LAUNCH: the prompt attention's and the expert sort's Triton "
                         "launch keys no longer follow the step's size\n")


def warm_align(model) -> int:
    """Sort dummy routings of every token count the one-program sort takes; the launches made."""
    from . import fused_moe  # here: fused_moe reads STABLE from this module

    if not (fused_moe.on() and STABLE):
        return 0
    experts = next((m for m in model.modules() if hasattr(m, "num_experts") and hasattr(m, "gate_up_proj")), None)
    top_k = getattr(model.config.get_text_config(), "num_experts_per_tok", None)
    if experts is None or not top_k or experts.gate_up_proj.device.type != "cuda":
        return 0
    device, count = experts.gate_up_proj.device, experts.num_experts
    launches = 0
    for tokens in range(1, fused_moe.ALIGN_MAX_PAIRS // top_k + 1):
        index = torch.arange(tokens * top_k, device=device).reshape(tokens, top_k) % count
        fused_moe.align(index, count)
        launches += 1
    return launches


def warm_attention(model) -> int:
    """Attend over dummy steps of 1, 2 and 16 two-token prompts after cached keys, and of as many
    decode rows (through the read index too with 0750); the prompt steps run."""
    from . import varlen_attention  # here: varlen_attention reads STABLE from this module

    if not (varlen_attention.ENABLED and STABLE):
        return 0
    config = model.config.get_text_config()
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or (heads and config.hidden_size // heads)
    weight = next(model.parameters(), None)
    if not heads or weight is None or weight.device.type != "cuda":
        return 0
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    new, cached = 2, 3  # each sequence: a two-token prompt after three cached keys
    make = dict(dtype=weight.dtype, device=weight.device)
    cu = dict(dtype=torch.int32, device=weight.device)
    steps = 0
    for sequences in ATTENTION_WARM_SEQUENCES:
        # the layouts the model hands over: [1, heads, tokens, dim] views of [1, tokens, heads, dim]
        q = torch.zeros((1, new * sequences, heads, dim), **make).transpose(1, 2)
        k = torch.zeros((1, (new + cached) * sequences, kv_heads, dim), **make).transpose(1, 2)
        v = torch.zeros_like(k)
        kwargs = {"cu_seq_lens_q": torch.arange(0, new * sequences + 1, new, **cu),
                  "cu_seq_lens_k": torch.arange(0, (new + cached) * sequences + 1, new + cached, **cu)}
        if varlen_attention.forward(module, q, k, v, dim ** -0.5, kwargs) is not None:
            steps += 1
        # decode rows (0370's or 0740's kernels), and both kinds read through an index (0750)
        decode_q = q[:, :, :sequences]
        decode_cu = torch.arange(0, sequences + 1, **cu)
        varlen_attention._attend(decode_q, k, v, dim ** -0.5, decode_cu, kwargs["cu_seq_lens_k"])
        if varlen_attention.READ_CACHE:
            index = torch.arange(k.shape[2], dtype=torch.int64, device=weight.device)
            varlen_attention._attend(q, k, v, dim ** -0.5, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"], index)
            varlen_attention._attend(decode_q, k, v, dim ** -0.5, decode_cu, kwargs["cu_seq_lens_k"], index)
    return steps


def after_load(model) -> None:
    """With the knob on, compile the launch keys left (see the module's text) before any request."""
    if not on():
        return
    start = time.perf_counter()
    sorts, steps = warm_align(model), warm_attention(model)
    if sorts or steps:
        torch.cuda.synchronize()
        sys.stderr.write(f"patchbay: PB_STABLE_LAUNCH: compiled the expert sort ({sorts} step sizes) and the "
                         f"attention ({steps} step shapes) in {time.perf_counter() - start:.1f} s\n")


def restore() -> None:
    """The keys that follow the step again (for in-process A/Bs and tests)."""
    global STABLE
    STABLE = False
