"""PB_TENSOR_PARALLEL: `transformers serve` as one rank of a tensor-parallel group.

Every rank is started with the standard torch.distributed environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, optionally LOCAL_RANK) and the same command line. Each joins the
process group (gloo on CPU, nccl on CUDA) and loads the model with the engine's own TP plan
(`DistributedConfig`).
Rank 0 serves HTTP. A rank > 0 opens no port: it waits for rank 0's first request, builds
the continuous-batching manager with the same generation and batching configs (upstream's
CB ties those to the first request), and follows rank 0's batches through upstream's own
TP driver (`DistributedHelper`: rank 0 broadcasts new requests, through tp_wire here, and every
rank runs the same scheduler).

A server reachable by others: rank 0's rendezvous store listens on MASTER_ADDR alone (torch's
`env://` store listens on every interface), gloo and nccl default to the interface that reaches
MASTER_ADDR (an operator's GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME wins), and nothing a rank
reads from another is unpickled: the configs and each step's new requests travel as checked
plain data.

A dead peer never leaves a hung server: every rank runs a heartbeat, an all-reduce on a
dedicated gloo group with a short timeout. A killed peer fails it at once (its sockets
close), a hung or unreachable one after HEARTBEAT_TIMEOUT_S. Rank 0 then answers 503 on
every route (health included) and fails the requests in flight; a follower exits.
"""

import os
import sys
import threading
import time
from datetime import timedelta

from .. import knobs
from . import tp_net, tp_wire

REQUIRED_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 3.0
JOIN_TIMEOUT_S = 1800  # loading a large checkpoint on every rank may take a while
_CB_INIT_KEY = "pb/tp/cb-init"
# NVLink multicast (NVLS / symmetric memory) stays off on every rank; the launcher sets these
# too, and an operator's own value wins.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            # upstream CB asks for this before the group exists (it lets NCCL ops mix with CUDA graphs)
            "NCCL_GRAPH_MIXING_SUPPORT": "0"}
# The model dimensions a TP plan splits across ranks.
SPLIT_DIMS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "moe_intermediate_size")


class _State:
    rank = 0
    world_size = 1
    peer_lost: str | None = None
    cb_manager = None
    lock = threading.Lock()


state = _State()


def enabled() -> bool:
    return bool(knobs.get("PB_TENSOR_PARALLEL"))


def _refuse(message: str):
    sys.stderr.write(f"patchbay: refusing to start: PB_TENSOR_PARALLEL=1: {message}\n")
    raise SystemExit(2)


def read_env(environ=None) -> tuple[int, int, int]:
    """(rank, world size, local rank) from the standard variables, or one line naming the fix."""
    environ = os.environ if environ is None else environ
    missing = [k for k in REQUIRED_ENV if not environ.get(k)]
    if missing:
        _refuse(f"{', '.join(missing)} missing from the environment (each rank needs {', '.join(REQUIRED_ENV)}; "
                "LOCAL_RANK is optional)")
    values = {}
    for key in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK"):
        raw = environ.get(key, "0")
        if not raw.isdigit():
            _refuse(f"{key}={raw} is not a non-negative integer")
        values[key] = int(raw)
    rank, world_size = values["RANK"], values["WORLD_SIZE"]
    if world_size < 2:
        _refuse(f"WORLD_SIZE={world_size} must be at least 2 (unset the knob to serve on one rank)")
    if rank >= world_size:
        _refuse(f"RANK={rank} must be below WORLD_SIZE={world_size}")
    if not 1 <= values["MASTER_PORT"] <= 65535:
        _refuse(f"MASTER_PORT={values['MASTER_PORT']} is out of range (allowed: 1-65535)")
    return rank, world_size, values["LOCAL_RANK"]


def check_split(model_id: str, world_size: int, trust_remote_code: bool = False) -> None:
    """Refuse, before any rank joins, a model whose heads or MLP widths do not divide by the ranks."""
    from transformers import AutoConfig

    path = model_id.split("@", 1)[0]
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code).get_text_config()
    except Exception as e:  # noqa: BLE001 - any load failure is the operator's to fix
        _refuse(f"cannot read the model config of {path}: {e}")
    if not getattr(config, "base_model_tp_plan", None):
        _refuse(f"{config.model_type} has no tensor-parallel plan in this engine")
    for dim in SPLIT_DIMS:
        value = getattr(config, dim, None)
        if isinstance(value, int) and value % world_size:
            _refuse(f"cannot split {path} over {world_size} ranks: {dim}={value} is not divisible by {world_size}")


