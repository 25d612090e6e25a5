"""PB_FUSED_ROUTER: GLM-4.5's expert choice after the router's logits, as one Triton program a row.

Upstream's router turns the float32 logits into each token's experts and weights with a dozen
small kernels a layer: sigmoid, the score-correction bias, a top-2 and sum per group, a top-k
of groups, a mask built with zeros / scatter / expand / masked_fill, the top-k of experts, a
gather of their scores, a sum, a division and the scaling. At one token a step those launches
cost more than the work. Here one program a row computes

    s = sigmoid(logits);  choice = s + bias
    experts = the top_k of choice (picked largest first; on a tie the lower index)
    weights = s[experts] / (sum + 1e-20) * routed_scaling_factor   (the sum only with norm_topk_prob)

The logits stay upstream's (cuBLAS, float32; 0380's product when PB_INVARIANT_GEMM is on).
Only layouts where the group step keeps every expert are computed here (n_group 1, or
topk_group equal to n_group, as in GLM-4.5-Air); others, devices Triton cannot drive and more
experts than MAX_EXPERTS run upstream's forward. The experts come out ordered by score, where
upstream's unsorted top-k leaves them in its own order, so the experts' outputs are summed in
another order: the bits change, not the choice. With the knob on at model load, the router
class's forward is replaced (`at_load`), so no step reads the knob.
"""

import torch

from . import invariant_gemm
from .. import knobs
from .common import INTERPRET, Swap, kernels, pow2

MAX_EXPERTS = 1024


def _router_class():
    from ...models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    return Glm4MoeTopkRouter


SWAP = Swap(_router_class, "forward")


def on() -> bool:
    return bool(knobs.get("PB_FUSED_ROUTER"))


def fits(router, hidden_states: torch.Tensor) -> bool:
    """This router's choice is one the kernel computes, on a device it runs on."""
    groups_keep_all = router.num_group == 1 or router.topk_group >= router.num_group
    return ((hidden_states.is_cuda or INTERPRET) and groups_keep_all
            and 0 < router.top_k <= router.num_experts <= MAX_EXPERTS)


def forward(self, hidden_states: torch.Tensor):
    """Glm4MoeTopkRouter.forward with the choice fused: (logits, topk_weights, topk_indices)."""
    if not fits(self, hidden_states):
        return SWAP.upstream()(self, hidden_states)
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = invariant_gemm.router_logits(hidden_states, self.weight)  # 0380's product when on
    return router_logits, *select(self, router_logits)


def at_load() -> None:
    """The model-load hook: with the knob on, GLM-4.5's router class takes the fused forward."""
    if on():
        SWAP.install(forward, "PB_FUSED_ROUTER: GLM-4.5's expert choice runs as one Triton program a row")


def select(router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights float32 [tokens, top_k], topk_indices int64 [tokens, top_k]) for `logits`."""
    tokens, experts = logits.shape
    top_k = router.top_k
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    index = torch.empty((tokens, top_k), dtype=torch.int64, device=logits.device)
    if tokens == 0:
        return weights, index
    logits = logits.contiguous()
    bias = router.e_score_correction_bias.to(torch.float32).contiguous()
    kernels("fused_router").pb_router_select[(tokens,)](
        logits, bias, weights, index, experts, float(router.routed_scaling_factor), logits.stride(0),
        E=pow2(experts), K=top_k, KP=pow2(top_k), NORM=bool(router.norm_topk_prob))
    return weights, index


def restore() -> None:
    """Give the router class its own forward back (for in-process A/Bs and tests)."""
    SWAP.restore()
