"""Run by tests/test_decode_path.py in a fresh interpreter with the patched engine first on
PYTHONPATH and the PB_* variables the test sets: the decode-path hooks of 0230, 0240 and 0250
called through upstream's own functions, with the knob values of this process. Prints one
JSON line."""

import json
import sys
from types import SimpleNamespace

import torch
from transformers import AutoConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.initialization import (
    decide_use_async_batching,
    resolve_continuous_batching_config,
)
from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingIOs
from transformers.generation.continuous_batching.model_runner import ModelRunner


def padding() -> dict:
    """ModelRunner.maybe_pad_inputs, as upstream calls it, for a few varlen steps."""
    runner = SimpleNamespace(pad_inputs=True,
                             cache=SimpleNamespace(max_batch_tokens=4096, max_tokens_read=200_000),
                             cb_config=SimpleNamespace(q_padding_interval_size=64, kv_padding_interval_size=16384,
                                                       max_requests_per_batch=32))
    steps = [(1, 0), (1, 300), (3, 900), (32, 6000), (100, 0), (5000, 70_000), (1, 250_000)]
    return {f"{q},{kv}": list(ModelRunner.maybe_pad_inputs(runner, q, kv, False)) for q, kv in steps}


def io(q: int, kv: int, fill: float) -> SimpleNamespace:
    """The fields _transfer_inputs reads or writes, as CPU tensors (the GPU's are the same shapes)."""
    return SimpleNamespace(
        num_q_tokens=q, max_kv_read=kv, num_request_in_batch=1, true_read_sizes=[kv], true_write_sizes=[q],
        use_block_table=False, total_seqlen_q=q, total_seqlen_k={"full": q + kv}, max_length_q=q,
        max_length_k={"full": q + kv}, _bulk_input_tensor=torch.full((4, 16), fill),
        block_table=torch.full((1, 4), fill), write_index_storage=torch.full((1, 16), fill),
        read_index_storage=torch.full((1, 64), fill), attention_mask={"full": torch.full((1, 1, 16, 64), fill)})


def transfer() -> dict:
    host, device = io(4, 20, 1.0), io(0, 0, 0.0)
    ContinuousBatchingIOs._transfer_inputs(host, device, stream=None, non_blocking=False)
    mask = device.attention_mask["full"][0, 0]
    return {"bulk": device._bulk_input_tensor.sum().item(),
            "write_index": device.write_index_storage.sum().item(),
            "read_index": device.read_index_storage.sum().item(),
            "mask_rows": int((mask.sum(dim=1) > 0).sum()), "mask_cols": int((mask.sum(dim=0) > 0).sum())}


def async_choice(graphs: bool) -> bool | None:
    cfg = SimpleNamespace(use_async_batching=None, cuda_graph_booleans=(graphs, graphs))
    decide_use_async_batching(cfg, is_attn_mask_needed=True)
    return cfg.use_async_batching


def compile_levels(model_dir: str) -> list:
    """The compile level upstream resolves for a config that leaves it unset, and for one that sets 2."""
    config = AutoConfig.from_pretrained(model_dir)
    levels = []
    for asked in (0, 2):
        cb = ContinuousBatchingConfig(num_blocks=8, max_batch_tokens=64, default_compile_level=asked)
        resolved = resolve_continuous_batching_config(config, cb, None, False, torch.device("cpu"))
        mode = resolved.varlen_compile_config.mode if resolved.varlen_compile_config else None
        levels.append([resolved.default_compile_level, mode])
    return levels


print(json.dumps({"compile_levels": compile_levels(sys.argv[1]), "padding": padding(), "transfer": transfer(), "async_with_graphs": async_choice(True),
                  "async_without_graphs": async_choice(False), "switch_interval": sys.getswitchinterval()}))
