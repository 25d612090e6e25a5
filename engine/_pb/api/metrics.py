"""PB_METRICS: what the server did, for Prometheus, a health probe, the log and a hung process.

- `GET /metrics`: Prometheus' text format from a registry of its own. Requests by route and
  status, prompt and completion tokens, time to first token, the gaps between streamed
  tokens, request durations, errors by code, the prefix cache's hit tokens, the two phases
  before a request's first step (its way into the engine, its wait there); and, read from the
  live engine at scrape time, requests running and waiting, the paged cache's blocks, the
  outputs no handler took and the handlers registered, and the GPU memory torch's allocator holds.
- `GET /health`: upstream's status (503 with its reason when the batching worker died), plus
  uptime, the requests in the engine, the token totals and the tensor-parallel ranks' state.
- One `pb-request {json}` log line per finished request (probes and scrapes excepted).
- SIGUSR1 writes every thread's stack to the log (faulthandler) and the threads' names.

Route, status, tokens, fingerprint and finish reason are read from the response as it leaves
(a middleware), so they are what the client got; the engine's two hooks add what only it
sees: when tokens came out, and when the request entered the engine and was first scheduled.
A first token's time is then three phases: `admit_s` (arrival to the engine's queue: the body,
the chat template, the tokenizer), `queue_s` (the queue to the first step that holds the
request) and the rest (the steps that compute its first token, and its way out). Every record
lives while its request does.
"""

import asyncio
import faulthandler
import json
import re
import signal
import sys
import threading
import time

from ...utils import logging
from .. import knobs


logger = logging.get_logger(__name__)

PROBES = ("/metrics", "/health")  # counted in pb_requests_total; not logged or timed
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5)
BODY_LIMIT = 1 << 22  # a JSON body larger than this is not read for usage
_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

_m = None  # the metrics, once install() made them: the engine hooks do nothing before
_live: dict = {}  # request id -> its _Request, while it is served (touched on the event loop only)
totals = {"prompt": 0, "completion": 0}
_started = 0.0


