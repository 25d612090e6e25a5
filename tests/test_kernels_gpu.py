"""The Triton kernels of 0280 (router), 0290 (rotary), 0300 (RMSNorm), 0320 and 0330 (the grouped_mm
experts' combine and gate), 0370 (attention over each sequence's own keys), 0380 (GEMMs whose sums
do not depend on the row count), 0390 (0220's MoE kernels at every step size) and 0310's fused
projections, on an NVIDIA GPU against upstream's torch code on the same GPU, at GLM-4.5-Air's
shapes: one token (C1 decode), 32 tokens (C32 decode) and an 8K-token prefill, in bfloat16 as
served; and each inside a CUDA graph, as the batching engine replays them. Runs on the device
(`scripts/gpu-run.sh patched python3 -m pytest -m gpu tests/test_kernels_gpu.py`), never in CI; its
outcomes land in a results window.
"""

import pytest

from .moe_launches import block_rows

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

TOKENS = (1, 32, 8192)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, ROTARY = 4096, 96, 8, 128, 64  # GLM-4.5-Air's attention


def modeling():
    from transformers.models.glm4_moe import modeling_glm4_moe

    return modeling_glm4_moe


def rope_inputs(tokens: int):
    proj = torch.randn(1, tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device="cuda").bfloat16() * 3
    q = proj[..., : HEADS * HEAD_DIM].view(1, tokens, HEADS, HEAD_DIM).transpose(1, 2)
    k = proj[..., HEADS * HEAD_DIM: (HEADS + KV_HEADS) * HEAD_DIM].view(1, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
    pos = torch.arange(tokens, device="cuda")[None].float() + 100
    freqs = pos[..., None] / 1_000_000 ** (torch.arange(0, ROTARY, 2, device="cuda").float() / ROTARY)
    emb = torch.cat((freqs, freqs), dim=-1)
    return q, k, emb.cos().bfloat16(), emb.sin().bfloat16()


def in_graph(fn):
    """fn's outputs when captured in a CUDA graph and replayed (after a warm-up run)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    in_graph.last = graph  # for a test that replays it again over new inputs
    return out


@pytest.mark.parametrize("tokens", TOKENS)
def test_rotary_gives_upstreams_bits(tokens):
    from transformers._pb.ops import fused_rope

    torch.manual_seed(tokens)
    q, k, cos, sin = rope_inputs(tokens)
    # the knob is off here: the module's function is upstream's, and the fused one's fallback
    upstream = fused_rope.SWAP.upstream()
    ref = upstream(q, k, cos, sin)
    assert fused_rope.fits(q, k, cos, sin, 1)
    for got in (fused_rope.apply_rotary_pos_emb(q, k, cos, sin),
                in_graph(lambda: fused_rope.apply_rotary_pos_emb(q, k, cos, sin))):
        for a, b in zip(ref, got):
            assert torch.equal(a, b) and a.stride() == b.stride()


@pytest.mark.parametrize("tokens", TOKENS)
def test_rms_norm_stays_within_a_rounding_of_upstreams(tokens):
    from transformers._pb.ops import fused_norm

    Norm = modeling().Glm4MoeRMSNorm
    upstream = fused_norm.SWAP.upstream()
    torch.manual_seed(tokens)
    norm = Norm(HIDDEN, eps=1e-5).cuda().bfloat16()
    with torch.no_grad():
        norm.weight.normal_(1, 0.2)
        x = torch.randn(1, tokens, HIDDEN, device="cuda").bfloat16() * 3
        ref = upstream(norm, x)
        assert fused_norm.fits(norm, x)
        for got in (fused_norm.forward(norm, x), in_graph(lambda: fused_norm.forward(norm, x))):
            assert got.dtype == ref.dtype and got.shape == ref.shape
            differing = (got != ref).float().mean().item()
            rel = ((got.float() - ref.float()).abs() / ref.float().abs().clamp_min(1e-3)).max().item()
            # a normalised value one bf16 step off, then the weight's own rounding: at most two steps
            assert differing <= 0.01 and rel <= 2 ** -6, (differing, rel)


@pytest.mark.parametrize("tokens", TOKENS)
def test_router_picks_upstreams_experts(tokens):
    from transformers import Glm4MoeConfig
    from transformers._pb.ops import fused_router

    config = Glm4MoeConfig(hidden_size=HIDDEN, n_routed_experts=128, num_experts_per_tok=8, n_group=1,
                           topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0)
    router = modeling().Glm4MoeTopkRouter(config).cuda()
    torch.manual_seed(tokens)
    with torch.no_grad():
        router.weight.normal_(0, 0.02)
        router.e_score_correction_bias.normal_(0, 0.01)
        x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
        logits, ref_w, ref_i = fused_router.SWAP.upstream()(router, x)
        assert fused_router.fits(router, x)
        for w, i in (fused_router.select(router, logits), in_graph(lambda: fused_router.select(router, logits))):
            assert torch.equal(ref_i.sort(dim=1).values, i.sort(dim=1).values)
            ref_by_expert = torch.zeros(tokens, 128, device="cuda").scatter(1, ref_i, ref_w)
            got_by_expert = torch.zeros(tokens, 128, device="cuda").scatter(1, i, w)
            assert (ref_by_expert - got_by_expert).abs().max().item() < 1e-5


@pytest.mark.parametrize("tokens", TOKENS)
def test_fused_projections_stay_within_a_rounding_of_the_separate_ones(tokens):
    """0310: one GEMM for q/k/v (with biases) and one for gate/up give the separate GEMMs'
    outputs up to the last bits of the sums (cuBLAS may split the wider sum otherwise)."""
    from torch import nn

    from transformers._pb.ops import fused_proj

    torch.manual_seed(tokens)
    attn, mlp = nn.Module(), nn.Module()
    attn.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=True)
    attn.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=True)
    attn.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=True)
    mlp.gate_proj, mlp.up_proj = nn.Linear(HIDDEN, 1408, bias=False), nn.Linear(HIDDEN, 1408, bias=False)
    mlp.down_proj, mlp.act_fn = nn.Linear(1408, HIDDEN, bias=False), nn.SiLU()
    attn.cuda().bfloat16(), mlp.cuda().bfloat16()
    x = torch.randn(1, tokens, HIDDEN, device="cuda").bfloat16()
    shape = (1, tokens, -1, HEAD_DIM)
    with torch.no_grad():
        ref = [*fused_proj.qkv(attn, x, shape), fused_proj.mlp(mlp, x)]  # nothing fused yet: upstream's calls
        assert fused_proj._fuse(attn, fused_proj.QKV, "pb_qkv") and fused_proj._fuse(mlp, fused_proj.GATE_UP,
                                                                                     "pb_gate_up")
        for got in ([*fused_proj.qkv(attn, x, shape), fused_proj.mlp(mlp, x)],
                    in_graph(lambda: [*fused_proj.qkv(attn, x, shape), fused_proj.mlp(mlp, x)])):
            for a, b in zip(ref, got):
                assert a.shape == b.shape and a.dtype == b.dtype
                scale = a.float().abs().max().item()
                assert (a.float() - b.float()).abs().max().item() <= 2 ** -6 * scale, (tokens, a.shape)


@pytest.mark.parametrize("tokens", TOKENS)
def test_moe_combine_and_gate_give_the_grouped_mm_forwards_bits(tokens):
    """0320 and 0330: the grouped_mm experts forward of GLM-4.5-Air's shape with the combine kernel,
    the gate kernel and both gives the bits of upstream's own forward (routing weights in float32,
    as the router gives them, and in bf16)."""
    from transformers import Glm4MoeConfig
    from transformers._pb.ops import moe_combine, moe_gate
    from transformers.integrations.moe import grouped_mm_experts_forward

    config = Glm4MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=1408, n_routed_experts=128,
                           num_experts_per_tok=8)
    torch.manual_seed(tokens)
    experts = modeling().Glm4MoeExperts(config).cuda().bfloat16()
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.02)
        experts.down_proj.normal_(0, 0.02)
        x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
        index = torch.rand(tokens, 128, device="cuda").topk(8, dim=1).indices
        for weights in (torch.rand(tokens, 8, device="cuda"), torch.rand(tokens, 8, device="cuda").bfloat16()):
            for kernels in ((moe_combine,), (moe_gate,), (moe_combine, moe_gate)):
                moe_combine.restore(), moe_gate.restore()
                ref = grouped_mm_experts_forward(experts, x, index, weights)
                for module in kernels:
                    module.ENABLED = True
                try:
                    assert moe_combine.fits(x, weights, 8, x.dtype)
                    got = grouped_mm_experts_forward(experts, x, index, weights)
                    graphed = in_graph(lambda: grouped_mm_experts_forward(experts, x, index, weights))
                finally:
                    moe_combine.restore(), moe_gate.restore()
                for out in (got, graphed):
                    assert out.dtype == ref.dtype and out.shape == ref.shape
                    assert torch.equal(out, ref), ([m.__name__ for m in kernels], weights.dtype,
                                                   (out != ref).float().mean().item())


def test_moe_gate_gives_upstreams_bits_over_the_whole_bf16_range():
    """0330 alone: silu(gate) * up for every finite bf16 gate value against torch's kernels."""
    from transformers._pb.ops import moe_gate
    from transformers.integrations.moe import _default_apply_gate

    class Experts(torch.nn.Module):
        _apply_gate = _default_apply_gate

        def __init__(self):
            super().__init__()
            self.act_fn = torch.nn.SiLU()

    experts = Experts()
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    gate = every[torch.isfinite(every)]
    gate = gate[: gate.numel() // 256 * 256].view(-1, 256)
    up = torch.randn(gate.shape, device="cuda").bfloat16()
    x = torch.cat([gate, up], dim=1)  # rows of [gate | up], as the grouped GEMM writes them
    ref = experts._apply_gate(x)
    moe_gate.ENABLED = True
    try:
        assert moe_gate.fits(experts, x)
        got = moe_gate.apply_gate(experts, x)
    finally:
        moe_gate.restore()
    assert torch.equal(got, ref), (got != ref).float().mean().item()


def varlen_step(seqs, generator):
    """A step of (cached, new) token counts at air12's attention widths, bf16: query [1, H, Tq, D]
    (the model's transposed view), keys/values [1, KVH, Tk, D] laid out as the cache update returns
    them, and the cumulative lengths as int32 tensors on the GPU."""
    cu_q, cu_k = [0], [0]
    for past, new in seqs:
        cu_q.append(cu_q[-1] + new)
        cu_k.append(cu_k[-1] + past + new)
    q = torch.randn((1, cu_q[-1], HEADS, HEAD_DIM), generator=generator, device="cuda").bfloat16().transpose(1, 2)
    k = torch.randn((1, cu_k[-1], KV_HEADS, HEAD_DIM), generator=generator, device="cuda").bfloat16().transpose(1, 2)
    v = torch.randn((1, cu_k[-1], KV_HEADS, HEAD_DIM), generator=generator, device="cuda").bfloat16().transpose(1, 2)
    kwargs = {"cu_seq_lens_q": torch.tensor(cu_q, dtype=torch.int32, device="cuda"),
              "cu_seq_lens_k": torch.tensor(cu_k, dtype=torch.int32, device="cuda")}
    return q, k, v, cu_q, cu_k, kwargs


@pytest.mark.parametrize("fast,split", [(False, False), (True, False), (True, True)], ids=["0370", "0400", "0740"])
@pytest.mark.parametrize("seqs", [[(0, 8192)], [(8000, 1)] * 32, [(4000, 1)] * 7 + [(0, 3000)], [(300, 700), (0, 1)],
                                  [(32767, 1), (200, 1)], [(131071, 1)]])
def test_varlen_attention_stays_near_sdpa_and_gives_a_row_the_same_bits_alone(seqs, fast, split):
    """0370 (and with 0400's TMA loads and FMA softmax, and 0740's decode rows in parts) against
    upstream's masked sdpa (float32 reference of the same bf16 inputs), and the first sequence's
    rows alone against the same rows in the whole step."""
    from types import SimpleNamespace

    from transformers._pb.ops import varlen_attention
    from transformers.generation.continuous_batching.utils import build_attention_mask

    gen = torch.Generator(device="cuda").manual_seed(len(seqs))
    q, k, v, cu_q, cu_k, kwargs = varlen_step(seqs, gen)
    module = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)
    varlen_attention.ENABLED, varlen_attention.FAST, varlen_attention.SPLIT = True, fast, split
    try:
        if fast:  # the step's keys and values as the cache lays them out can be read through TMA
            assert varlen_attention._descriptors(k, v) is not None
        got = varlen_attention.forward(module, q, k, v, HEAD_DIM ** -0.5, kwargs)
        mask = torch.full((1, 1, q.shape[2], k.shape[2]), float("-inf"), device="cuda")
        build_attention_mask(mask, cu_q, cu_k)
        rep = HEADS // KV_HEADS
        want = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1), attn_mask=mask,
            scale=HEAD_DIM ** -0.5).transpose(1, 2)
        assert (got.float() - want).abs().max().item() < 2e-2
        first = seqs[0]
        q1, k1, v1 = q[:, :, : first[1]], k[:, :, : sum(first)], v[:, :, : sum(first)]
        alone = varlen_attention.forward(module, q1, k1, v1, HEAD_DIM ** -0.5, {
            "cu_seq_lens_q": torch.tensor([0, first[1]], dtype=torch.int32, device="cuda"),
            "cu_seq_lens_k": torch.tensor([0, sum(first)], dtype=torch.int32, device="cuda")})
        assert torch.equal(alone, got[:, : first[1]])
        assert torch.equal(in_graph(lambda: varlen_attention.forward(module, q, k, v, HEAD_DIM ** -0.5, kwargs)), got)
    finally:
        varlen_attention.restore()


