"""Running `ab --workload agent`: the prompts fitted for each level, the passes in order, the streams.

A pass is one (rep, level, mode, arm): `level` streams at once, each sending its requests one
after another (a conversation's turns, each resending the whole history). Within a rep the modes
take turns in an order that rotates from rep to rep, and for each mode the arms go A B on even
reps and B A on odd ones, as `ab`'s passes do; mode ratios and arm ratios pair passes of one rep.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from . import agent, bench
from .bench import BenchError


@dataclass(frozen=True)
class AgentPlan(bench.ArmServers):
    url: str
    model: str
    arms: dict  # arm -> the pb_knobs it sends; one arm ("A") or two
    levels: list
    modes: list
    reps: int
    warmup: int
    max_tokens: int
    requests: int  # per stream and pass, one-turn modes
    fitted: agent.Fitted
    prompts: dict = field(default_factory=dict)  # level -> [stream][request] -> Prompt
    conversations: dict = field(default_factory=dict)  # level -> [stream] -> (first Prompt, [later turns' texts])
    seed: int = 0
    timeout: float = 600.0
    time_limit: float = 3600.0
    b_url: str | None = None
    b_model: str | None = None  # with b_url: the id B serves when it is another checkpoint of the model

    def runnable(self) -> list[str]:
        return [m for m in self.modes if m not in self.fitted.skipped]


def tools_overhead(count) -> dict:
    """k -> the prompt tokens that the first k agent tools add to a request."""
    from .prompts import Prompt

    bare = Prompt("probe", "probe", "Read the file src/app.py.", system=agent.SESSION_SAMPLE)
    base = count(bare)
    return {k: max(0, count(Prompt("probe", "probe", bare.instruction, system=agent.SESSION_SAMPLE,
                                   tools=agent.TOOLS[:k])) - base) for k in range(1, len(agent.TOOLS) + 1)}


def chars_per_token(texts: agent.Texts, count) -> float:
    """How many characters of text make a token here (code and prose, the model's tokenizer)."""
    from .prompts import Prompt

    chars = tokens = 0
    for i in range(len(texts.tasks)):
        body = texts.body(i, 3000)[:3000]
        p = Prompt("calibrate", "calibrate", "x", body)
        chars += len(body)
        tokens += max(1, count(p) - count(p.cut(0)))
    return chars / tokens


def prepare(url: str, model: str | None, modes: list[str], levels: list[int], requests: int, turns: int,
            prompt_tokens: int | None, turn_tokens: int, max_tokens: int, seed: int, progress=None,
            tasks: list[str] | None = None) -> dict:
    """The server's facts, the fitted lengths and every pass's prompts (built once, used by every
    rep, arm and mode; each request's session line makes it its own)."""
    from .soak import context_length

    info = bench.server_info(url, model)
    count = bench.token_counter(url, info["model"])
    try:
        texts = agent.Texts(seed, tasks)
        fitted = agent.fit_lengths(context_length(url, info["model"]), prompt_tokens, max_tokens, modes, turns,
                                   turn_tokens, tools_overhead(count) if any(
                                       m.startswith("tools") for m in modes) else {})
        cpt = chars_per_token(texts, count)
        say = progress or (lambda *_: None)
        prompts, conversations, i = {}, {}, 0
        single = any(m != "conversation" for m in modes)
        convo = "conversation" in modes and "conversation" not in fitted.skipped
        for level in levels:
            say(f"fitting the prompts of C{level}")
            prompts[level] = [[agent.make_prompt(texts, i + s * requests + r, fitted.text_tokens, count, cpt,
                                                 agent.SESSION_SAMPLE) for r in range(requests)]
                              for s in range(level)] if single else []
            i += level * requests
            if convo:
                conversations[level] = [
                    (agent.make_prompt(texts, i + s * turns, fitted.first_turn_tokens, count, cpt, agent.SESSION_SAMPLE),
                     [agent.turn_message(texts, i + s * turns + t, fitted.turn_tokens, count, cpt)
                      for t in range(1, turns)]) for s in range(level)]
                i += level * turns
    except agent.AgentError as e:
        raise BenchError(str(e), 2) from None
    return {"server": info, "fitted": fitted, "prompts": prompts, "conversations": conversations,
            "chars_per_token": cpt}


def check_modes(plan: AgentPlan) -> str | None:
    """One short request per arm and mode before the run: a refusal ends it, naming both."""
    build = None
    probe = plan.prompts[plan.levels[0]][0][0] if plan.prompts.get(plan.levels[0]) else \
        plan.conversations[plan.levels[0]][0][0]
    for arm in plan.arms:
        for mode in plan.runnable():
            body = agent.body(mode, plan.model_of(arm), probe.messages(), 1, 0, plan.arms[arm], plan.fitted.tools)
            seen = bench.probe_request(plan.url_of(arm), body, plan.timeout, f"arm {arm}, mode {mode}",
                                       f"arm {arm} (pb_knobs {plan.arms[arm]}), mode {mode}",
                                       "; drop the mode from --modes")
            build = build or seen
    return build


def schedule(plan: AgentPlan, restarts: bool = False) -> list[tuple[int, int, str, str]]:
    """(rep, level, mode, arm) in run order. The modes rotate one place a rep; A first on even reps.
    With `restarts` (arms that are server configurations) each rep runs one arm's passes, then the other's."""
    modes, arms = plan.runnable(), list(plan.arms)
    out = []
    for rep in range(-plan.warmup, plan.reps):
        order = arms if rep % 2 == 0 else arms[::-1]
        turn = modes[rep % len(modes):] + modes[:rep % len(modes)]
        if restarts:
            out += [(rep, level, mode, arm) for arm in order for level in plan.levels for mode in turn]
        else:
            out += [(rep, level, mode, arm) for level in plan.levels for mode in turn for arm in order]
    return out


def requests_of(plan: AgentPlan, level: int, mode: str) -> int:
    return level * (plan.fitted.turns if mode in ("conversation", "replay") else plan.requests)


def run_stream(client, plan: AgentPlan, rep: int, level: int, mode: str, arm: str, s: int, epoch: float,
               tick) -> list[dict]:
    """Stream s of a pass: its requests one after another."""
    knobs, model = plan.arms[arm], plan.model_of(arm)
    out = []
    if mode == "conversation":
        first, later = plan.conversations[level][s]
        session = agent.session_line(plan.seed, rep, level, mode, s, arm)
        messages = [{"role": "system", "content": session}, first.messages()[-1]]
        for turn in range(plan.fitted.turns):
            seed = agent.request_seed(plan.seed, rep, level, mode, s, turn)
            rec = bench.run_request(client, plan, agent.body(mode, model, messages, plan.max_tokens, seed, knobs),
                                    epoch, arm, keep_reply=True)
            reply = rec.pop("reply", None)
            rec.update(stream=s, turn=turn, prompt=first.id)
            out.append(rec)
            tick()
            if rec["error"] or turn + 1 == plan.fitted.turns:
                break
            assistant = {"role": "assistant", "content": reply["content"]}
            if reply["reasoning_content"]:
                assistant["reasoning_content"] = reply["reasoning_content"]
            messages = [*messages, assistant, {"role": "user", "content": later[turn]}]
        return out
    if mode == "replay":  # the stream's first prompt, the same bytes every send
        prompt = plan.prompts[level][s][0]
        session = agent.session_line(plan.seed, rep, level, mode, s, arm)
        messages = [{"role": "system", "content": session}, prompt.messages()[-1]]
        for send in range(plan.fitted.turns):
            rec = bench.run_request(client, plan, agent.body(mode, model, messages, plan.max_tokens, 0, knobs),
                                    epoch, arm)
            rec.update(stream=s, turn=send, prompt=prompt.id)
            out.append(rec)
            tick()
            if rec["error"]:
                break
        return out
    for r, prompt in enumerate(plan.prompts[level][s]):
        session = agent.session_line(plan.seed, rep, level, mode, s, r, arm)
        messages = [{"role": "system", "content": session}, prompt.messages()[-1]]
        seed = agent.request_seed(plan.seed, rep, level, s, r)
        rec = bench.run_request(client, plan, agent.body(mode, model, messages, plan.max_tokens, seed, knobs,
                                                         plan.fitted.tools), epoch, arm)
        rec.update(stream=s, turn=r, prompt=prompt.id)
        out.append(rec)
        tick()
    return out


def run_pass(client, plan: AgentPlan, rep: int, level: int, mode: str, arm: str, epoch: float, tick) -> list[dict]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=level, thread_name_prefix=f"agent-{arm}") as pool:
        streams = list(pool.map(lambda s: run_stream(client, plan, rep, level, mode, arm, s, epoch, tick),
                                range(level)))
    wall = time.perf_counter() - t0
    first = list(plan.arms)[0] if rep % 2 == 0 else list(plan.arms)[-1]
    records = [rec for stream in streams for rec in stream]
    for rec in records:
        rec.update(arm=arm, rep=rep, concurrency=level, mode=mode, warmup=rep < 0, first=first, pass_wall_s=wall,
                   pb_knobs=plan.arms[arm])
    return records


