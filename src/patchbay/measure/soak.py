"""`patchbay soak`: N clients for T minutes against one local server, with the traffic that breaks
servers: streamed and whole chat completions of distinct real-text prompts, /v1/completions, tool
calls, structured output, the Responses API, clients that disconnect, and malformed requests.

Every request is bounded (max tokens, a total timeout) and recorded; `soak_report` classifies the
records (expected 4xx for a bad request against everything unexpected), and judges leaked slots,
what the requests left behind in the engine and the growth of the server's RSS. This module runs
the clients (`soak_plan` says what they send) and samples the server.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from . import soak_plan as plan
from .soak_plan import Request, Settings, SoakError


# ---- what the server says about itself ------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` in KiB; None once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


_GAUGE = re.compile(r"^pb_requests_running(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def running_from(metrics: str | None, health) -> tuple[int | None, str | None]:
    """(requests running, where it was said) from the text of /metrics (the `pb_requests_running`
    gauge, summed over its labels) or else /health's JSON (`requests.running`); (None, None) when
    neither says."""
    found = _GAUGE.findall(metrics or "")
    if found:
        return int(sum(float(v) for v in found)), "/metrics pb_requests_running"
    requests = health.get("requests") if isinstance(health, dict) else None
    running = requests.get("running") if isinstance(requests, dict) else None
    if isinstance(running, (int, float)) and not isinstance(running, bool):
        return int(running), "/health requests.running"
    return None, None


_LEFT = re.compile(r"^(pb_outputs_unclaimed|pb_output_handlers)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def left_behind_from(metrics: str | None) -> dict | None:
    """{gauge: value} of what requests that have left the engine may leave in it (`/metrics`'
    pb_outputs_unclaimed and pb_output_handlers: outputs no handler took, handlers registered);
    None when the server reports neither."""
    found: dict = {}
    for name, value in _LEFT.findall(metrics or ""):
        found[name] = found.get(name, 0) + int(float(value))
    return found or None


async def left_behind(client: httpx.AsyncClient, url: str) -> dict | None:
    """left_behind_from the server's /metrics now; None when it has no such gauges or no /metrics."""
    try:
        r = await client.get(f"{url}/metrics", timeout=5.0)
    except httpx.HTTPError:
        return None
    return left_behind_from(r.text if r.status_code == 200 else None)


async def running_requests(client: httpx.AsyncClient, url: str) -> tuple[int | None, str | None]:
    """What the server says it is running now (running_from); (None, None) when it says nothing."""
    metrics = health = None
    try:
        r = await client.get(f"{url}/metrics", timeout=5.0)
        metrics = r.text if r.status_code == 200 else None
    except httpx.HTTPError:
        pass
    if not _GAUGE.search(metrics or ""):
        try:
            health = (await client.get(f"{url}/health", timeout=5.0)).json()
        except (httpx.HTTPError, ValueError):
            pass
    return running_from(metrics, health)


def context_length(url: str, model: str) -> int | None:
    """The model's context as /v1/models reports it (`context_length` or `max_model_len`), if it does."""
    try:
        data = httpx.get(f"{url}/v1/models", timeout=30.0).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    entries = [e for e in data if isinstance(e, dict)]
    # A server that lists one model under a served name (PB_SERVED_NAMES) still serves it by its path.
    named = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in named[:1]:
        value = entry.get("context_length") or entry.get("max_model_len")
        return int(value) if isinstance(value, int) else None
    return None


def fit_words(s: Settings) -> tuple[int, int | None]:
    """(words, context): the most words of text a prompt may carry, at most --prompt-words, so that
    the longest request leaves room for the longest reply asked (4x max_tokens) in the model's
    context. A good request refused for its length would read as the server's fault."""
    from . import bench, prompts

    context = context_length(s.url, s.model)
    if not context:
        return s.prompt_words, None
    limit = context - 4 * s.max_tokens - 16  # 16: the chat template's turn markers vary a little
    count = bench.token_counter(s.url, s.model)
    try:
        fitted = min(prompts.fit(p, limit, count).words() for p in plan.widest_prompts(s.prompt_words))
    except ValueError:
        raise SoakError(f"the model's context ({context} tokens) has no room for the soak's longest prompt and "
                        f"4x --max-tokens {s.max_tokens}; lower --max-tokens", 2) from None
    words = s.prompt_words if fitted >= s.prompt_words else int(fitted * 0.85)  # slices not sampled
    if words < 1:
        raise SoakError(f"the model's context ({context} tokens) leaves no room for text in a prompt after the "
                        f"tools, the instruction and 4x --max-tokens {s.max_tokens}; lower --max-tokens", 2)
    return words, context


# ---- sending ----------------------------------------------------------------------------------


def _shape(text: str) -> bool:
    """Whether an error body is in the OpenAI shape: {"error": {"message": ...}}."""
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(err, dict) and isinstance(err.get("message"), str)


