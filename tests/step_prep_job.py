"""Run by tests/test_step_prep.py in a fresh interpreter with the patched engine first on
PYTHONPATH and the PB_* variables the test sets: 0350's two hooks called through upstream's
own functions of the asynchronous inputs (the pairs need a GPU, so their fields are stand-in
namespaces holding real CPU tensors). Prints one JSON line."""

import json
import random
from types import SimpleNamespace

import torch
from transformers.generation.continuous_batching import input_outputs
from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingAsyncIOs, ContinuousBatchingIOs

TOKENS = 64  # max batch tokens of the stand-in pairs


def async_ios(previous: dict, current: dict) -> SimpleNamespace:
    """Two pairs: the previous step's positions of new tokens, and this step's."""
    def pair(positions):
        host = SimpleNamespace(req_id_to_new_token_position=positions,
                               carry_over_ids=torch.full((TOKENS,), 99, dtype=torch.int32),
                               prepare_batch_tensors=lambda *args: None)
        return SimpleNamespace(host_io=host)

    aio = SimpleNamespace(io_pairs=[pair(current), pair(previous)], current_pair=0, max_batch_tokens=TOKENS)
    def infer():  # upstream's list, counted
        aio.lists_built += 1
        return ContinuousBatchingAsyncIOs.infer_carry_over_ids(aio)

    aio.lists_built, aio.infer_carry_over_ids = 0, infer
    return aio


def carry_over_cases(count: int = 200) -> dict:
    """Random steps: which of the previous step's requests are in this one, and where. The host
    tensor after upstream's prepare_batch_tensors (hook included) against upstream's own list."""
    rng = random.Random(0)
    mismatches, carried, lists = [], 0, 0
    for case in range(count):
        ids = [f"r{i}" for i in range(rng.randint(0, 12))]
        previous = {r: p for p, r in enumerate(rng.sample(ids, rng.randint(0, len(ids))))}
        kept = rng.sample(ids, rng.randint(0, len(ids)))
        current = dict(zip(kept, sorted(rng.sample(range(TOKENS), len(kept)))))
        aio = async_ios(previous, current)
        expected = ContinuousBatchingAsyncIOs.infer_carry_over_ids(aio)
        ContinuousBatchingAsyncIOs.prepare_batch_tensors(aio, [], None, False, 0, 0, False)
        got = aio.io_pairs[0].host_io.carry_over_ids
        carried += int((expected >= 0).sum())
        lists += aio.lists_built
        if not torch.equal(got, expected):
            mismatches.append(case)
    return {"cases": count, "carried": carried, "lists_built": lists, "mismatches": mismatches}


def host_reset(q: int = 8) -> dict:
    """A pair built by upstream's constructor (its IOs recorded, not allocated), then upstream's
    reset of the host side for a step of q tokens: is the host's mask region filled?"""
    made = []

    class Recorded:
        _reset_read_and_write_indices = ContinuousBatchingIOs._reset_read_and_write_indices

        def __init__(self, **kwargs):
            made.append(self)
            self.device = kwargs["device"]

    real_ios, real_event = input_outputs.ContinuousBatchingIOs, input_outputs.torch.Event
    input_outputs.ContinuousBatchingIOs = Recorded
    input_outputs.torch.Event = lambda *args, **kwargs: None
    try:
        pair = input_outputs.HostDeviceIOPair(cache=None, config=None, continuous_batching_config=None,
                                              device=torch.device("cpu"), model_dtype=torch.float32,
                                              logit_processor=None)
    finally:
        input_outputs.ContinuousBatchingIOs, input_outputs.torch.Event = real_ios, real_event
    host = pair.host_io
    bulk = torch.ones((8, 2 * q), dtype=torch.int32)
    host.__dict__.update(
        num_q_tokens=q, max_kv_read=0, max_requests_per_batch=4, static_inputs=7, _bulk_input_tensor=bulk,
        logits_indices=bulk[3, :4], output_ids=torch.ones((1, 2 * q), dtype=torch.int32),
        cumulative_seqlens_k={"full_attention": bulk[4]}, max_length_k={}, total_seqlen_k={},
        attention_mask={"full_attention": torch.zeros((1, 1, 2 * q, 4 * q))}, model_dtype=torch.float32,
        use_block_table=False, block_table=torch.zeros((1, 4, 2)), write_index_storage=torch.zeros((1, 2 * q)),
        read_index_storage=torch.zeros((1, 4 * q)), cache=SimpleNamespace(cache_allocators={}))
    ContinuousBatchingIOs._reset_static_tensors(host)
    mask = host.attention_mask["full_attention"]
    return {"host_marked": bool(getattr(host, "_pb_mask_on_device", False)),
            "device_marked": bool(getattr(pair.device_io, "_pb_mask_on_device", False)),
            "mask_filled": int((mask != 0).sum()), "bulk_zeroed": int((bulk[:7, : q + 1] == 0).sum())}