def run(plan: AgentPlan, sink, progress=None, switch=None) -> bool:
    """Every pass in order, each pass's records to `sink`; False when the time limit stopped it."""
    passes = schedule(plan, restarts=bool(switch))
    total = sum(requests_of(plan, level, mode) for _, level, mode, _ in passes)
    bar = progress or (lambda *_: None)
    done, lock = [0], threading.Lock()
    epoch = time.perf_counter()
    top = max(plan.levels)
    limits = httpx.Limits(max_connections=top, max_keepalive_connections=top,
                          keepalive_expiry=bench.KEEPALIVE_EXPIRY_S)
    with httpx.Client(limits=limits, timeout=plan.timeout) as client:
        current = None
        for rep, level, mode, arm in passes:
            if time.perf_counter() - epoch > plan.time_limit:
                return False
            if switch and arm != current:
                switch(arm)
                current = arm
            label = f"C{level} {mode} {'warmup' if rep < 0 else f'rep {rep + 1}/{plan.reps}'} {arm}"

            def tick(label=label):
                with lock:
                    done[0] += 1
                    bar(done[0], total, label)

            before = graphs_held(client, plan.url_of(arm))
            records = run_pass(client, plan, rep, level, mode, arm, epoch, tick)
            after = graphs_held(client, plan.url_of(arm))
            for rec in records:  # a capture holds every stream for a step: a pass that had some is warm-up
                rec["graphs_captured"] = None if None in (before, after) else after - before
            sink(records)
    return True


