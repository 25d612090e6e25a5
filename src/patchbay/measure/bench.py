"""`patchbay ab`: a paired A/B speed comparison of two per-request knob settings on one live server.

Both arms go to the same server; they differ only in the request field `pb_knobs`. For every rep
and concurrency level the same prompts run through arm A and arm B back to back, and which arm
goes first alternates from rep to rep so slow drift (thermal, caches, other load) cancels. Every
request is streamed and greedy; its timings and a hash of its reply are recorded. The figures
(decode tok/s after the first token, TTFT, prefill tok/s, aggregate tok/s) are computed in
`stats`, the window is written by `windows`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from . import prompts as suites
from .prompts import Prompt


class BenchError(RuntimeError):
    """One line for the operator; `code` is the exit status (2 bad input, 1 the run failed)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class ArmServers:
    """Where a plan's arms send their requests: arm B to `b_url`, asking for `b_model`, when the
    plan names them (another server, or another checkpoint of the model), else where A sends."""

    def url_of(self, arm: str) -> str:
        return self.b_url if arm == "B" and self.b_url else self.url

    def model_of(self, arm: str) -> str:
        return self.b_model if arm == "B" and self.b_model else self.model


@dataclass(frozen=True)
class Plan(ArmServers):
    url: str
    model: str
    arms: dict  # "A" / "B" -> the pb_knobs dict that arm sends ({} sends none)
    prompts: list  # of Prompt, already fitted to --max-prompt-tokens
    levels: list  # concurrency levels, in the order run
    reps: int
    warmup: int
    max_tokens: int | None  # None: each prompt's own default
    seed: int = 0
    timeout: float = 600.0  # per request, seconds
    time_limit: float = 3600.0  # whole run: no new pass starts after this many seconds
    suites: list = field(default_factory=list)
    b_url: str | None = None  # arm B served by another server (same model), else by `url`
    b_model: str | None = None  # with b_url: the id B serves when it is another checkpoint of the model
    cold: bool = False  # every request's first message starts with its own line: no cached prefix
    distinct_copies: bool = False  # a prompt's copies after the first open with "Copy N." (other requests)


def parse_value(raw: str):
    """A knob value as the JSON it is sent as: integers as numbers, anything else as text."""
    try:
        return int(raw)
    except ValueError:
        return raw


def arms_from_knobs(specs: list[str]) -> dict:
    """`PB_X=a,b` (repeatable) -> {"A": {"PB_X": a}, "B": {"PB_X": b}}."""
    a, b = {}, {}
    for spec in specs:
        name, eq, values = spec.partition("=")
        parts = values.split(",")
        if not eq or not name.startswith("PB_") or len(parts) != 2 or "" in parts:
            raise BenchError(f"--knob {spec}: expected PB_NAME=A_VALUE,B_VALUE (e.g. PB_SSE_DONE=0,1)", 2)
        a[name], b[name] = parse_value(parts[0]), parse_value(parts[1])
    return {"A": a, "B": b}


def arms_from_json(a_json: str, b_json: str) -> dict:
    arms = {}
    for name, text in (("A", a_json), ("B", b_json)):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise BenchError(f"--{name.lower()}-json: not JSON ({e.msg} at column {e.colno})", 2) from None
        if not isinstance(value, dict):
            raise BenchError(f"--{name.lower()}-json: must be a JSON object of knob names to values", 2)
        arms[name] = value
    return arms


COLD_REQUESTS = itertools.count()
# A cold request's first line is "Request N-xxxxxxxx." and a blank line; its tokens vary a little
# with the digits, so fitting a prompt for --cold counts it with this sample line and keeps
# FIRST_LINE_RESERVE tokens of --max-prompt-tokens spare (as for --distinct-copies' line below).
COLD_SAMPLE_LINE = "Request 0-0f0f0f0f.\n\n"
FIRST_LINE_RESERVE = 8
# The client's keep-alive for idle connections, kept under servers' own (uvicorn: 5 s); see run().
KEEPALIVE_EXPIRY_S = 1.0
# With --distinct-copies, copy N (from 2) of a prompt opens with "Copy N." and a blank line: the same
# line in both arms and every rep, so replies stay comparable, yet no two copies are one request.
# A batch-invariant engine answers identical copies identically, and identical greedy replies pick
# the same experts, which flatters a mixture-of-experts model's decode; distinct copies do not.
COPY_SAMPLE_LINE = "Copy 99.\n\n"