def paged_index(seqs, gen, page: int = 256):
    """A step's read index over a paged cache: each sequence's keys in pages of `page` rows, the
    pages in shuffled order as the allocator hands them out (three pages more than used). Returns
    (index, the cache's rows)."""
    pages = [-(-(past + new) // page) for past, new in seqs]
    rows = torch.randperm(sum(pages) + 3, generator=gen, device="cuda")[: sum(pages)] * page
    index, taken = [], 0
    for (past, new), count in zip(seqs, pages):
        starts = rows[taken:taken + count]
        taken += count
        index.append((starts[:, None] + torch.arange(page, device="cuda")[None]).flatten()[: past + new])
    return torch.cat(index), (sum(pages) + 3) * page


def bf16_paged(seqs, k, v, gen):
    """The step's keys and values ([1, KV heads, tokens, dim]) written to bfloat16 caches
    [rows, KV heads, dim] at paged_index's rows: (read index, keys' cache, values' cache)."""
    index, total = paged_index(seqs, gen)
    cache_k = torch.zeros((total, KV_HEADS, HEAD_DIM), dtype=torch.bfloat16, device="cuda")
    cache_v = torch.zeros_like(cache_k)
    cache_k[index], cache_v[index] = k[0].transpose(0, 1), v[0].transpose(0, 1)
    return index, cache_k, cache_v


@pytest.mark.parametrize("fast,split", [(False, False), (True, False), (True, True)], ids=["0370", "0400", "0740"])
@pytest.mark.parametrize("seqs", [[(32767, 1), (200, 1)], [(8000, 1)] * 8 + [(300, 700)], [(1000, 3000), (0, 1)]])
def test_cache_read_gives_the_gathers_bits(seqs, fast, split):
    """0750: the step's keys read from a paged cache (pages of 256 rows in shuffled order, as the
    allocator hands them out) through the read index give the same bits as the same keys gathered
    into one tensor first (upstream's index_select), also replayed in a CUDA graph."""
    from transformers._pb.ops import varlen_attention

    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, cu_q, cu_k, kwargs = varlen_step(seqs, gen)
    index, cache_k, cache_v = bf16_paged(seqs, k, v, gen)
    gathered = [torch.index_select(c, 0, index).transpose(0, 1).unsqueeze(0) for c in (cache_k, cache_v)]
    paged = [c.transpose(0, 1).unsqueeze(0) for c in (cache_k, cache_v)]
    cu_q_t, cu_k_t = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    varlen_attention.ENABLED, varlen_attention.FAST, varlen_attention.SPLIT = True, fast, split
    try:
        want = varlen_attention._attend(q, *gathered, HEAD_DIM ** -0.5, cu_q_t, cu_k_t)
        got = varlen_attention._attend(q, *paged, HEAD_DIM ** -0.5, cu_q_t, cu_k_t, index)
        assert torch.equal(got, want)
        assert torch.equal(in_graph(lambda: varlen_attention._attend(q, *paged, HEAD_DIM ** -0.5, cu_q_t, cu_k_t,
                                                                     index)), want)
    finally:
        varlen_attention.restore()


@pytest.mark.parametrize("tokens", [1, 64, 2048])
def test_cache_write_puts_index_copys_bytes_in_the_rows(tokens):
    """0950 with 0750: a step's new keys and values (views of the attention's [1, KV heads, tokens,
    dim], as forward_from_cache passes them) written to shuffled cache rows in one launch: the bytes
    of upstream's two index_copy_ calls, eager and replayed in a CUDA graph."""
    from transformers._pb.ops import varlen_attention

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    key, value = (torch.randn((1, KV_HEADS, tokens, HEAD_DIM), generator=gen, device="cuda").bfloat16()
                  for _ in range(2))
    index = torch.randperm(4096, generator=gen, device="cuda")[:tokens]
    caches = [torch.randn((4096, KV_HEADS, HEAD_DIM), generator=gen, device="cuda").bfloat16() for _ in range(2)]
    want = [c.clone().index_copy_(0, index, x[0].transpose(0, 1)) for c, x in zip(caches, (key, value))]
    got = [c.clone() for c in caches]
    varlen_attention._write_both(*got, index, key[0].transpose(0, 1), value[0].transpose(0, 1))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    replayed = [c.clone() for c in caches]
    in_graph(lambda: varlen_attention._write_both(*replayed, index, key[0].transpose(0, 1), value[0].transpose(0, 1)))
    assert all(torch.equal(g, w) for g, w in zip(replayed, want))


@pytest.mark.parametrize("split", [False, True], ids=["0400", "0740"])
@pytest.mark.parametrize("seqs", [[(700, 1)] * 128, [(5, 20)] * 24 + [(900, 1)] * 40 + [(0, 300)],
                                  [(0, 8192)], [(3000, 1)] * 16 + [(2000, 2048)]])
def test_attn_grid_gives_the_same_bits(seqs, split):
    """0940: the step's attention with the launches sized to the step (the prompt kernel's programs
    taking the blocks in turn, a program a row and KV head merging the parts) against 0370 / 0740's
    launches, the keys read from shuffled pages (0750) and replayed in a CUDA graph: the same bits;
    with 0950's blocks counted in the prompt kernel as well.
    The second step has 27 query blocks and the sized grid 11 programs a head."""
    from transformers._pb.ops import varlen_attention

    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v, cu_q, cu_k, kwargs = varlen_step(seqs, gen)
    index, cache_k, cache_v = bf16_paged(seqs, k, v, gen)
    paged = [c.transpose(0, 1).unsqueeze(0) for c in (cache_k, cache_v)]
    cu_q_t, cu_k_t = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    outs = {}
    try:  # 0370's launches, 0940's, and each with 0950's blocks counted in the kernel
        for grid, fewer in ((False, False), (True, False), (False, True), (True, True)):
            varlen_attention.ENABLED, varlen_attention.FAST, varlen_attention.SPLIT = True, True, split
            varlen_attention.GRID, varlen_attention.FEWER = grid, fewer
            outs[grid, fewer] = varlen_attention._attend(q, *paged, HEAD_DIM ** -0.5, cu_q_t, cu_k_t, index)
            outs[grid, fewer, "graph"] = in_graph(lambda: varlen_attention._attend(q, *paged, HEAD_DIM ** -0.5, cu_q_t,
                                                                                   cu_k_t, index))
    finally:
        varlen_attention.restore()
    for key, out in outs.items():
        assert torch.equal(out, outs[False, False]), key


def fp8_paged(seqs, k, v, gen):
    """0830: keys and values [tokens, KV heads, dim] written to 8-bit caches (0830's rows, in the
    format kv_fp8.FORMAT names) at paged_index's rows: (read index, [(rows, scales)] for keys and
    values)."""
    from transformers._pb.ops import kv_fp8

    index, total = paged_index(seqs, gen)
    caches = []
    for _ in range(2):
        raw = torch.zeros(total * kv_fp8.row_bytes(KV_HEADS, HEAD_DIM), dtype=torch.uint8, device="cuda")
        caches.append(kv_fp8.views(raw, total, KV_HEADS, HEAD_DIM))
    kv_fp8.write_both(tuple(d for d, _ in caches), tuple(s for _, s in caches), index, k, v)
    return index, caches


@pytest.mark.parametrize("fmt", ["e4m3", "int8"])
def test_fp8_write_kernel_writes_the_torch_quantizations_bytes(fmt):
    """0830 (e4m3) and 0840 (int8): the one-launch write of keys and values gives the bytes of
    kv_fp8.quantize (power-of-two scales, round-to-nearest-even, saturation), over values of every
    magnitude and near every power of two, where a rounding carries into the exponent."""
    from transformers._pb.ops import kv_fp8

    kv_fp8.FORMAT = fmt
    gen = torch.Generator(device="cuda").manual_seed(9)
    tokens = 4096
    k = (torch.randn((tokens, KV_HEADS, HEAD_DIM), generator=gen, device="cuda")
         * torch.logspace(-6, 4, tokens, device="cuda")[:, None, None]).bfloat16()
    v = torch.randn((tokens, KV_HEADS, HEAD_DIM), generator=gen, device="cuda").bfloat16()
    v[::7, 3] = 0.0  # heads of zeros
    index = torch.randperm(tokens + 50, generator=gen, device="cuda")[:tokens]
    got, want = [], []
    for fused in (True, False):
        raws = [torch.zeros((tokens + 50) * kv_fp8.row_bytes(KV_HEADS, HEAD_DIM), dtype=torch.uint8, device="cuda")
                for _ in range(2)]
        views = [kv_fp8.views(r, tokens + 50, KV_HEADS, HEAD_DIM) for r in raws]
        if fused:
            kv_fp8.write_both(tuple(d for d, _ in views), tuple(s for _, s in views), index, k, v)
        else:
            for (d, sc), states in zip(views, (k, v)):
                kv_fp8.write(d, sc, index, states)
        (got if fused else want).append(torch.stack(raws))
    kv_fp8.restore()
    assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("fast,split,fmt", [(False, False, "e4m3"), (True, False, "e4m3"), (True, True, "e4m3"),
                                            (True, True, "int8")], ids=["0370", "0400", "0740", "0740-int8"])
@pytest.mark.parametrize("seqs", [[(32767, 1), (200, 1)], [(8000, 1)] * 8 + [(300, 700)], [(1000, 3000), (0, 1)]])
def test_fp8_cache_read_stays_near_the_dequantized_gather_and_gives_a_row_the_same_bits_alone(seqs, fast, split,
                                                                                             fmt):
    """0830: prompt rows (through 0830's gather) get the bits of the bf16 kernels over the cache
    gathered and dequantized (upstream's update with the knob); decode rows (8-bit rows read through
    the index, products in float16) stay near them; all stay near float32 sdpa over the
    dequantized keys and values; the first sequence's rows alone get the bits they get in the
    whole step, and a CUDA graph's replay the same. With 0840 the rows are int8, read by the same
    kernels."""
    from transformers._pb.ops import kv_fp8, varlen_attention
    from transformers.generation.continuous_batching.utils import build_attention_mask

    gen = torch.Generator(device="cuda").manual_seed(8)
    q, k, v, cu_q, cu_k, kwargs = varlen_step(seqs, gen)
    kv_fp8.FORMAT = fmt
    index, caches = fp8_paged(seqs, k[0].transpose(0, 1), v[0].transpose(0, 1), gen)
    paged = [d.view(kv_fp8.element()).transpose(0, 1).unsqueeze(0) for d, _ in caches]
    scales = tuple(s for _, s in caches)
    dequantized = [kv_fp8.read(d, s, index, torch.float32).transpose(0, 1).unsqueeze(0) for d, s in caches]
    gathered = [kv_fp8.read(d, s, index, torch.bfloat16).transpose(0, 1).unsqueeze(0) for d, s in caches]
    cu_q_t, cu_k_t = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    varlen_attention.ENABLED, varlen_attention.FAST, varlen_attention.SPLIT = True, fast, split
    try:
        if fast:
            assert varlen_attention._descriptors(*paged) is not None
        got = varlen_attention._attend(q, *paged, HEAD_DIM ** -0.5, cu_q_t, cu_k_t, index, scales=scales)
        reference = varlen_attention._attend(q, *gathered, HEAD_DIM ** -0.5, cu_q_t, cu_k_t)
        prompt = torch.zeros(q.shape[2], dtype=torch.bool, device="cuda")
        for a, b in zip(cu_q, cu_q[1:]):
            prompt[a:b] = b - a > 1
        assert torch.equal(got[:, prompt], reference[:, prompt])
        assert (got[:, ~prompt].float() - reference[:, ~prompt].float()).abs().max().item() < 2e-2
        mask = torch.full((1, 1, q.shape[2], k.shape[2]), float("-inf"), device="cuda")
        build_attention_mask(mask, cu_q, cu_k)
        rep = HEADS // KV_HEADS
        want = torch.nn.functional.scaled_dot_product_attention(
            q.float(), dequantized[0].repeat_interleave(rep, 1), dequantized[1].repeat_interleave(rep, 1),
            attn_mask=mask, scale=HEAD_DIM ** -0.5).transpose(1, 2)
        assert (got.float() - want).abs().max().item() < 2e-2
        first = seqs[0]
        alone = varlen_attention._attend(q[:, :, : first[1]], *paged, HEAD_DIM ** -0.5, cu_q_t[:2], cu_k_t[:2],
                                         index[: sum(first)], scales=scales)
        assert torch.equal(alone, got[:, : first[1]])
        assert torch.equal(in_graph(lambda: varlen_attention._attend(q, *paged, HEAD_DIM ** -0.5, cu_q_t, cu_k_t,
                                                                     index, scales=scales)), got)
    finally:
        varlen_attention.restore()
        kv_fp8.restore()


def test_stable_launch_sorts_with_0220s_bits_and_warms_every_key(monkeypatch):
    """0450: the expert sort at its fixed launch sizes gives the same rows and blocks as 0220's
    launch for every token count the one-program sort takes, and the load hook runs the sort for
    each of them and the attention for 1, 2 and 16 sequences."""
    from types import SimpleNamespace

    from transformers._pb.ops import fused_moe, stable_launch, varlen_attention

    gen = torch.Generator().manual_seed(0)
    try:
        for tokens in range(1, fused_moe.ALIGN_MAX_PAIRS // 8 + 1):
            index = torch.stack([torch.randperm(128, generator=gen)[:8] for _ in range(tokens)]).cuda()
            stable_launch.STABLE = False
            want = fused_moe.align(index, 128)
            stable_launch.STABLE = True
            got = fused_moe.align(index, 128)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), tokens
        config = SimpleNamespace(num_experts_per_tok=8, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                 head_dim=HEAD_DIM, hidden_size=HIDDEN)
        config.get_text_config = lambda: config  # as transformers' configs answer
        experts = SimpleNamespace(num_experts=128, gate_up_proj=torch.empty(1, device="cuda"))
        weight = torch.empty(1, device="cuda", dtype=torch.bfloat16)
        model = SimpleNamespace(config=config, modules=lambda: [experts], parameters=lambda: iter([weight]))
        monkeypatch.setattr(fused_moe, "on", lambda: True)
        assert stable_launch.warm_align(model) == fused_moe.ALIGN_MAX_PAIRS // 8
        varlen_attention.ENABLED = stable_launch.STABLE = True
        assert stable_launch.warm_attention(model) == len(stable_launch.ATTENTION_WARM_SEQUENCES)
        torch.cuda.synchronize()
    finally:
        stable_launch.restore()
        varlen_attention.restore()


@pytest.mark.parametrize("tokens", [33, 64, 100, 128, 256, 512])
def test_the_sort_of_many_pairs_gives_the_torch_ops_rows(tokens):
    """0220's sort of 257-4,096 pairs, two launches of a program a chunk, gives torch's rows and
    blocks, in a CUDA graph too; masked pairs are left out."""
    from transformers._pb.ops import fused_moe

    gen = torch.Generator().manual_seed(tokens)
    index = torch.stack([torch.randperm(128, generator=gen)[:8] for _ in range(tokens)]).cuda()
    index[1, 0], index[2, 1] = 128, -1
    want = fused_moe.align_torch(index, 128)
    assert all(torch.equal(a, b) for a, b in zip(fused_moe.align(index, 128), want))
    assert all(torch.equal(a, b) for a, b in zip(in_graph(lambda: fused_moe.align(index, 128)), want))


# air12's dense products at TP=1: (out features, in features, bias, dtype)
GEMMS = {"qkv fused": (14336, 4096, True, torch.bfloat16), "o_proj": (4096, 12288, False, torch.bfloat16),
         "shared gate/up": (2816, 4096, False, torch.bfloat16), "shared down": (4096, 1408, False, torch.bfloat16),
         "dense gate/up": (21888, 4096, False, torch.bfloat16), "dense down": (4096, 10944, False, torch.bfloat16),
         "router logits": (128, 4096, False, torch.float32)}


@pytest.mark.parametrize("tma", [False, True], ids=["0380", "0410"])
@pytest.mark.parametrize("name", list(GEMMS))
def test_invariant_gemm_stays_near_cublas_and_gives_a_row_the_same_bits_among_any_rows(name, tma):
    """0380 against cuBLAS (F.linear) on the same inputs, and the first row's bits among 1 ... 8192
    rows, on both of its paths (chunks as programs, chunks in one program; with 0410 the latter
    reads through TMA) and inside a CUDA graph; with the knob's registration, nn.Linear takes the
    kernel and restore gives cuBLAS back."""
    import torch.nn.functional as F

    from transformers._pb.ops import invariant_gemm

    n, k, has_bias, dtype = GEMMS[name]
    gen = torch.Generator(device="cuda").manual_seed(n)
    w = (torch.randn((n, k), generator=gen, device="cuda") * 0.02).to(dtype)
    bias = (torch.randn((n,), generator=gen, device="cuda") * 0.02).to(dtype) if has_bias else None
    x = torch.randn((8192, k), generator=gen, device="cuda").to(dtype)
    alone = invariant_gemm.gemm(x[:1], w.t(), bias)
    invariant_gemm.TMA = tma
    try:
        if tma and dtype != torch.float32:  # a prompt's rows and the weight as nn.Linear lays them out
            assert invariant_gemm._descriptors(x, w.t(), invariant_gemm.tma_tiles(8192, n, False)) is not None
        for rows in (1, 2, 31, 64, 65, 300, 8192):
            got = invariant_gemm.gemm(x[:rows], w.t(), bias)
            want = F.linear(x[:rows], w, bias)
            scale = want.float().abs().max().item()
            assert (got.float() - want.float()).abs().max().item() <= 2e-2 * scale, rows
            assert torch.equal(got[0], alone[0]), rows
    finally:
        invariant_gemm.TMA = False
    assert torch.equal(in_graph(lambda: invariant_gemm.gemm(x[:32], w.t(), bias))[0], alone[0])
    linear = torch.nn.Linear(k, n, bias=has_bias, device="cuda", dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(w)
        if has_bias:
            linear.bias.copy_(bias)
        cublas = linear(x[:40])
        knob, invariant_gemm.on = invariant_gemm.on, lambda: True
        try:
            invariant_gemm.at_load()
            assert torch.equal(linear(x[:40])[0], alone[0])
        finally:
            invariant_gemm.restore()
            invariant_gemm.on = knob
        assert torch.equal(linear(x[:40]), cublas)


@pytest.mark.parametrize("tma", [False, True], ids=["0380", "0410"])
def test_invariant_router_logits_from_bfloat16_stay_near_float32_and_give_a_row_the_same_bits(tma):
    """0380's router logits (air12's router: 128 experts, 4,096 wide) from the bfloat16 operands
    with float32 sums, against cuBLAS's float32 product, and the first row among 1 ... 8192 rows
    (with 0410, the prompt-sized steps' operands read through TMA)."""
    import torch.nn.functional as F

    from transformers._pb.ops import invariant_gemm

    gen = torch.Generator(device="cuda").manual_seed(7)
    w = (torch.randn((128, 4096), generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    x = torch.randn((8192, 4096), generator=gen, device="cuda").to(torch.bfloat16)
    want = F.linear(x.float(), w.float())  # cuBLAS, before the registration takes torch's mm
    knob, invariant_gemm.on = invariant_gemm.on, lambda: True
    invariant_gemm.at_load()
    invariant_gemm.TMA = tma
    try:
        alone = invariant_gemm.router_logits(x[:1], w)
        for rows in (1, 2, 16, 65, 300, 8192):
            got = invariant_gemm.router_logits(x[:rows], w)
            assert got.dtype == torch.float32
            assert (got - want[:rows]).abs().max().item() < 1e-4, rows
            assert torch.equal(got[0], alone[0]), rows
        assert torch.equal(in_graph(lambda: invariant_gemm.router_logits(x[:8], w))[0], alone[0])
    finally:
        invariant_gemm.restore()
        invariant_gemm.on = knob


def air_experts(tokens: int):
    """GLM-4.5-Air's experts (128 of hidden HIDDEN and width 1,408, 8 a token) in bf16 with seeded
    weights, and `tokens` rows of input, routing and routing weights."""
    from transformers import Glm4MoeConfig

    config = Glm4MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=1408, n_routed_experts=128,
                           num_experts_per_tok=8)
    torch.manual_seed(0)
    experts = modeling().Glm4MoeExperts(config).cuda().bfloat16()
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.02)
        experts.down_proj.normal_(0, 0.02)
        x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
        index = torch.rand(tokens, 128, device="cuda").topk(8, dim=1).indices
        weights = torch.rand(tokens, 8, device="cuda")
    return experts, x, index, weights


@pytest.mark.parametrize("tma", [False, True], ids=["0390", "0430"])
def test_moe_one_path_gives_a_token_the_same_bits_in_steps_of_every_size(tma):
    """0390: 0220's kernels at GLM-4.5-Air's expert shapes for steps of 1 to 8,192 tokens, the first
    token's bits the same as alone (and inside a CUDA graph at a decode size), near grouped_mm; with
    0430 the large steps read the weights through TMA."""
    from transformers._pb.ops import fused_moe, moe_one_path
    from transformers.integrations.moe import grouped_mm_experts_forward

    experts, x, index, weights = air_experts(8192)
    with torch.no_grad():
        moe_one_path.ENABLED, moe_one_path.TMA = True, tma
        try:
            if tma:  # the experts' weights as the model holds them can be read through TMA
                assert moe_one_path.weight_descriptors(experts.gate_up_proj, experts.down_proj, (128, 64),
                                                       (256, 64)) is not None
            alone = fused_moe.experts_forward(experts, x[:1], index[:1], weights[:1])
            for tokens in (2, 32, 64, 65, 512, 8192):
                got = fused_moe.experts_forward(experts, x[:tokens], index[:tokens], weights[:tokens])
                assert torch.equal(got[0], alone[0]), tokens
                ref = grouped_mm_experts_forward(experts, x[:tokens], index[:tokens], weights[:tokens])
                assert (got.float() - ref.float()).abs().max().item() <= 2e-2 * ref.float().abs().max().item()
            graphed = in_graph(lambda: fused_moe.experts_forward(experts, x[:32], index[:32], weights[:32]))
            assert torch.equal(graphed[0], alone[0])
        finally:
            moe_one_path.restore()


def test_0910_decode_launch_gives_the_large_launchs_bits_to_every_row():
    """0910 PB_MOE_DECODE_ROWS: steps of 128 and 256 tokens at GLM-4.5-Air's expert shapes (8 and 16
    rows an expert) run in 16-row blocks with the knob at 16 and in 128-row blocks without it, and
    every row gets the same bits both ways; the first token its bits alone; 257 tokens are wide."""
    from transformers._pb.ops import fused_moe, moe_one_path

    experts, x, index, weights = air_experts(257)
    with torch.no_grad(), block_rows(fused_moe) as launches:
        moe_one_path.ENABLED = True
        try:
            alone = fused_moe.experts_forward(experts, x[:1], index[:1], weights[:1])
            for tokens in (128, 256, 257):
                moe_one_path.DECODE_ROWS = 0
                large = fused_moe.experts_forward(experts, x[:tokens], index[:tokens], weights[:tokens])
                moe_one_path.DECODE_ROWS = 16
                rows = fused_moe.experts_forward(experts, x[:tokens], index[:tokens], weights[:tokens])
                assert torch.equal(rows, large) and torch.equal(rows[0], alone[0]), tokens
            graphed = in_graph(lambda: fused_moe.experts_forward(experts, x[:128], index[:128], weights[:128]))
            assert torch.equal(graphed, rows[:128])
        finally:
            moe_one_path.restore()
    assert launches[:7] == [16, 128, 16, 128, 16, 128, 128], launches


def test_moe_one_path_runs_float32_experts_at_every_step_size():
    """A float32 checkpoint (synthetic:trained as CPU serving writes it) through 0220/0390's kernels:
    the large steps' tiles fit a Hopper's shared memory in float32 too (W54: every prompt step
    failed), a token's bits the same as alone, near grouped_mm."""
    from transformers import Glm4MoeConfig
    from transformers._pb.ops import fused_moe, moe_one_path
    from transformers.integrations.moe import grouped_mm_experts_forward

    config = Glm4MoeConfig(hidden_size=256, moe_intermediate_size=256, n_routed_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    experts = modeling().Glm4MoeExperts(config).cuda().float()
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.05)
        experts.down_proj.normal_(0, 0.05)
        x = torch.randn(2048, 256, device="cuda")
        index = torch.rand(2048, 4, device="cuda").topk(2, dim=1).indices
        weights = torch.rand(2048, 2, device="cuda")
        moe_one_path.ENABLED = True
        try:
            alone = fused_moe.experts_forward(experts, x[:1], index[:1], weights[:1])
            for tokens in (8, 256, 688, 2048):
                got = fused_moe.experts_forward(experts, x[:tokens], index[:tokens], weights[:tokens])
                assert torch.equal(got[0], alone[0]), tokens
                ref = grouped_mm_experts_forward(experts, x[:tokens], index[:tokens], weights[:tokens])
                assert (got - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
        finally:
            moe_one_path.restore()


@pytest.fixture(params=[False, True], ids=["0810", "0960"])
def step_scale(request):
    """0810's float8 kernels as they expand the weight, and with 0960's step scales."""
    from transformers._pb.ops import common

    common.FP8_STEP_SCALE = request.param
    yield request.param
    common.FP8_STEP_SCALE = False


@pytest.mark.parametrize("name", ["k_proj", "o_proj", "dense down", "q_proj"])
def test_fp8_gemm_gives_a_row_the_same_bits_among_any_rows(name, step_scale):
    """0810: the float8 GEMM with 128 x 128 block scales (Air's k_proj, o_proj and the dense MLP's
    down, 85.5 blocks deep, in chunks; q_proj, wide enough for one chunk) gives a row the same bits
    among 1 ... 8192 rows and inside a CUDA graph, near the product with the dequantized twin (not
    its bits: the transposed tiles sum in another order); with 0960's step scales as well."""
    from transformers._pb.ops import invariant_gemm

    from patchbay.device.gpu_fp8 import DENSE, fp8_scales
    from patchbay.runtime import fp8

    n, k = DENSE[name]
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    q, grid = fp8.quantize((torch.randn((n, k), generator=gen, device="cuda") * 0.02).bfloat16())
    twin = fp8.dequantize(q, grid, torch.bfloat16)
    scales = fp8_scales(grid, n, fp8.BLOCK, "cuda")
    x = torch.randn((8192, k), generator=gen, device="cuda").bfloat16()
    alone = invariant_gemm.gemm_fp8(x[:1], q, *scales)
    for rows in (1, 2, 31, 64, 65, 300, 8192):
        got = invariant_gemm.gemm_fp8(x[:rows], q, *scales)
        want = invariant_gemm.gemm(x[:rows], twin.t()).float()
        assert (got.float() - want).abs().max().item() <= 2e-2 * want.abs().max().item(), rows
        assert torch.equal(got[0], alone[0]), rows
    assert torch.equal(in_graph(lambda: invariant_gemm.gemm_fp8(x[:32], q, *scales))[0], alone[0])


def test_last_sum_gives_the_second_launchs_bits_eager_and_in_graph_replays():
    """0950: every chunked product of Air's layer (0380 in bfloat16, the router's float32 logits,
    0810 in float8) at 1-256 rows gives the bits of the parts added by a second launch when each
    tile's last program adds them, run three times in a row and replayed from a CUDA graph over
    new inputs (the tiles' counters back at zero after each launch)."""
    from transformers._pb.ops import invariant_gemm

    from patchbay.device.gpu_fp8 import DENSE, fp8_scales
    from patchbay.runtime import fp8

    cases = []
    for name, (n, k, has_bias, dtype) in GEMMS.items():
        gen = torch.Generator(device="cuda").manual_seed(n)
        w = (torch.randn((n, k), generator=gen, device="cuda") * 0.02).to(dtype)
        bias = (torch.randn((n,), generator=gen, device="cuda") * 0.02).to(dtype) if has_bias else None
        cases.append((name, k, dtype, lambda x, w=w, bias=bias: invariant_gemm.gemm(x, w.t(), bias)))
    for name in ("k_proj", "o_proj", "dense down"):
        n, k = DENSE[name]
        gen = torch.Generator(device="cuda").manual_seed(n + k)
        q, grid = fp8.quantize((torch.randn((n, k), generator=gen, device="cuda") * 0.02).bfloat16())
        scales = fp8_scales(grid, n, fp8.BLOCK, "cuda")
        cases.append((f"fp8 {name}", k, torch.bfloat16,
                      lambda x, q=q, scales=scales: invariant_gemm.gemm_fp8(x, q, *scales)))
    try:
        for name, k, dtype, run in cases:
            gen = torch.Generator(device="cuda").manual_seed(k)
            for rows in (1, 8, 64, 128, 256):
                xs = [torch.randn((rows, k), generator=gen, device="cuda").to(dtype) for _ in range(3)]
                invariant_gemm.LAST_SUM = False
                want = [run(x) for x in xs]
                invariant_gemm.LAST_SUM = True
                for _ in range(3):
                    assert torch.equal(run(xs[0]), want[0]), (name, rows)
                static = xs[0].clone()
                out = in_graph(lambda: run(static))
                for x, expected in zip(xs[1:] + xs[:1], want[1:] + want[:1]):
                    static.copy_(x)
                    in_graph.last.replay()
                    torch.cuda.synchronize()
                    assert torch.equal(out, expected), (name, rows)
    finally:
        invariant_gemm.LAST_SUM = False
    assert all(int(c.abs().sum()) == 0 for c in invariant_gemm._counters.values())


def test_fp8_experts_give_a_token_the_same_bits_in_steps_of_every_size(step_scale):
    """0810: 0220's kernels on Air's routed experts in float8 give a token the same bits in steps of
    1 to 8,192 tokens (0390's large-step path included) and inside a CUDA graph, near the twin;
    with 0960's step scales as well."""
    from transformers._pb.ops import fused_moe, moe_one_path

    from patchbay.device.gpu_fp8 import _experts
    from patchbay.runtime.synth import air12_config

    module, quantized, twin = _experts(air12_config())
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(8192, HIDDEN, generator=gen, device="cuda").bfloat16()
    index = torch.rand(8192, 128, generator=gen, device="cuda").topk(8, dim=1).indices
    weights = torch.rand(8192, 8, generator=gen, device="cuda")
    moe_one_path.ENABLED = True
    try:
        with torch.no_grad():
            alone = fused_moe.experts_forward(quantized, x[:1], index[:1], weights[:1])
            for tokens in (1, 2, 32, 64, 65, 512, 8192):
                got = fused_moe.experts_forward(quantized, x[:tokens], index[:tokens], weights[:tokens])
                want = fused_moe.experts_forward(twin, x[:tokens], index[:tokens], weights[:tokens]).float()
                assert (got.float() - want).abs().max().item() <= 2e-2 * want.abs().max().item(), tokens
                assert torch.equal(got[0], alone[0]), tokens
            graphed = in_graph(lambda: fused_moe.experts_forward(quantized, x[:32], index[:32], weights[:32]))
            assert torch.equal(graphed[0], alone[0])
    finally:
        moe_one_path.restore()
