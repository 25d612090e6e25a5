"""PB_STEP_PREP: the asynchronous batching loop's host work for a step sized by the step.

Three pieces of upstream's per-step preparation cost the host time in proportion to the
largest possible step, or to more launches than the step needs:

- The host side of each asynchronous input/output pair keeps an attention mask buffer of
  max batch tokens x (cache + max batch tokens). Under PB_ASYNC_BATCHING the mask a step
  reads is built on the device (async_io.transfer_used), yet the host still filled its own
  buffer's region for the step before preparing it: for a cold 8K-token prompt that is a
  128 MiB memset, 3-6 ms of CPU before the GPU starts (W10's host-reset-timeline). With
  the knob on, the host side of every pair is marked from its creation as one whose masks
  are built on the device, so it never fills or builds its own.
- The carry-over ids (which of the previous step's new tokens become inputs of this one) were
  a Python list of max batch tokens entries made into a tensor every step (8,192 entries, about
  1 ms). With the knob on, the host tensor is set to -1 and only the carried positions are
  written: the same values.
- A decode step's mask (every sequence one query token) was built on the device by 0240's
  general builder, about 25 small tensor operations launched from the host (0.9 ms of CPU a
  step in W09's hooks). Such a step's mask is simpler: row i sees exactly the keys of
  sequence i. With the knob on it is built with six operations, to the same values.

None of them changes a value the GPU reads, so the bits are upstream's. Hooks: the pair's constructor, the carry-over ids of the async inputs, and 0240's
mask build.
"""

from .. import knobs


def on() -> bool:
    return bool(knobs.get("PB_STEP_PREP"))


def host_side(io) -> None:
    """Mark the host IO of an async pair: its masks are built on the device (0240)."""
    from . import async_io  # here, not at the top: async_io imports this module

    if on() and async_io.on():
        io._pb_mask_on_device = True


def carry_over(async_ios) -> bool:
    """Write this step's carry-over ids into the host tensor in place; False when the knob is
    off (upstream builds the whole list)."""
    if not on():
        return False
    pair, previous = async_ios.io_pairs[async_ios.current_pair], async_ios.io_pairs[1 - async_ios.current_pair]
    positions = pair.host_io.req_id_to_new_token_position
    carry = pair.host_io.carry_over_ids
    carry.fill_(-1)
    # the previous step's new tokens sit in its output in the order its requests were added
    carried = [(positions[req_id], i) for i, req_id in enumerate(previous.host_io.req_id_to_new_token_position)
               if req_id in positions]
    if carried:
        import torch

        rows, sources = zip(*carried)
        carry[list(rows)] = torch.tensor(sources, dtype=carry.dtype)
    return True


def decode_mask(host, region, cu_k, sliding_window: int) -> bool:
    """Build a decode step's mask region [.., Q, K] in place (row i: the keys of sequence i, from
    the cumulative key lengths cu_k; padding rows and columns masked), as 0240's general
    builder would; False where that builder applies (knob off, a step with a longer query, or a
    sliding window)."""
    if not on() or host.max_length_q != 1 or sliding_window > 1:
        return False
    import torch

    sequences = cu_k.numel() - 1
    region.fill_(torch.finfo(region.dtype).min)
    if sequences < 1:
        return True
    cols = torch.arange(region.shape[-1], device=region.device)
    allowed = (cols >= cu_k[:-1, None]) & (cols < cu_k[1:, None])
    region[..., :sequences, :].masked_fill_(allowed, 0)
    return True