def with_first_line(messages: list[dict], line: str) -> list[dict]:
    """The messages with `line` put before the first message's content."""
    if not line:
        return messages
    return [{**messages[0], "content": line + messages[0]["content"]}, *messages[1:]]


def request_body(plan: Plan, prompt: Prompt, arm: str, max_tokens: int | None = None, copy: int = 0) -> dict:
    messages = prompt.messages()
    if plan.distinct_copies and copy > 0:
        messages = with_first_line(messages, f"Copy {copy + 1}.\n\n")
    if plan.cold:  # a line of its own first, so no page of the prompt matches one the server cached
        messages = with_first_line(messages, f"Request {next(COLD_REQUESTS)}-{uuid.uuid4().hex[:8]}.\n\n")
    # include_usage: a server in OpenAI's stream shape (PB_OPENAI_SHAPES) sends usage only when asked;
    # upstream ignores the field.
    body = {"model": plan.model_of(arm), "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0,
            "max_tokens": max_tokens or plan.max_tokens or prompt.max_tokens}
    if prompt.tools:
        body["tools"] = prompt.tools
    if plan.arms[arm]:
        body["pb_knobs"] = plan.arms[arm]
    return body


def _reply_parts(delta: dict) -> dict:
    """A delta's text by the field an assistant message carries it in (a conversation resends them)."""
    return {"content": delta.get("content") or "",
            "reasoning_content": delta.get("reasoning_content") or delta.get("reasoning") or ""}


def _reply_text(delta: dict) -> str:
    text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    for call in delta.get("tool_calls") or []:
        fn = call.get("function") or {}
        text += (fn.get("name") or "") + (fn.get("arguments") or "")
    return text


def run_request(client: httpx.Client, plan: Plan, body: dict, epoch: float, arm: str = "A",
                keep_reply: bool = False) -> dict:
    """Send one streamed request; its timings (seconds since `epoch`; `gap_max_s`, the longest wait
    between two streamed pieces of the reply), usage and reply hash (and,
    with `keep_reply`, the reply's text by field under `reply`, for a conversation's next turn)."""
    rec: dict = {"t_start": time.perf_counter() - epoch, "t_first": None, "t_last": None, "gap_max_s": None,
                 "completion_tokens": None, "prompt_tokens": None, "cached_tokens": None, "finish_reason": None,
                 "fingerprint": None, "text_sha256": None, "error": None}
    text: list[str] = []
    parts: dict = {"content": [], "reasoning_content": []}
    try:
        with client.stream("POST", f"{plan.url_of(arm)}/v1/chat/completions", json=body,
                           timeout=plan.timeout) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:300]}"
                return rec
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter() - epoch
                chunk = json.loads(line[6:])
                if chunk.get("error"):  # the server gave up on the request mid-stream and said why
                    rec["error"] = f"server error: {json.dumps(chunk['error'])[:280]}"
                    return rec
                for choice in chunk.get("choices") or []:
                    piece = _reply_text(choice.get("delta") or {})
                    if keep_reply:
                        for key, value in _reply_parts(choice.get("delta") or {}).items():
                            parts[key].append(value)
                    if piece:
                        text.append(piece)
                        if rec["t_last"] is not None:  # the longest wait between two pieces of the reply
                            rec["gap_max_s"] = max(rec["gap_max_s"] or 0.0, now - rec["t_last"])
                        rec["t_last"] = now
                        if rec["t_first"] is None:
                            rec["t_first"] = now
                    if choice.get("finish_reason"):
                        rec["finish_reason"] = choice["finish_reason"]
                if chunk.get("usage"):
                    rec["completion_tokens"] = chunk["usage"].get("completion_tokens")
                    rec["prompt_tokens"] = chunk["usage"].get("prompt_tokens")
                    rec["cached_tokens"] = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
                if chunk.get("pb_fingerprint"):
                    rec["fingerprint"] = chunk["pb_fingerprint"]
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
        return rec
    rec["text_sha256"] = hashlib.sha256("".join(text).encode()).hexdigest()
    if keep_reply:
        rec["reply"] = {key: "".join(values) for key, values in parts.items()}
    if rec["completion_tokens"] is None:
        rec["error"] = "the stream ended without a usage block"
    return rec


