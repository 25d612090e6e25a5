"""Run by tests/test_tp.py in a fresh interpreter with the patched engine first on PYTHONPATH
(and tests/tp_guard before it where the test watches for unpickling), PB_TENSOR_PARALLEL=1.

    tp_wire_job.py codec                  0200's encodings in one process: one JSON line
    tp_wire_job.py rank R PORT CASE       one of two gloo ranks joined through patchbay's store;
                                          rank 0 broadcasts CASE through upstream's DistributedHelper
                                          (a real TP mesh on the CPU), rank 1 receives it there

CASE `states` sends real RequestStates and a cancellation (rank 1 prints what it rebuilt);
the others have rank 0 write bytes of its own onto the wire: `pickle` (what upstream's
broadcast_object_list sends), `garbage`, `badtype` (a field of the wrong type), `sizes` (a
length no payload has).
"""

import array
import dataclasses
import json
import os
import pickle
import sys
from datetime import timedelta

from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers._pb.runtime import tp_net, tp_wire
from transformers.generation.configuration_utils import CompileConfig
from transformers.generation.continuous_batching.requests import RequestState


def states() -> list:
    return [RequestState(request_id="req_7", initial_tokens=list(range(3, 40)), max_new_tokens=9,
                         eos_token_id=[2, 5], streaming=True, logit_processor_kwargs={"temperature": 0.3, "top_k": 4}),
            RequestState(request_id="chatcmpl-x", initial_tokens=[11], max_new_tokens=None, eos_token_id=None,
                         num_children=1, record_timestamps=True)]


def states_drafting() -> list:
    """states(), the first with what 0800's admit notes on a request that may draft."""
    sent = states()
    sent[0]._pb_draft = (6, False)
    return sent


def fields(state) -> dict:
    """Every field of a state but its clock, as JSON data."""
    out = {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name != "created_time"}
    out["_status"], out["_eos_token_ids"] = int(out["_status"]), sorted(out["_eos_token_ids"])
    return json.loads(json.dumps(out, default=list))


def refusal(fn, *args) -> str:
    try:
        fn(*args)
    except tp_wire.WireError as e:
        return str(e)
    return "ACCEPTED"


def header(**changes) -> bytes:
    """A step header for the second of states(), with fields changed (None: removed)."""
    entry = {"request_id": "r", "streaming": False, "record_timestamps": False, "max_new_tokens": 4,
             "eos_token_id": 2, "num_children": 0, "logit_processor_kwargs": {}, "tokens": 1}
    for key, value in changes.items():
        if value is None:
            entry.pop(key)
        else:
            entry[key] = value
    return json.dumps({"new": [entry], "cancel": []}).encode()


