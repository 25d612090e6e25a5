"""What rank 0 sends the other tensor-parallel ranks, as plain data whose types are checked on arrival.

Two things cross from rank 0 to its followers: the generation and batching configs at the first
request (through the rendezvous store, which anyone who reaches its port can write), and each
step's new requests and cancellations (upstream broadcasts them with torch's
`broadcast_object_list`, which is pickle: a follower would run whatever the bytes say). Here both
are JSON with explicit fields, and a step's prompt token ids an int32 tensor beside it. A
follower decodes them into exactly the objects rank 0 holds or refuses them with a WireError
naming the field; it never unpickles. Rank 0 checks before sending that what it sends rebuilds
what it has (a field upstream adds later is refused there, not dropped).
"""

import array
import dataclasses
import json
import types
import typing

# Arguments of a new RequestState: all a follower needs to schedule it as rank 0 does.
REQUEST_FIELDS = ("request_id", "initial_tokens", "streaming", "record_timestamps", "max_new_tokens",
                  "eos_token_id", "num_children", "logit_processor_kwargs")
# Set by a new state for itself (the clock): not sent, not compared.
LOCAL_FIELDS = ("created_time",)
# 0800: what a request may draft (drafts.admit on rank 0, from its pb_knobs): [most, needs the
# batch's argmax], sent where set; a follower that lacked it would build other batches than rank 0
DRAFT_KEY = "pb_draft"
STEP_KEYS = ("new", "cancel")
CONFIG_KEYS = ("generation_config", "generation_compile_config", "cb_config")
MAX_HEADER_BYTES = 1 << 28  # bounds on the sizes read off the wire, checked before allocating for them
MAX_TOKENS = 1 << 28


class WireError(ValueError):
    """What came over the wire (or would go out) is not what this module sends; worded for the log."""