def run_pass(client, plan: Plan, arm: str, level: int, rep: int, epoch: float, on_done) -> list[dict]:
    """Every prompt through one arm with `level` requests in flight. When there are fewer prompts
    than the level, the list is sent several times over so the level is actually reached."""
    copies = max(1, -(-level // len(plan.prompts)))
    jobs = [(p, c) for c in range(copies) for p in plan.prompts]

    def one(job):
        prompt, copy = job
        rec = run_request(client, plan, request_body(plan, prompt, arm, copy=copy), epoch, arm)
        rec.update(prompt=prompt.id, suite=prompt.suite, copy=copy)
        on_done()
        return rec

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=level, thread_name_prefix=f"ab-{arm}") as pool:
        records = list(pool.map(one, jobs))
    wall = time.perf_counter() - t0
    first = "A" if rep % 2 == 0 else "B"
    for rec in records:
        rec.update(arm=arm, rep=rep, concurrency=level, warmup=rep < 0, first=first, pass_wall_s=wall,
                   pb_knobs=plan.arms[arm])
    return records


def schedule(plan: Plan) -> list[tuple[int, int, str]]:
    """(rep, level, arm) in run order: warmup reps are negative; A first on even reps, B on odd."""
    out = []
    for rep in range(-plan.warmup, plan.reps):
        order = "AB" if rep % 2 == 0 else "BA"
        out += [(rep, level, arm) for level in plan.levels for arm in order]
    return out


def schedule_restarts(plan: Plan) -> list[tuple[int, int, str]]:
    """The same passes grouped by arm within each rep, for arms that are whole server restarts."""
    out = []
    for rep in range(-plan.warmup, plan.reps):
        order = "AB" if rep % 2 == 0 else "BA"
        out += [(rep, level, arm) for arm in order for level in plan.levels]
    return out


def run(plan: Plan, sink, progress=None, switch=None) -> bool:
    """Run every pass in order, handing each pass's records to `sink`. False when the time limit
    stopped it early. `switch(arm)`, when given, is called whenever the arm changes: the arms are
    then two server configurations, restarted alternately, rather than per-request knobs."""
    passes = schedule_restarts(plan) if switch else schedule(plan)
    total = sum(len(plan.prompts) * max(1, -(-lvl // len(plan.prompts))) for _, lvl, _ in passes)
    bar = progress or (lambda *_: None)
    done = [0]
    lock = threading.Lock()
    epoch = time.perf_counter()
    # Idle connections are dropped after 1 s, before the server's own keep-alive timeout (uvicorn's is
    # 5 s) can close one just as a pass sends on it: W15 lost 3 of 32 requests so, a pass ~5 s
    # after the same arm's last one ("Server disconnected without sending a response").
    limits = httpx.Limits(max_connections=max(plan.levels), max_keepalive_connections=max(plan.levels),
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    with httpx.Client(limits=limits, timeout=plan.timeout) as client:
        current = None
        for rep, level, arm in passes:
            if time.perf_counter() - epoch > plan.time_limit:
                return False
            if switch and arm != current:
                switch(arm)
                current = arm

            def tick(label=f"C{level} {'warmup' if rep < 0 else f'rep {rep + 1}/{plan.reps}'} {arm}"):
                with lock:
                    done[0] += 1
                    bar(done[0], total, label)

            sink(run_pass(client, plan, arm, level, rep, epoch, tick))
    return True


# ---- before the run: what the server is, whether it takes both arms, fitting the prompts -------


def b_server(b_url: str, server: dict, b_model: str | None) -> dict:
    """Arm B's server (--b-url): it must serve arm A's model (check_same_model), or, with `b_model`,
    list that id (another checkpoint of the model, such as its FP8 copy). Its build and knobs hash
    go into `server`."""
    other = server_info(b_url, b_model or server["model"])
    if b_model is None:
        check_same_model(server, other)
    elif other["listed"] and b_model not in other["listed"]:
        raise BenchError(f"--b-url serves {', '.join(other['listed'])}, not --b-model {b_model}", 2)
    server.update(b_build=other["build"], b_knobs_hash=other["knobs_hash"])
    return other


def check_same_model(server: dict, other: dict) -> None:
    """Arm B's server (--b-url) must serve arm A's model: by the id asked for, by its folder's name
    (what a server with served names lists by default for that path, which it also accepts), or by
    a name both list."""
    model = server["model"]
    folder = model.split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if other["listed"] and model not in other["listed"] and folder not in other["listed"] and \
            not set(server.get("listed") or []) & set(other["listed"]):
        raise BenchError(f"--b-url serves {', '.join(other['listed'])}, not {server['model']}: "
                         "the two arms must serve the same model", 2)


def server_info(url: str, model: str | None, timeout: float = 30.0) -> dict:
    """The model id (given, or the first one /v1/models lists), the ids it lists (`listed`, [] when
    it lists none) and the build id the server reports."""
    info = {"build": "unknown", "knobs_hash": None, "model": model, "listed": []}
    try:
        r = httpx.get(f"{url}/v1/models", timeout=timeout)
    except httpx.HTTPError as e:
        raise BenchError(f"{url} is not reachable ({type(e).__name__}: {e}); start the server first") from None
    if r.headers.get("x-pb-build"):
        info["build"] = r.headers["x-pb-build"]
    info["knobs_hash"] = r.headers.get("x-pb-knobs")
    data = []
    if r.status_code == 200:
        try:
            data = r.json().get("data") or []
        except ValueError:
            data = []
    info["listed"] = [entry["id"] for entry in data if isinstance(entry, dict) and "id" in entry]
    if info["build"] == "unknown":
        for entry in data:
            for key in ("pb_build", "build_id", "build"):
                if isinstance(entry, dict) and entry.get(key):
                    info["build"] = str(entry[key])
    if not model:
        if not data:
            raise BenchError(f"{url}/v1/models lists no model (HTTP {r.status_code}); pass --model", 2)
        info["model"] = data[0]["id"]
    return info


def check_arms(plan: Plan) -> str | None:
    """Send one short request per arm; the server's refusal of either ends the run before it starts.
    Returns the build id from the response headers (None if the server sends none)."""
    build = None
    probe = plan.prompts[0]
    for arm in "AB":
        body = {**request_body(plan, probe, arm, max_tokens=1)}
        seen = probe_request(plan.url_of(arm), body, plan.timeout, f"arm {arm}",
                             f"arm {arm} (pb_knobs {json.dumps(plan.arms[arm])})")
        build = build or seen
    return build


def probe_request(url: str, body: dict, timeout: float, what: str, refused: str, fix: str = "") -> str | None:
    """One chat request that must answer 200 before a run starts (BenchError naming `what` if it
    fails, `refused` and the server's answer if it is refused); the build id it reports."""
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as r:
            r.read()
    except httpx.HTTPError as e:
        raise BenchError(f"{what}: request failed ({type(e).__name__}: {e})") from None
    if r.status_code != 200:
        raise BenchError(f"{refused}: the server answered HTTP {r.status_code}: {r.text[:300]}{fix}", 2)
    return r.headers.get("x-pb-build")


def token_counter(url: str, model: str, timeout: float = 120.0, first_line: str = ""):
    """A function Prompt -> prompt tokens (with `first_line` before its first message): the
    server's /tokenize when it has one (PB_TOKENIZE), else the `usage` of a one-token completion."""
    def via_tokenize(p: Prompt) -> int:
        body = {"model": model, "messages": with_first_line(p.messages(), first_line),
                **({"tools": p.tools} if p.tools else {})}
        r = httpx.post(f"{url}/tokenize", json=body, timeout=timeout)
        r.raise_for_status()
        return int(r.json()["count"])

    def via_usage(p: Prompt) -> int:
        body = {"model": model, "messages": with_first_line(p.messages(), first_line), "max_tokens": 1,
                "temperature": 0,
                **({"tools": p.tools} if p.tools else {})}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
        if r.status_code != 200:
            return 1 << 30  # refused: treat as too long
        return int(r.json()["usage"]["prompt_tokens"])

    try:
        r = httpx.post(f"{url}/tokenize", json={"model": model, "prompt": "x"}, timeout=timeout)
        has_tokenize = r.status_code == 200 and "count" in r.json()
    except (httpx.HTTPError, ValueError):
        has_tokenize = False
    return via_tokenize if has_tokenize else via_usage


def prepare(url: str, model: str | None, suite_names: list[str] | None, max_prompt_tokens: int | None,
            cold: bool = False, distinct_copies: bool = False):
    """(model, build, knobs hash, prompts) for a run: the prompts selected and cut to fit (with
    --cold and --distinct-copies, to fit with their first lines)."""
    info = server_info(url, model)
    try:
        chosen = suites.select(suite_names)
    except ValueError as e:
        raise BenchError(f"--suites: {e}", 2) from None
    if max_prompt_tokens:
        first_line = (COPY_SAMPLE_LINE if distinct_copies else "") + (COLD_SAMPLE_LINE if cold else "")
        count = token_counter(url, info["model"], first_line=first_line)
        limit = max_prompt_tokens - (FIRST_LINE_RESERVE if cold or distinct_copies else 0)
        try:
            chosen = [suites.fit(p, limit, count) for p in chosen]
        except ValueError as e:
            raise BenchError(f"--max-prompt-tokens {max_prompt_tokens}: {e}; raise it or drop that suite", 2) from None
    return info, chosen


class Progress:
    """A bar on stderr: redrawn in place on a terminal; elsewhere (a log) a line per tenth done."""

    def __init__(self, stream=sys.stderr):
        self.stream, self.t0, self.shown = stream, time.monotonic(), -1
        self.tty = stream.isatty()

    def __call__(self, done: int, total: int, label: str) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} requests  {label}  "
                f"{time.monotonic() - self.t0:.0f}s")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done == total else ""))
        elif done * 10 // max(total, 1) > self.shown:
            self.shown = done * 10 // max(total, 1)
            self.stream.write(line + "\n")
        self.stream.flush()


def execute(plan: Plan, server: dict, window=None, command: str = "", progress=None, switch=None,
            restarts: dict | None = None) -> dict:
    """Run the plan, writing the window as it goes when one is given; the summary."""
    from . import stats, windows

    records: list[dict] = []

    def sink(batch):
        records.extend(batch)
        if window:
            windows.append_raw(window, batch)

    config = {"url": plan.url, "model": plan.model, "build": server["build"], "knobs_hash": server.get("knobs_hash"),
              "arms": plan.arms, "suites": plan.suites, "levels": plan.levels, "reps": plan.reps,
              "warmup": plan.warmup, "max_tokens": plan.max_tokens, "seed": plan.seed, "cold": plan.cold,
              "distinct_copies": plan.distinct_copies,
              "prompts": [{"id": p.id, "suite": p.suite, "body_words": p.words()} for p in plan.prompts]}
    if plan.b_url:  # arm B on its own server
        config["b_server"] = {"url": plan.b_url, "build": server.get("b_build"),
                              "knobs_hash": server.get("b_knobs_hash"), "model": plan.model_of("B")}
    if restarts:
        config["restarts"] = restarts  # arm -> the server configuration it was restarted with
    if window:
        windows.write_start(window, command, config)
    complete = run(plan, sink, progress, switch)
    summary = stats.summarize(records, [p.id for p in plan.prompts], plan.levels, plan.seed)
    summary.update(complete=complete, resamples=stats.RESAMPLES, burst_s=stats.BURST_S,
                   headline=stats.headline(summary))
    if window:
        windows.write_finish(window, summary)
    return {"config": config, "summary": summary}