def init(force_model: str | None, device: str, continuous_batching: bool, trust_remote_code: bool = False) -> None:
    """At serve start, before the model loads: check the setup, join the group, start the heartbeat."""
    if not enabled():
        return
    rank, world_size, local_rank = read_env()
    if not force_model:
        _refuse("name the model on the command line (`transformers serve MODEL`): every rank loads it at start")
    if not continuous_batching:
        _refuse("pass --continuous-batching: ranks > 0 follow rank 0 through continuous batching")
    check_split(force_model, world_size, trust_remote_code)

    import torch
    import torch.distributed as dist

    use_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        _refuse(f"--device {device} but this machine has no CUDA device")
    if not use_cuda and torch.cuda.is_available():
        # The engine builds its TP mesh on the machine's accelerator; a CPU group would not match it.
        _refuse(f"--device {device} on a machine with CUDA: serve tensor-parallel with --device cuda")
    for key, value in NCCL_ENV.items():
        os.environ.setdefault(key, value)
    device_id = None
    if use_cuda:
        device_id = torch.device("cuda", local_rank)
        torch.cuda.set_device(device_id)
    os.environ.setdefault("LOCAL_RANK", str(local_rank))  # the engine's mesh binds devices by it
    backend = "nccl" if use_cuda else "gloo"
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    sys.stderr.write(f"patchbay: tensor parallel: rank {rank} of {world_size}, {backend}, joining {addr}:{port} "
                     f"({tp_net.default_interfaces(addr)})\n")
    timeout = timedelta(seconds=JOIN_TIMEOUT_S)
    try:
        store = tp_net.rendezvous_store(rank, world_size, addr, port, timeout)
    except tp_net.RendezvousError as e:
        _refuse(str(e))
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                            device_id=device_id)
    heartbeat_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=HEARTBEAT_TIMEOUT_S))
    state.rank, state.world_size = rank, world_size
    threading.Thread(target=_heartbeat, args=(heartbeat_group,), name="pb-tp-heartbeat", daemon=True).start()
    sys.stderr.write(f"patchbay: tensor parallel: rank {rank} joined ({backend})\n")


def _heartbeat(group) -> None:
    import torch
    import torch.distributed as dist

    beat = torch.ones(1)
    while True:
        try:
            dist.all_reduce(beat, group=group)
        except Exception as e:  # noqa: BLE001 - any failure of the collective means a peer is gone
            _peer_lost(_short(e))
            return
        time.sleep(HEARTBEAT_INTERVAL_S)


def _short(error: Exception) -> str:
    """gloo's message without its source location and advice: `Connection closed by peer [addr]:port`."""
    text = (str(error).splitlines() or [type(error).__name__])[0]
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0]


def _peer_lost(why: str) -> None:
    if state.rank != 0:
        sys.stderr.write(f"patchbay: tensor parallel: rank 0 is gone ({why}); rank {state.rank} exits\n")
        sys.stderr.flush()
        os._exit(1)
    message = f"a tensor-parallel peer rank is gone ({why}); restart every rank"
    with state.lock:
        state.peer_lost = message
        cb = state.cb_manager
    sys.stderr.write(f"patchbay: {message}\n")
    if cb is not None:
        _fail_in_flight(cb, RuntimeError(message))


def _fail_in_flight(cb, error: Exception) -> None:
    """Mark the CB worker dead (health and new requests: 503) and end the requests in flight."""
    from ...generation.continuous_batching.requests import RequestState

    cb.background_thread_status.record_fatal_error(error)
    with cb.output_router._lock:
        pending = list(cb.output_router.result_handlers)
    for request_id in pending:
        try:
            cb.output_router.fail_and_deliver(RequestState(request_id=request_id, initial_tokens=[]), error)
        except Exception:  # noqa: BLE001 - a handler already gone is fine
            pass


def sync_tokens(output_ids) -> None:
    """Every rank continues with rank 0's tokens. Per-request sampling, forced replies and
    grammars (0100-0140) are registered on rank 0 only, so rank 0's choice is the one that
    counts; one small broadcast per step keeps every rank's KV cache on the same tokens."""
    if state.world_size > 1:
        import torch.distributed as dist

        dist.broadcast(output_ids, src=0)


def peer_lost() -> str | None:
    return state.peer_lost


def model_kwargs(kwargs: dict) -> dict:
    """`from_pretrained` arguments: the model's own TP plan over every rank instead of a device map."""
    if not enabled():
        return kwargs
    from ...distributed import DistributedConfig

    return {**kwargs, "device_map": None, "distributed_config": DistributedConfig(tp_size=state.world_size)}


