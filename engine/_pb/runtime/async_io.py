"""PB_ASYNC_BATCHING: prepare the next batch on the host while the GPU runs this one, also
when the attention needs a mask.

Upstream overlaps the scheduler's host work with the GPU step (asynchronous batching, two
input/output pairs) only where no attention mask is needed: each step it copies every static
input buffer to the device in full, and the mask buffer is sized for the largest batch over
the whole cache (max batch tokens x cache tokens: gigabytes), so with sdpa the copy alone
would take tens of milliseconds a step. Here async batching is chosen wherever CUDA graphs
are, a step copies only the part of the indices its graph reads (the q padded query tokens,
q + kv padded keys), and the mask region the graph reads is built on the device from the
cumulative lengths the step already copied, so the host neither builds nor copies it (for
an 8K-token prompt that region is 8K x 8K).
"""

from . import causal_prefill, decode_graphs, step_prep
from .. import knobs


def on() -> bool:
    return bool(knobs.get("PB_ASYNC_BATCHING"))


def decide(cb_config) -> None:
    """Before upstream's choice: async wherever CUDA graphs are on (unless the config says)."""
    if on() and cb_config.use_async_batching is None and any(cb_config.cuda_graph_booleans):
        cb_config.use_async_batching = True


def transfer_used(host, device, non_blocking: bool) -> bool:
    """Copy the read/write indices of this step, the part its graph reads, and build its mask
    region on the device; False when upstream's whole-buffer copy applies (knob off, or the
    block-table path)."""
    if not on() or host.use_block_table:
        return False
    q, kv = host.num_q_tokens, host.max_kv_read
    device.write_index_storage[:, :q].copy_(host.write_index_storage[:, :q], non_blocking=non_blocking)
    if kv > 0:
        n = decode_graphs.copied(host, q + kv)  # 0930: a wide step's own indices, not its padded width
        device.read_index_storage[:, :n].copy_(host.read_index_storage[:, :n], non_blocking=non_blocking)
    if host.attention_mask is not None and device.attention_mask is not None:
        host._pb_mask_on_device = True  # from now on the host side skips building its own
        if causal_prefill.causal(host):  # 0270: this step reads no mask
            return True
        sequences = host.num_request_in_batch
        for layer_type, mask in device.attention_mask.items():
            window = getattr(host.config, "sliding_window", None) if layer_type == "sliding_attention" else 1
            if step_prep.decode_mask(host, mask[..., :q, : q + kv],
                                     device.cumulative_seqlens_k[layer_type][: sequences + 1], window or 1):
                continue  # 0350: a decode step's mask with fewer operations
            build_mask(mask[..., :q, : q + kv], device.cumulative_seqlens_q[: sequences + 1],
                       device.cumulative_seqlens_k[layer_type][: sequences + 1], window or 1)
    return True


def mask_on_device(io) -> bool:
    """Whether this host-side IO's masks are built on the device (it then builds none itself)."""
    return getattr(io, "_pb_mask_on_device", False)


def build_mask(region, cu_q, cu_k, sliding_window: int = 1) -> None:
    """Upstream's block-diagonal attention bias (utils.build_attention_mask), built in place in a
    [.., Q, K] region from the cumulative query and key lengths of the step's sequences, with
    tensor ops on the region's own device: 0 where a query token may attend, the dtype's min
    elsewhere (padding rows and columns included)."""
    import torch

    rows, cols = region.shape[-2], region.shape[-1]
    device = region.device
    cu_q, cu_k = cu_q.to(device=device, dtype=torch.int64), cu_k.to(device=device, dtype=torch.int64)
    sequences = cu_q.numel() - 1
    region.fill_(torch.finfo(region.dtype).min)
    if sequences < 1:
        return
    seqlen_q, seqlen_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    # upstream's causal diagonal: a chunk that continues cached keys sees them all
    diagonal = torch.where((seqlen_q >= 1) & (seqlen_q < seqlen_k), seqlen_k - seqlen_q + 1, 1)
    row_ids, col_ids = torch.arange(rows, device=device), torch.arange(cols, device=device)
    row_seq = torch.searchsorted(cu_q[1:], row_ids, right=True)
    col_seq = torch.searchsorted(cu_k[1:], col_ids, right=True)
    row_valid = row_seq < sequences
    row_seq_c, col_seq_c = row_seq.clamp(max=sequences - 1), col_seq.clamp(max=sequences - 1)
    local_row = row_ids - cu_q[row_seq_c]  # position within its sequence's queries
    local_col = col_ids - cu_k[col_seq_c]
    limit = local_row + diagonal[row_seq_c]  # keys before this local index are visible
    allowed = (row_seq[:, None] == col_seq[None, :]) & row_valid[:, None] & (local_col[None, :] < limit[:, None])
    if sliding_window > 1:
        floor = local_row + (seqlen_k - seqlen_q)[row_seq_c] - sliding_window  # keys at or before it are out
        allowed &= local_col[None, :] > floor[:, None]
    region.masked_fill_(allowed.view(*([1] * (region.dim() - 2)), rows, cols), 0)