def _plain(value, where: str):
    """value as JSON data (tuples as lists), or WireError naming where it is not."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise WireError(f"{where} has keys that are not strings")
        return {k: _plain(v, f"{where}.{k}") for k, v in value.items()}
    raise WireError(f"{where} is a {type(value).__name__}, which is not plain data")


def _json(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _parse(data: bytes, what: str) -> dict:
    try:
        obj = json.loads(bytes(data).decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WireError(f"{what} is not JSON ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise WireError(f"{what} is a JSON {type(obj).__name__}, not an object")
    return obj


def _keys(obj: dict, expected, what: str) -> None:
    extra, missing = sorted(set(obj) - set(expected)), sorted(set(expected) - set(obj))
    if extra or missing:
        words = ([f"unexpected fields {extra}"] if extra else []) + ([f"missing fields {missing}"] if missing else [])
        raise WireError(f"{what}: {', '.join(words)}")


def _typed(value, hint, where: str):
    """value (decoded JSON) as an instance of the annotation hint, or WireError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _typed(value, arg, where)
            except WireError:
                pass
        raise WireError(f"{where}: {value!r:.80} is not {hint}")
    if hint is type(None) or hint is None:
        ok = value is None
    elif hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is str:
        ok = isinstance(value, str)
    elif hint is dict or origin is dict:
        ok = isinstance(value, dict)  # JSON already: string keys, plain values
    elif origin is list and isinstance(value, list):
        return [_typed(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)] if args else value
    elif origin is tuple and isinstance(value, list) and len(value) == len(args) and Ellipsis not in args:
        return tuple(_typed(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    elif dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return _dataclass(hint, value, where)
    else:
        ok = False  # Callable and anything else plain data cannot name
    if not ok:
        raise WireError(f"{where}: {value!r:.80} is not {getattr(hint, '__name__', hint)}")
    return value


def _dataclass_fields(obj, where: str) -> dict:
    """A dataclass instance as JSON data, field by field; refuses attributes that are not fields."""
    names = [f.name for f in dataclasses.fields(obj)]
    stray = sorted(set(vars(obj)) - set(names))
    if stray:
        raise WireError(f"{where} has attributes that are not fields: {stray}")
    out = {}
    for name in names:
        value = getattr(obj, name)
        out[name] = _dataclass_fields(value, f"{where}.{name}") if dataclasses.is_dataclass(value) else value
    return _plain(out, where)


def _dataclass(cls, obj: dict, where: str):
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    _keys(obj, fields, where)
    hints = typing.get_type_hints(cls)
    return cls(**{name: _typed(obj[name], hints[name], f"{where}.{name}") for name in fields})


# --- the configs, once, through the rendezvous store

def encode_configs(gen_config, cb_config) -> bytes:
    """Rank 0's GenerationConfig and ContinuousBatchingConfig (or None) as JSON; WireError if they
    would not rebuild the same on the other ranks."""
    gen = gen_config.to_dict()
    compile_config = gen.pop("compile_config", None)
    payload = {"generation_config": _plain(gen, "generation_config"),
               "generation_compile_config": None if compile_config is None
               else _dataclass_fields(compile_config, "generation_config.compile_config"),
               "cb_config": None if cb_config is None else _dataclass_fields(cb_config, "cb_config")}
    data = _json(payload)
    rebuilt_gen, rebuilt_cb = decode_configs(data)
    if _plain(_gen_dict(rebuilt_gen), "") != _plain(_gen_dict(gen_config), ""):
        raise WireError("the generation config would not rebuild the same on the other ranks")
    if (rebuilt_cb is None) != (cb_config is None) or (
            cb_config is not None and _dataclass_fields(rebuilt_cb, "") != _dataclass_fields(cb_config, "")):
        raise WireError("the continuous batching config would not rebuild the same on the other ranks")
    return data


def _gen_dict(gen_config) -> dict:
    d = gen_config.to_dict()
    if d.get("compile_config") is not None:
        d["compile_config"] = _dataclass_fields(d["compile_config"], "compile_config")
    return d


def decode_configs(data: bytes):
    """(GenerationConfig, ContinuousBatchingConfig or None) from encode_configs' bytes, or WireError."""
    from ...generation.configuration_utils import CompileConfig, ContinuousBatchingConfig, GenerationConfig

    what = "rank 0's configs from the rendezvous store"
    obj = _parse(data, what)
    _keys(obj, CONFIG_KEYS, what)
    gen, compile_config, cb = obj["generation_config"], obj["generation_compile_config"], obj["cb_config"]
    if not isinstance(gen, dict):
        raise WireError(f"{what}: generation_config is not an object")
    try:
        if compile_config is not None:
            gen = {**gen, "compile_config": _typed(compile_config, CompileConfig, "generation_compile_config")}
        cb_config = None if cb is None else _typed(cb, ContinuousBatchingConfig, "cb_config")
        gen_config = GenerationConfig.from_dict(gen)
    except WireError as e:
        raise WireError(f"{what}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the configs' own checks refused a value
        raise WireError(f"{what}: refused by the config ({type(e).__name__}: {e})") from None
    return gen_config, cb_config


# --- each step's new requests and cancellations, through the CB loop's gloo group

def encode_step(new_states, cancellations) -> tuple[bytes, array.array]:
    """(JSON header, every new request's prompt token ids in order as int32) for a step's payload."""
    from ...generation.continuous_batching.requests import RequestState

    requests, tokens = [], []
    for state in new_states:
        args = {name: getattr(state, name) for name in REQUEST_FIELDS}
        fresh = RequestState(**args)
        for f in dataclasses.fields(state):
            if f.name not in REQUEST_FIELDS + LOCAL_FIELDS and getattr(state, f.name) != getattr(fresh, f.name):
                raise WireError(f"request {state.request_id}: field {f.name} is {getattr(state, f.name)!r:.80}, "
                                "which the other ranks would not rebuild")
        entry = _plain({k: v for k, v in args.items() if k != "initial_tokens"}, f"request {state.request_id}")
        entry["tokens"] = len(state.initial_tokens)
        draft = state.__dict__.get("_pb_draft")
        if draft is not None:
            entry[DRAFT_KEY] = [int(draft[0]), bool(draft[1])]
        requests.append(entry)
        tokens.extend(state.initial_tokens)
    try:
        ids = array.array("i", tokens)  # C int: int32 here, as on every platform torch runs on
    except (OverflowError, TypeError) as e:
        raise WireError(f"a prompt token id is not an int32 ({e})") from None
    return _json({"new": requests, "cancel": _plain(list(cancellations), "cancellations")}), ids


def decode_step(header: bytes, tokens):
    """(new RequestStates, cancelled request ids) from encode_step's parts, or WireError."""
    from ...generation.continuous_batching.requests import RequestState

    tokens = tokens if isinstance(tokens, list) else list(tokens)

    what = "rank 0's step payload"
    obj = _parse(header, what)
    _keys(obj, STEP_KEYS, what)
    if not isinstance(obj["new"], list) or not isinstance(obj["cancel"], list):
        raise WireError(f"{what}: 'new' and 'cancel' must be lists")
    hints = typing.get_type_hints(RequestState)
    states, start = [], 0
    for i, entry in enumerate(obj["new"]):
        where = f"{what}: request {i}"
        if not isinstance(entry, dict):
            raise WireError(f"{where} is not an object")
        draft = entry.pop(DRAFT_KEY, None)
        _keys(entry, [k for k in REQUEST_FIELDS if k != "initial_tokens"] + ["tokens"], where)
        count = entry.pop("tokens")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= len(tokens) - start:
            raise WireError(f"{where}: tokens={count!r:.40} does not fit the {len(tokens)} token ids sent")
        args = {name: _typed(entry[name], hints[name], f"{where}.{name}") for name in entry}
        states.append(RequestState(initial_tokens=tokens[start:start + count], **args))
        if draft is not None:
            states[-1]._pb_draft = _draft(draft, f"{where}.{DRAFT_KEY}")
        start += count
    if start != len(tokens):
        raise WireError(f"{what}: {len(tokens) - start} token ids sent beyond the requests' own")
    cancellations = [_typed(v, str, f"{what}: cancel[{i}]") for i, v in enumerate(obj["cancel"])]
    return states, cancellations


def _draft(value, where: str) -> tuple[int, bool]:
    from .. import knobs

    most = knobs.registry()["PB_DRAFT_TOKENS"]["max"]  # the knob's own bound, from its patch header
    if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int) or isinstance(value[0], bool)
            or not 0 < value[0] <= most or not isinstance(value[1], bool)):
        raise WireError(f"{where} must be [drafts 1-{most}, true or false], not {value!r:.60}")
    return value[0], value[1]


def broadcast(helper, payload):
    """Upstream's `tp_broadcast_object_from_rank_0` for the step payload (new states, cancellations),
    without pickle: sizes, then the JSON header, then the token ids, from the TP driver on the
    helper's CPU group. The driver gets its own objects back; a follower gets them rebuilt."""
    if helper.is_tp_driver:
        try:
            header, tokens = encode_step(*payload)
        except WireError:
            send(helper, b"", array.array("i"))  # the followers stop on an empty payload instead of waiting for one
            raise
        send(helper, header, tokens)
        return payload
    return decode_step(*receive(helper))


def send(helper, header: bytes, tokens: array.array) -> None:
    import torch

    _bcast(helper, torch.tensor([len(header), len(tokens)], dtype=torch.int64))
    if header:
        _bcast(helper, torch.frombuffer(bytearray(header), dtype=torch.uint8))
    if tokens:
        _bcast(helper, torch.frombuffer(tokens, dtype=torch.int32))


def receive(helper) -> tuple[bytes, list[int]]:
    import torch

    sizes = torch.zeros(2, dtype=torch.int64)
    _bcast(helper, sizes)
    header_bytes, count = sizes.tolist()
    if header_bytes == 0:
        raise WireError("rank 0 sent an empty step payload: it could not encode its new requests (see its log)")
    if not 0 < header_bytes <= MAX_HEADER_BYTES or not 0 <= count < MAX_TOKENS:
        raise WireError(f"rank 0's step payload: sizes {header_bytes} bytes, {count} tokens are out of range")
    header = torch.empty(header_bytes, dtype=torch.uint8)
    _bcast(helper, header)
    tokens = torch.empty(count, dtype=torch.int32)
    if count:
        _bcast(helper, tokens)
        if int(tokens.min()) < 0:
            raise WireError("rank 0's step payload: a negative token id")
    return header.numpy().tobytes(), tokens.tolist()


def _bcast(helper, tensor) -> None:
    import torch.distributed as dist

    dist.broadcast(tensor, src=helper.tp_root_global_rank, group=helper.cpu_comm_group)