def step_io(q: int, kv: int, cu_q: list, cu_k: list, dtype) -> SimpleNamespace:
    """The fields _transfer_inputs reads or writes for a step, as CPU tensors (the GPU's are the same)."""
    bulk = torch.zeros((7, 16), dtype=torch.int32)
    bulk[2, : len(cu_q)] = torch.tensor(cu_q, dtype=torch.int32)
    bulk[4, : len(cu_k)] = torch.tensor(cu_k, dtype=torch.int32)
    return SimpleNamespace(
        num_q_tokens=q, max_kv_read=kv, num_request_in_batch=len(cu_q) - 1, true_read_sizes=[kv],
        true_write_sizes=[q], use_block_table=False, total_seqlen_q=q, total_seqlen_k={"full_attention": q + kv},
        max_length_q=max(b - a for a, b in zip(cu_q, cu_q[1:])) if len(cu_q) > 1 else 0,
        max_length_k={"full_attention": q + kv}, _bulk_input_tensor=bulk, cumulative_seqlens_q=bulk[2],
        cumulative_seqlens_k={"full_attention": bulk[4]}, config=SimpleNamespace(sliding_window=None),
        block_table=torch.zeros((1, 4)), write_index_storage=torch.zeros((1, 16)),
        read_index_storage=torch.zeros((1, 256)), attention_mask={"full_attention": torch.zeros((1, 1, 16, 256), dtype=dtype)})


def step_masks(count: int = 200) -> dict:
    """Random steps, most of them decode steps (one query token a sequence, some rows and keys
    padded), some with a longer query: the mask region 0240's transfer leaves on the (here CPU)
    device against upstream's host-built mask."""
    from itertools import accumulate

    from transformers._pb.runtime import step_prep
    from transformers.generation.continuous_batching.utils import build_attention_mask

    real, short_path = step_prep.decode_mask, []

    def counted(*args):
        used = real(*args)
        short_path.append(used)
        return used

    step_prep.decode_mask = counted
    rng, mismatches, decode_steps = random.Random(1), [], 0
    for case in range(count):
        sequences = rng.randint(1, 6)
        queries = [1] * sequences if case % 4 else [rng.randint(1, 3) for _ in range(sequences)]
        decode_steps += max(queries) == 1
        keys = [qn + rng.randint(0, 30) for qn in queries]
        cu_q, cu_k = [0, *accumulate(queries)], [0, *accumulate(keys)]
        q = cu_q[-1] + rng.randint(0, 3)
        kv = max(cu_k[-1] - q, 0) + rng.randint(0, 8)
        dtype = (torch.float32, torch.bfloat16)[case % 2]
        host, device = step_io(q, kv, cu_q, cu_k, dtype), step_io(q, kv, [0], [0], dtype)
        expected = host.attention_mask["full_attention"]
        expected.fill_(torch.finfo(dtype).min)
        build_attention_mask(expected, cu_q, cu_k)
        ContinuousBatchingIOs._transfer_inputs(host, device, stream=None, non_blocking=False)
        region = device.attention_mask["full_attention"][..., :q, : q + kv]
        if not torch.equal(region, expected[..., :q, : q + kv]):
            mismatches.append(case)
    step_prep.decode_mask = real
    return {"cases": count, "decode_steps": decode_steps, "short_path": sum(short_path), "mismatches": mismatches}


print(json.dumps({"carry_over": carry_over_cases(), "host_reset": host_reset(), "masks": step_masks()}))
