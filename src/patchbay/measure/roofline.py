"""The decode roofline of a glm4_moe model: HBM bandwidth over the weight bytes one step reads.

One decode step for C sequences reads every attention and dense weight once, the LM head once,
and in each MoE layer the shared experts plus every routed expert that at least one of the C
tokens chose. With uniform routing of k of E experts per token, the expected number of distinct
experts a layer reads is E * (1 - (1 - k/E) ** C). The embedding reads only C rows and is left out,
and so are the KV cache reads (under 2 % for air12 at C32 with 300-token contexts).
"""

from __future__ import annotations

HBM_BYTES_PER_S = 4.16e12  # measured on the H200 (DESIGN.md)


def step_params(config, concurrency: int) -> float:
    """Expected parameters one decode step reads for `concurrency` sequences."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads, kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if getattr(config, "attention_bias", False):
        attn += heads * hd + 2 * kv * hd
    dense_layers = config.first_k_dense_replace
    dense = dense_layers * 3 * h * config.intermediate_size
    experts, k = config.n_routed_experts, config.num_experts_per_tok
    expert = 3 * h * config.moe_intermediate_size
    distinct = experts * (1 - (1 - k / experts) ** concurrency)
    moe_layers = layers - dense_layers
    moe = moe_layers * ((distinct + config.n_shared_experts) * expert + h * experts)
    lm_head = config.vocab_size * h
    return layers * attn + dense + moe + lm_head


def tokens_per_s(config, concurrency: int, bytes_per_param: int = 2, bandwidth: float = HBM_BYTES_PER_S) -> float:
    """Aggregate decode tok/s at the roofline: C tokens per step, one step per weight read."""
    return concurrency * bandwidth / (step_params(config, concurrency) * bytes_per_param)