def _store():
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def announce_cb(gen_config, cb_config) -> None:
    """Rank 0, before building its CB manager: hand its configs to the followers, which build theirs."""
    if not enabled():
        return
    _store().set(_CB_INIT_KEY, tp_wire.encode_configs(gen_config, cb_config))


def watch(cb) -> None:
    """Rank 0: the CB manager the heartbeat fails when a peer is lost."""
    if not enabled():
        return
    with state.lock:
        state.cb_manager = cb
        lost = state.peer_lost
    if lost:
        _fail_in_flight(cb, RuntimeError(lost))


def broadcast_step(helper, payload):
    """A step's new requests and cancellations from rank 0 to every rank (upstream's
    `tp_broadcast_object_from_rank_0`, which pickles), as tp_wire's checked plain data. A follower
    that receives what it cannot decode says so and exits: rank 0's heartbeat then answers 503,
    where waiting on would leave both ranks in mismatched collectives."""
    try:
        return tp_wire.broadcast(helper, payload)
    except tp_wire.WireError as e:
        if helper.is_tp_driver:
            raise  # rank 0's CB loop fails its requests and stops; the followers were told
        rank = helper.global_rank
        sys.stderr.write(f"patchbay: tensor parallel: rank {rank} refuses what rank 0 sent and exits: {e}\n")
        sys.stderr.flush()
        os._exit(1)


class _NoNap:
    """A follower's stand-in for its CB loop's wake-up event: never waits."""

    def wait(self, timeout=None) -> bool:
        return True

    def set(self) -> None:
        pass

    def clear(self) -> None:
        pass

    def is_set(self) -> bool:
        return True


def follow(model_manager) -> bool:
    """On a rank > 0: follow rank 0's batches until its CB loop stops, then return True (serve
    nothing). On rank 0, or with the knob off: False at once."""
    if not enabled() or state.rank == 0:
        return False
    model = next(iter(model_manager.loaded_models.values())).model
    store = _store()
    sys.stderr.write(f"patchbay: tensor parallel: rank {state.rank} loaded the model; waiting for rank 0's first request\n")
    while not store.check([_CB_INIT_KEY]):
        time.sleep(0.1)
    try:
        gen_config, cb_config = tp_wire.decode_configs(store.get(_CB_INIT_KEY))
    except tp_wire.WireError as e:
        sys.stderr.write(f"patchbay: tensor parallel: rank {state.rank} refuses what rank 0 sent and exits: {e}\n")
        raise SystemExit(1) from None
    manager = model.init_continuous_batching(generation_config=gen_config, continuous_batching_config=cb_config)
    # No request ever wakes a follower's idle loop, so upstream's 100 ms nap between idle rounds
    # held rank 0's next round (a collective) for up to 100 ms after a request arrived: a first
    # token 118 ms later than TP=1's at C1 on two H200s (W07). A follower waits in the round's
    # collective instead, which returns as soon as rank 0 starts the round.
    manager._wake_up_loop = _NoNap()
    manager.start()
    sys.stderr.write(f"patchbay: tensor parallel: rank {state.rank} follows rank 0's batches\n")
    # Outputs on a follower have no handler: drain them, or the output queue grows forever.
    while manager.is_running():
        manager.get_result(timeout=0.5)
    error = manager.background_thread_status.fatal_error
    if error is not None:
        sys.stderr.write(f"patchbay: tensor parallel: rank {state.rank}: generation loop failed: {error}\n")
        raise SystemExit(1)
    sys.stderr.write(f"patchbay: tensor parallel: rank {state.rank}: rank 0 stopped; exiting\n")
    return True


# Routes that would run or reload the model on rank 0 alone (outside continuous batching, which
# every rank runs in step): the other ranks would never join its collectives, so rank 0 would hang.
RANK0_ONLY_ROUTES = ("/v1/systemone", "/v1/audio/transcriptions", "/load_model", "/reset")


def install(app) -> None:
    """Rank 0's app: every route answers 503 once a peer is lost; rank-0-only routes answer 501."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.middleware("http")
    async def _tp_guard(request: Request, call_next):
        lost = state.peer_lost
        if lost is not None:
            return JSONResponse({"status": "unhealthy", "reason": "tp_peer_lost", "error": lost}, status_code=503)
        if request.url.path in RANK0_ONLY_ROUTES:
            message = (f"{request.url.path} is not available with tensor parallelism (PB_TENSOR_PARALLEL=1): "
                       "it would run the model on rank 0 alone")
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                           "code": "not_available_with_tp"}}, status_code=501)
        return await call_next(request)