async def send(client: httpx.AsyncClient, url: str, req: Request, timeout: float, epoch: float) -> dict:
    """Send one request within `timeout` seconds in all; its record (times in seconds since `epoch`)."""
    rec = {"kind": req.kind, "path": req.path, "bad": req.bad, "accept": list(req.accept), "stream": req.stream,
           "t_start": time.perf_counter() - epoch, "latency_s": None, "ttft_s": None, "status": None,
           "outcome": None, "error": None, "openai_shape": None, "completion_tokens": None}
    t0 = time.perf_counter()
    kwargs = {"content": req.raw, "headers": {"content-type": "application/json"}} if req.raw is not None \
        else {"json": req.body}
    try:
        async with asyncio.timeout(timeout):
            if req.stream:
                await _streamed(client, url, req, rec, kwargs, t0)
            else:
                await _whole(client, url, req, rec, kwargs)
    except (TimeoutError, httpx.TimeoutException) as e:
        if req.client_timeout and rec["status"] is None and isinstance(e, httpx.TimeoutException):
            rec["outcome"] = "closed"  # the client gave up on purpose, as a disconnecting client does
        else:
            rec["outcome"], rec["error"] = "timeout", f"no answer within {timeout:g}s"
    except httpx.HTTPError as e:
        rec["outcome"], rec["error"] = "connection", f"{type(e).__name__}: {e}"[:300]
    rec["latency_s"] = time.perf_counter() - t0
    return rec


async def _whole(client, url, req: Request, rec: dict, kwargs: dict) -> None:
    if req.client_timeout:
        kwargs = {**kwargs, "timeout": req.client_timeout}
    r = await client.post(f"{url}{req.path}", **kwargs)
    rec["status"] = r.status_code
    _read_answer(rec, r.text, r.status_code)


def _read_answer(rec: dict, text: str, status: int) -> None:
    if status >= 400:
        rec["outcome"], rec["openai_shape"], rec["error"] = "refused", _shape(text), text[:300]
        return
    try:
        data = json.loads(text)
        usage = data.get("usage") or {}
        rec["completion_tokens"] = usage.get("completion_tokens", usage.get("output_tokens"))
        answer = data.get("output") if rec.get("path") == plan.RESPONSES else data.get("choices")
        ok = isinstance(answer, list) and bool(answer)
    except (ValueError, AttributeError):
        ok = False
    rec["outcome"] = "completed" if ok else "bad_body"
    if not ok or rec["bad"]:  # an unreadable answer, or one a bad request should not have had
        rec["error"] = text[:300]


# The Responses API's events that end a stream without its answer (chat's say so with an `error`).
RESPONSE_FAILED = ("error", "response.failed")


async def _streamed(client, url, req: Request, rec: dict, kwargs: dict, t0: float) -> None:
    async with client.stream("POST", f"{url}{req.path}", **kwargs) as r:
        rec["status"] = r.status_code
        if r.status_code != 200:
            _read_answer(rec, (await r.aread()).decode(errors="replace"), r.status_code)
            return
        chunks = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            if rec["ttft_s"] is None:
                rec["ttft_s"] = time.perf_counter() - t0
            try:
                chunk = json.loads(line[6:])
            except ValueError:
                rec["outcome"], rec["error"] = "bad_body", line[:300]
                return
            if isinstance(chunk, dict) and (chunk.get("error") or chunk.get("type") in RESPONSE_FAILED):
                # the server gave up mid-stream and said why
                rec["outcome"] = "stream_error"
                rec["error"] = json.dumps(chunk.get("error") or chunk.get("response") or chunk)[:300]
                return
            usage = (chunk.get("usage") or (chunk.get("response") or {}).get("usage")) if isinstance(chunk, dict) \
                else None
            if usage:  # chat's and completions' last chunk, or the Responses API's response.completed
                rec["completion_tokens"] = usage.get("completion_tokens", usage.get("output_tokens"))
            if req.close_after and chunks >= req.close_after:
                rec["outcome"] = "closed"  # leaving the block closes the connection mid-reply
                return
        rec["outcome"] = "completed" if chunks else "bad_body"
        if not chunks:
            rec["error"] = "the stream ended before any data chunk"


# ---- the run ---------------------------------------------------------------------------------


# After a 5xx or a failed connection a client waits this long before its next request, as real
# clients back off; a dead server would otherwise fill raw.jsonl with thousands of records a second.
BACKOFF_S = 0.1


@dataclass
class Run:
    """What a soak saw: every request's record, the server samples, and the slots after it."""
    records: list = field(default_factory=list)
    samples: list = field(default_factory=list)  # {"t", "rss_kib", "running"}
    running_source: str | None = None
    running_after: int | None = None
    left_after: dict | None = None  # left_behind once the grace is over
    grace_waited_s: float = 0.0
    server_alive: bool | None = None  # None: no pid to watch
    duration_s: float = 0.0