def codec() -> dict:
    sent = states_drafting()
    head, ids = tp_wire.encode_step(sent, ["req_3"])
    got, cancelled = tp_wire.decode_step(head, list(ids))
    gen = GenerationConfig(max_new_tokens=77, temperature=0.7, do_sample=True, eos_token_id=[2, 5],
                           compile_config=CompileConfig(fullgraph=True))
    cb = ContinuousBatchingConfig(use_cuda_graph=(True, False), num_blocks=64,
                                  varlen_compile_config=CompileConfig(dynamic=True))
    gen2, cb2 = tp_wire.decode_configs(tp_wire.encode_configs(gen, cb))
    _, none_cb = tp_wire.decode_configs(tp_wire.encode_configs(gen, None))
    stale = states()
    stale[1].position_offset = 3
    lambda_backend = GenerationConfig(compile_config=CompileConfig(backend=lambda *a: None))
    good_configs = json.loads(tp_wire.encode_configs(gen, cb))
    return {
        "states_equal": [fields(a) == fields(b) for a, b in zip(sent, got)],
        "drafts": [list(getattr(state, "_pb_draft", ())) for state in got],
        "cancelled": cancelled,
        "header_is_json": isinstance(json.loads(head), dict),
        "gen_equal": gen2.to_dict() | {"compile_config": None} == gen.to_dict() | {"compile_config": None}
                     and gen2.compile_config == gen.compile_config,
        "cb_equal": dataclasses.asdict(cb2) == dataclasses.asdict(cb) and cb2.use_cuda_graph == (True, False),
        "none_cb": none_cb is None,
        "step_refusals": {
            "pickle": refusal(tp_wire.decode_step, pickle.dumps((sent, [])), []),
            "garbage": refusal(tp_wire.decode_step, b"\x00\xffnot json", []),
            "list": refusal(tp_wire.decode_step, b"[]", []),
            "extra field": refusal(tp_wire.decode_step, header(__reduce__="os.system"), [1]),
            "missing field": refusal(tp_wire.decode_step, header(streaming=None), [1]),
            "bad type": refusal(tp_wire.decode_step, header(max_new_tokens="5"), [1]),
            "bool for int": refusal(tp_wire.decode_step, header(num_children=True), [1]),
            "bad eos": refusal(tp_wire.decode_step, header(eos_token_id=["2"]), [1]),
            "request id": refusal(tp_wire.decode_step, header(request_id=5), [1]),
            "too few ids": refusal(tp_wire.decode_step, header(tokens=2), [1]),
            "too many ids": refusal(tp_wire.decode_step, header(), [1, 2]),
            "cancel": refusal(tp_wire.decode_step, json.dumps({"new": [], "cancel": [3]}).encode(), []),
            "draft too many": refusal(tp_wire.decode_step, header(pb_draft=[99, False]), [1]),
            "draft not a pair": refusal(tp_wire.decode_step, header(pb_draft={"most": 4}), [1]),
            "draft bool for int": refusal(tp_wire.decode_step, header(pb_draft=[True, True]), [1]),
        },
        "config_refusals": {
            "pickle": refusal(tp_wire.decode_configs, pickle.dumps((gen, cb))),
            "missing": refusal(tp_wire.decode_configs, json.dumps({"generation_config": {}}).encode()),
            "cb type": refusal(tp_wire.decode_configs, json.dumps(
                {**good_configs, "cb_config": {**good_configs["cb_config"], "page_size": "256"}}).encode()),
            "cb extra": refusal(tp_wire.decode_configs, json.dumps(
                {**good_configs, "cb_config": {**good_configs["cb_config"], "evil": 1}}).encode()),
            "gen value": refusal(tp_wire.decode_configs, json.dumps(
                {**good_configs, "generation_config": {"max_new_tokens": "many"}}).encode()),
        },
        "encode_refusals": {
            "stale state": refusal(tp_wire.encode_step, stale, []),
            "callable": refusal(tp_wire.encode_configs, lambda_backend, None),
            "big id": refusal(tp_wire.encode_step, [RequestState(request_id="r", initial_tokens=[1 << 40])], []),
        },
    }


def rank(r: int, port: int, case: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.generation.continuous_batching.distributed import DistributedHelper

    timeout = timedelta(seconds=30)
    store = tp_net.rendezvous_store(r, 2, "127.0.0.1", port, timeout)
    dist.init_process_group("gloo", store=store, rank=r, world_size=2, timeout=timeout)
    helper = DistributedHelper(init_device_mesh("cpu", (2,)), cpu_group_timeout=30)
    if r == 1:
        got, cancelled = helper.tp_broadcast_object_from_rank_0(([], []))
        print(json.dumps({"states": [fields(s) for s in got], "cancelled": cancelled}), flush=True)
        os._exit(0)
    if case == "states":
        sent = states()
        back = helper.tp_broadcast_object_from_rank_0((sent, ["req_3"]))
        print(json.dumps({"states": [fields(s) for s in sent], "same_objects": back[0] is sent}), flush=True)
        os._exit(0)
    raw = {"pickle": (pickle.dumps((states(), [])), array.array("i")),
           "garbage": (b"{\"new\": [", array.array("i")),
           "badtype": (header(max_new_tokens="9"), array.array("i", [1])),
           "sizes": None}[case]
    try:
        if raw is None:
            import torch

            tp_wire._bcast(helper, torch.tensor([1 << 40, 3], dtype=torch.int64))
        else:
            tp_wire.send(helper, *raw)
    except Exception:  # noqa: BLE001 - rank 1 may be gone before the last part
        pass
    print(json.dumps({"sent": case}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "codec":
        print(json.dumps(codec()))
    else:
        rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