def graphs_held(client, url: str) -> int | None:
    """The CUDA graphs the server's batching engine holds (`pb_cuda_graphs` in its /metrics); None
    where it reports none (no PB_METRICS, or a build without the gauge)."""
    try:
        r = client.get(f"{url}/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    for line in r.text.splitlines():
        if line.startswith("pb_cuda_graphs "):
            return int(float(line.split()[1]))
    return None


def execute(plan: AgentPlan, server: dict, window=None, command: str = "", progress=None, switch=None,
            restarts: dict | None = None, extra: dict | None = None) -> dict:
    """Run the plan, writing the window as it goes when one is given; the summary."""
    from . import agent_report, windows

    records: list[dict] = []

    def sink(batch):
        records.extend(batch)
        if window:
            windows.append_raw(window, batch)

    f = plan.fitted
    config = {"workload": "agent", "url": plan.url, "model": plan.model, "build": server["build"],
              "knobs_hash": server.get("knobs_hash"), "arms": plan.arms, "levels": plan.levels,
              "modes": plan.modes, "skipped": f.skipped, "reps": plan.reps, "warmup": plan.warmup,
              "max_tokens": plan.max_tokens, "requests_per_stream": plan.requests, "turns": f.turns,
              "seed": plan.seed, "context": f.context, "fitted": {
                  "text_tokens": f.text_tokens, "tools": f.tools, "tools_tokens": f.tools_tokens, "first_turn_tokens":
                  f.first_turn_tokens, "turn_tokens": f.turn_tokens, "notes": list(f.notes)},
              "prompts": {str(level): [[p.id for p in stream] for stream in streams]
                          for level, streams in plan.prompts.items()},
              **(extra or {})}
    if plan.b_url:
        config["b_server"] = {"url": plan.b_url, "build": server.get("b_build"),
                              "knobs_hash": server.get("b_knobs_hash"), "model": plan.model_of("B")}
    if restarts:
        config["restarts"] = restarts
    if window:
        windows.write_start(window, command, config)
    complete = run(plan, sink, progress, switch)
    summary = agent_report.summarize(records, plan.levels, plan.runnable(), list(plan.arms), plan.seed)
    summary.update(complete=complete, skipped=f.skipped)
    if window:
        agent_report.write_finish(window, summary, config)
    return {"config": config, "summary": summary}


def from_args(args, arms: dict, url: str, b_url: str | None, levels: list[int], results_dir, command: str,
              restart=None, progress=None, note=None):
    """`ab --workload agent`: settings checked, prompts fitted, arms and modes probed, the run and its
    window. (result, window or None)."""
    from . import windows

    try:
        s = agent.settings(args)
    except agent.AgentError as e:
        raise BenchError(str(e), 2) from None
    say = note or (lambda *_: None)
    ready = prepare(url, args.model, s["modes"], levels, s["requests"], s["turns"], s["prompt_tokens"],
                    s["turn_tokens"], s["max_tokens"], args.seed, say, s["tasks"])
    server, fitted = ready["server"], ready["fitted"]
    for line in fitted.notes:
        say(line)
    for mode, why in fitted.skipped.items():
        say(f"mode {mode} skipped: {why}")
    b_model = getattr(args, "b_model", None)
    if b_url:
        bench.b_server(b_url, server, b_model)
    plan = AgentPlan(url=url, model=server["model"], arms=arms, levels=levels, modes=s["modes"], reps=args.reps,
                     warmup=args.warmup, max_tokens=s["max_tokens"], requests=s["requests"], fitted=fitted,
                     prompts=ready["prompts"], conversations=ready["conversations"], seed=args.seed,
                     timeout=args.timeout, time_limit=args.time_limit, b_url=b_url, b_model=b_model)
    if not plan.runnable():
        raise BenchError("no mode left to run: " + "; ".join(f"{m}: {w}" for m, w in fitted.skipped.items()), 2)
    server["build"] = check_modes(plan) or server["build"]
    window = windows.create(results_dir, args.window) if args.window else None
    result = execute(plan, server, window, command, progress=progress, switch=restart,
                     restarts=restart.describe() if restart else None,
                     extra={"chars_per_token": round(ready["chars_per_token"], 3),
                            "tasks": s["tasks"] or list(agent.TASK_KINDS)})
    return result, window