async def soak(s: Settings, on_record=None, progress=None) -> Run:
    """`s.clients` loops, each sending one request after another until `s.duration_s` has passed,
    while a sampler reads the server's RSS and running requests; then up to `s.grace_s` for the
    running count to come back to 0."""
    run, traffic, url = Run(), s.traffic(), s.url
    epoch = time.perf_counter()
    stop_at = epoch + s.duration_s
    limits = httpx.Limits(max_connections=s.clients + 2, max_keepalive_connections=s.clients + 2,
                          keepalive_expiry=1.0)  # under the server's keep-alive (uvicorn: 5 s), as in bench
    async with httpx.AsyncClient(limits=limits, timeout=s.timeout_s) as client, \
            httpx.AsyncClient(timeout=5.0) as probe:

        async def one_client():
            while time.perf_counter() < stop_at:
                rec = await send(client, url, traffic.next(), s.timeout_s, epoch)
                run.records.append(rec)
                if on_record:
                    on_record(rec)
                if rec["outcome"] == "connection" or (rec["status"] or 0) >= 500:
                    await asyncio.sleep(BACKOFF_S)

        async def sample():
            running, source = await running_requests(probe, url)
            run.running_source = run.running_source or source
            run.samples.append({"t": time.perf_counter() - epoch, "rss_kib": rss_kib(s.pid) if s.pid else None,
                                "running": running})
            return running

        async def sampler():
            while time.perf_counter() < stop_at:
                await sample()
                if progress:
                    progress(run, time.perf_counter() - epoch, s.duration_s)
                await asyncio.sleep(s.sample_every_s)

        await asyncio.gather(sampler(), *(one_client() for _ in range(s.clients)))
        run.duration_s = time.perf_counter() - epoch
        t_end = time.perf_counter()
        while True:  # the grace: disconnected and finished requests must all leave the server
            running = await sample()
            if running is None or running == 0 or time.perf_counter() - t_end >= s.grace_s:
                break
            await asyncio.sleep(min(1.0, s.sample_every_s))
        run.running_after = running
        run.grace_waited_s = time.perf_counter() - t_end
        run.left_after = await left_behind(probe, url)
    run.server_alive = None if not s.pid else rss_kib(s.pid) is not None
    return run


def execute(s: Settings, window=None, command: str = "", progress=None) -> dict:
    """Run the soak, writing the window as it goes when one is given; {config, summary, records,
    samples}."""
    from . import soak_report, windows

    config = {"url": s.url, "model": s.model, "build": s.build, "pid": s.pid, "clients": s.clients,
              "duration_s": s.duration_s, "max_tokens": s.max_tokens, "timeout_s": s.timeout_s,
              "disconnect_after": s.disconnect_after, "disconnect_timeout_s": s.disconnect_timeout_s,
              "mix": s.mix, "bad": list(s.bad) if s.mix.get("bad") else [],
              "prompt_words": s.prompt_words, "seed": s.seed, "sample_every_s": s.sample_every_s,
              "grace_s": s.grace_s, "limits": s.limits()}
    if window:
        windows.write_start(window, command, config)
    on_record = (lambda rec: windows.append_raw(window, [rec])) if window else None
    run = asyncio.run(soak(s, on_record, progress))
    facts = {"pid": s.pid, "clients": s.clients, "samples": run.samples, "duration_s": run.duration_s,
             "running_after": run.running_after, "running_source": run.running_source,
             "left_after": run.left_after, "grace_waited_s": run.grace_waited_s, "server_alive": run.server_alive}
    summary = soak_report.summarize(run.records, facts, s.limits(), s.bucket_s, s.rss_window_s)
    summary["duration_s"] = run.duration_s
    if window:
        config["created"] = json.loads((window / "config.json").read_text())["created"]
        soak_report.write_window(window, summary, run.samples)
    return {"config": config, "summary": summary, "records": run.records, "samples": run.samples}


def server_pid(run_dir: Path) -> int:
    """The pid in a run folder's server.pid (rank 0's), checked to be alive."""
    path = Path(run_dir) / "server.pid"
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        raise SoakError(f"--run-dir {run_dir}: no readable server.pid there; is the server started with that "
                        "RUN_DIR? (or pass --pid)", 2) from None
    if rss_kib(pid) is None:
        raise SoakError(f"--run-dir {run_dir}: pid {pid} in server.pid is not running; start the server", 2)
    return pid


class Progress:
    """A line on stderr every `every` seconds: time, requests, unexpected so far, RSS, running."""

    def __init__(self, every: float = 10.0, stream=sys.stderr):
        self.every, self.stream, self.shown = every, stream, 0.0

    def __call__(self, run: Run, t: float, total: float) -> None:
        from .soak_report import unexpected

        if t - self.shown < self.every:
            return
        self.shown = t
        last = run.samples[-1] if run.samples else {}
        rss = f"{last['rss_kib'] / 1024:.0f} MiB" if last.get("rss_kib") else "–"
        running = last.get("running")
        self.stream.write(f"soak {t:.0f}/{total:.0f}s: {len(run.records)} requests, {len(unexpected(run.records))} "
                          f"unexpected, RSS {rss}, running {'–' if running is None else running}\n")
        self.stream.flush()