class _Request:
    __slots__ = ("id", "t0", "status", "sse", "done", "cancelled", "body", "prompt", "completion",
                 "fingerprint", "finish_reason", "error_code", "engine_prompt", "seen", "last", "ttft", "gaps",
                 "admit", "queue")

    def __init__(self, request_id, t0):
        self.id, self.t0 = request_id, t0
        self.status = self.fingerprint = self.finish_reason = self.error_code = None
        self.prompt = self.completion = self.engine_prompt = self.ttft = self.last = None
        self.admit = self.queue = None
        self.sse = self.done = self.cancelled = False
        self.body = bytearray()
        self.seen = 0
        self.gaps = []

    def read(self, chunk: bytes) -> None:
        """A body message on its way out: keep a JSON body, pick usage and errors from a stream."""
        if not self.sse:
            if self.body is not None:
                self.body += chunk
                if len(self.body) > BODY_LIMIT:
                    self.body = None
            return
        for line in chunk.split(b"\n"):
            # usage rides on the finish chunk, or (0610) on a last chunk of its own only when asked: the
            # finish reason and the fingerprint are read from whichever chunk carries them
            if line.startswith(b"data: {") and (b'"usage"' in line or b'"pb_fingerprint"' in line
                                                or b'"finish_reason":"' in line or line.startswith(b'data: {"error"')):
                try:
                    self.take(json.loads(line[6:]), in_stream=True)
                except ValueError:
                    pass

    def take(self, obj, in_stream: bool = False) -> None:
        """Usage, fingerprint, finish reason and error code of a response body or stream event."""
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("response"), dict):  # the Responses API's events carry the response
            obj = obj["response"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens", usage.get("input_tokens")), \
                usage.get("completion_tokens", usage.get("output_tokens"))
            self.prompt = prompt if isinstance(prompt, int) else self.prompt
            self.completion = completion if isinstance(completion, int) else self.completion
        if isinstance(obj.get("pb_fingerprint"), str):
            self.fingerprint = obj["pb_fingerprint"]
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
            self.finish_reason = str(choices[0]["finish_reason"])
        error = obj.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            if isinstance(code, str) and _CODE.fullmatch(code):
                self.error_code = code
            elif in_stream:  # an error event of a stream that began as a 200
                self.error_code = "stream_error"

    def tokens(self, output) -> None:
        """Engine hook: a GenerationOutput of this request reached its handler."""
        now = time.perf_counter()
        if self.engine_prompt is None:
            self.engine_prompt = len(output.prompt_ids)
            # the request's state stamps its creation (add_request) and its leaving the queue
            self.admit = output.created_time - self.t0
            if output.lifespan[0] > 0:
                self.queue = output.lifespan[0] - output.created_time
        new = len(output.generated_tokens) - self.seen
        if new <= 0:
            return
        self.seen += new
        if output.timestamps:  # not streamed from the engine: it kept each token's time
            if self.ttft is None:
                self.ttft = output.timestamps[0] - self.t0
            return
        if self.ttft is None:
            self.ttft = now - self.t0
            self.gaps += [0.0] * (new - 1)  # delivered together with the first
        else:
            self.gaps += [(now - self.last) / new] * new
        self.last = now


# ---- engine hooks (continuous_api.py) ------------------------------------------------------


def times_tokens(streaming: bool) -> bool:
    """add_request: a request the engine does not stream keeps its tokens' times, so its first
    token's time comes with its one output."""
    return _m is not None and not streaming


def timed(request_id: str, callback):
    """register_result_handler: the callback, seeing each output first."""
    if _m is None:
        return callback

    def observed(output):
        request = _live.get(output.request_id)
        if request is not None:
            try:
                request.tokens(output)
            except Exception as e:  # never a reply's problem
                logger.warning(f"patchbay metrics: {e!r}")
        callback(output)

    return observed


def count_cached(tokens: int) -> None:
    """Scheduler (through usage.record_cached): `tokens` prompt tokens matched in the prefix cache."""
    if _m is not None and tokens > 0:
        _m["cached"].inc(tokens)


# ---- the app side --------------------------------------------------------------------------


class Middleware:
    """Times and counts every request and reads what its response tells. It sits inside
    upstream's request-id middleware, so the request id is known."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = (scope.get("state") or {}).get("request_id")
        request = _Request(request_id, time.perf_counter())
        if request_id:
            _live[request_id] = request

        async def receive_watched():
            message = await receive()
            if message["type"] == "http.disconnect" and not request.done:
                request.cancelled = True
            return message

        async def send_watched(message):
            if message["type"] == "http.response.start":
                request.status = message["status"]
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                request.sse = content_type.startswith(b"text/event-stream")
                if not content_type.startswith(b"application/json"):
                    request.body = None  # nothing to read in it (the metrics text, a file)
            elif message["type"] == "http.response.body":
                request.read(message.get("body", b""))
                request.done = not message.get("more_body", False)
            await send(message)

        try:
            await self.app(scope, receive_watched, send_watched)
        except asyncio.CancelledError:
            request.cancelled = True
            raise
        except BaseException:
            request.status = request.status or 500
            raise
        finally:
            if _live.get(request_id) is request:
                del _live[request_id]
            try:
                finish(request, getattr(scope.get("route"), "path", "unmatched"))
            except Exception as e:
                logger.warning(f"patchbay metrics: {e!r}")


def finish(request: _Request, route: str) -> None:
    duration = time.perf_counter() - request.t0
    if request.status is not None and not request.done:
        request.cancelled = True  # the response never ended: the client went away
    status = request.status or (499 if request.cancelled else 500)
    if request.body:
        try:
            request.take(json.loads(bytes(request.body)))
        except ValueError:
            pass
    _m["requests"].labels(route=route, status=str(status)).inc()
    if status >= 400 or request.error_code:
        _m["errors"].labels(code=request.error_code or str(status)).inc()
    prompt = request.prompt if request.prompt is not None else request.engine_prompt
    completion = request.completion if request.completion is not None else (request.seen or None)
    if prompt:
        _m["prompt"].inc(prompt)
        totals["prompt"] += prompt
    if completion:
        _m["completion"].inc(completion)
        totals["completion"] += completion
    if route in PROBES:
        return
    _m["duration"].labels(route=route).observe(duration)
    if request.ttft is not None:
        _m["ttft"].observe(max(request.ttft, 0.0))
    if request.admit is not None:
        _m["admit"].observe(max(request.admit, 0.0))
    if request.queue is not None:
        _m["queue"].observe(max(request.queue, 0.0))
    if request.sse:
        for gap in request.gaps:
            _m["gap"].observe(gap)
    line = {"id": request.id, "route": route, "status": status, "prompt_tokens": prompt,
            "completion_tokens": completion, "ttft_s": _round(request.ttft), "admit_s": _round(request.admit),
            "queue_s": _round(request.queue), "duration_s": _round(duration),
            "fingerprint": request.fingerprint, "finish_reason": request.finish_reason,
            "cancelled": request.cancelled}
    if request.error_code:
        line["error"] = request.error_code
    logger.info("pb-request " + json.dumps(line, separators=(",", ":")))


def _round(seconds):
    return None if seconds is None else round(seconds, 6)


def engine_counts(generation_state) -> dict:
    """Requests and cache blocks of the live continuous-batching engine, read without its locks
    (lengths and counters only; a scrape may see a step half done)."""
    counts = {"running": 0, "waiting": 0, "blocks_used": 0, "blocks_total": 0, "graphs": 0, "unclaimed": 0,
              "handlers": 0}
    cb = getattr(getattr(generation_state, "_cb_manager", None), "_cb", None)
    if cb is None:
        return counts
    counts["waiting"] = cb.input_queue.qsize()  # submitted, not yet taken by the batching loop
    router = getattr(cb, "output_router", None)
    if router is not None:  # at idle both are 0 but for requests let go (0920)
        counts["unclaimed"] = router.output_queue.qsize()
        counts["handlers"] = len(router.result_handlers)
    processor = cb.batch_processor
    if processor is not None:
        counts["running"] = len(processor.scheduler.active_requests)
        counts["waiting"] += len(processor.scheduler.waiting_requests)
        cache = processor.cache
        counts["blocks_total"] = int(cache.num_blocks)
        counts["blocks_used"] = max(0, cache.num_blocks - round(cache.compute_free_capacity() * cache.num_blocks))
        counts["graphs"] = graphs_held(processor)
    return counts


def graphs_held(processor) -> int:
    """The CUDA graphs the batching engine has captured (one per step shape and IO pair; a graph
    is captured the first time its shape comes, which stalls every stream for that step)."""
    io = getattr(processor, "inputs_and_outputs", None)
    holders = [pair.device_io for pair in getattr(io, "io_pairs", ())] or [io]
    return sum(len(getattr(getattr(h, "graphs", None), "_storage", ())) for h in holders if h is not None)


def gpu_memory(gauge, counter):
    """This process's CUDA memory as torch's allocator counts it, per device (nothing without
    CUDA): what tensors hold, what the allocator keeps from the driver, the peak held, and how
    often an allocation found no room, so the allocator gave its cached blocks back to the driver
    and asked again (each such retry waits for the device: a pool sized too close to the card's
    memory shows here before it runs out)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    families = [gauge("pb_gpu_memory_allocated_bytes", "CUDA memory held by tensors", labels=["device"]),
                gauge("pb_gpu_memory_reserved_bytes", "CUDA memory the caching allocator holds", labels=["device"]),
                gauge("pb_gpu_memory_peak_allocated_bytes", "The most CUDA memory tensors held since start",
                      labels=["device"]),
                counter("pb_gpu_memory_alloc_retries", "Allocations that found no room until the caching allocator "
                        "gave its free blocks back to the driver", labels=["device"])]
    for device in range(torch.cuda.device_count()):
        retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
        for family, value in zip(families, (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
                                            torch.cuda.max_memory_allocated(device), retries)):
            family.add_metric([str(device)], value)
    yield from families


def _processor(generation_state):
    """The batching engine's batch processor (None before it starts)."""
    cb = getattr(getattr(generation_state, "_cb_manager", None), "_cb", None)
    return getattr(cb, "batch_processor", None)


def host_tier(generation_state, counter, gauge):
    """0790 PB_HOST_TIER_MB's table: prefix blocks saved to host memory on eviction, brought back
    for a prompt, dropped for room, and held now (nothing with the knob unset)."""
    from ..runtime import host_tier as tier

    processor = _processor(generation_state)
    counts = tier.stats(processor.cache) if processor is not None else None
    if counts is None:
        return
    for key, doc in (("saved", "Prefix cache blocks copied to host memory as they were evicted"),
                     ("restored", "Prefix cache blocks copied back from host memory for a prompt"),
                     ("dropped", "Blocks the host memory table let go of for newer ones")):
        yield counter(f"pb_host_tier_{key}_blocks", doc, value=counts[key])
    yield gauge("pb_host_tier_held_blocks", "Blocks the host memory table holds", value=counts["held"])
    yield gauge("pb_host_tier_slots_blocks", "Blocks the host memory table can hold", value=counts["slots"])


def drafts(generation_state, counter):
    """0800 PB_DRAFT_TOKENS: request steps that verified drafts, tokens drafted, and those kept
    (nothing while the engine cannot draft: asynchronous batching without 0860, or not started);
    0860: the steps the asynchronous loop waited for so that the next could draft; 0870: the request
    steps that passed without trying, backing off."""
    from ..runtime import drafts as drafting

    counts = drafting.stats(_processor(generation_state))
    if counts is None:
        return
    for key, doc in (("steps", "Request steps that verified drafted tokens"),
                     ("drafted", "Tokens drafted from n-gram matches in the prompt and reply"),
                     ("accepted", "Drafted tokens kept: the reply's own next tokens"),
                     ("waits", "Steps the asynchronous loop waited for so that the next could draft"),
                     ("passed", "Request steps that passed without trying to draft, backing off (0870)")):
        yield counter(f"pb_draft_{key}", doc, value=counts[key])


def ranks() -> dict:
    if not knobs.get("PB_TENSOR_PARALLEL"):
        return {"world_size": 1, "peer_lost": None}
    from ..runtime import tp

    return {"world_size": tp.state.world_size, "peer_lost": tp.state.peer_lost}


def _make(generation_state) -> dict:
    from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    disable_created_metrics()  # no `_created` series beside every counter and histogram
    registry = CollectorRegistry(auto_describe=True)

    class Live:
        def collect(self):
            counts = engine_counts(generation_state)
            for name, key, doc in (
                ("pb_requests_running", "running", "Requests the batching engine is generating"),
                ("pb_requests_waiting", "waiting", "Requests submitted and not yet scheduled"),
                ("pb_kv_blocks_used", "blocks_used", "Paged KV cache blocks in use (cached prefixes included)"),
                ("pb_kv_blocks_total", "blocks_total", "Paged KV cache blocks in all"),
                ("pb_cuda_graphs", "graphs", "CUDA graphs the batching engine holds (a new one is a capture)"),
                ("pb_outputs_unclaimed", "unclaimed", "Engine outputs that no request handler took (kept for "
                 "in-process readers; in a server, outputs of requests already let go)"),
                ("pb_output_handlers", "handlers", "Requests with an output handler registered (at idle: "
                 "handlers of requests let go and never finished)"),
            ):
                yield GaugeMetricFamily(name, doc, value=counts[key])
            yield from gpu_memory(GaugeMetricFamily, CounterMetricFamily)
            yield from host_tier(generation_state, CounterMetricFamily, GaugeMetricFamily)
            yield from drafts(generation_state, CounterMetricFamily)

    registry.register(Live())
    return {
        "registry": registry,
        "requests": Counter("pb_requests", "HTTP requests by route and status", ["route", "status"],
                            registry=registry),
        "prompt": Counter("pb_prompt_tokens", "Prompt tokens of finished requests", registry=registry),
        "completion": Counter("pb_completion_tokens", "Generated tokens of finished requests", registry=registry),
        "cached": Counter("pb_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache",
                          registry=registry),
        "errors": Counter("pb_errors", "Error responses (and errors inside streams) by code", ["code"],
                          registry=registry),
        "ttft": Histogram("pb_time_to_first_token_seconds", "From the request's arrival to its first token",
                          buckets=LATENCY_BUCKETS, registry=registry),
        "admit": Histogram("pb_request_admit_seconds", "From the request's arrival to the engine's queue (the "
                           "body, the chat template, the tokenizer)", buckets=LATENCY_BUCKETS, registry=registry),
        "queue": Histogram("pb_request_queue_seconds", "In the engine's queue, until a step first holds the request",
                           buckets=LATENCY_BUCKETS, registry=registry),
        "gap": Histogram("pb_inter_token_seconds", "Between successive streamed tokens", buckets=GAP_BUCKETS,
                         registry=registry),
        "duration": Histogram("pb_request_duration_seconds", "From the request's arrival to its last byte",
                              ["route"], buckets=LATENCY_BUCKETS, registry=registry),
    }


def _thread_names(signum, frame) -> None:
    names = {f"0x{t.ident:016x}": t.name for t in threading.enumerate()}
    logger.warning("pb-threads " + json.dumps(names))


def _stacks_on_sigusr1() -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    if callable(previous):  # someone's own (patchbay.device.served_profile starts its profiler)
        logger.warning("patchbay metrics: SIGUSR1 is taken; no stack dumps on it")
        return
    chain = threading.current_thread() is threading.main_thread()
    if chain:  # faulthandler dumps from the signal itself; the names follow from Python
        signal.signal(signal.SIGUSR1, _thread_names)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=chain)


def install(app, generation_state) -> None:
    global _m, _started
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    _m, _started = _make(generation_state), time.monotonic()
    app.add_middleware(Middleware)
    _stacks_on_sigusr1()

    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        return Response(generate_latest(_m["registry"]), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health():
        body = {"status": "ok"}
        peer_lost = ranks()["peer_lost"]
        if not generation_state.is_cb_alive():
            body = {"status": "unhealthy", "reason": "cb_worker_dead"}
        elif peer_lost is not None:
            body = {"status": "unhealthy", "reason": "tp_peer_lost"}
        counts = engine_counts(generation_state)
        body.update(uptime_s=round(time.monotonic() - _started, 3),
                    requests={"running": counts["running"], "waiting": counts["waiting"]},
                    tokens=dict(totals), ranks=ranks())
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)
