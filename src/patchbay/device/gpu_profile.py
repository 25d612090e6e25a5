"""Where a decode step of the batching engine goes, on the GPU, for engine settings side by side.

    python -m patchbay.device profile --out DIR [--setting NAME=JSON ...] [--levels 1,8,32]

Runs in one process on the GPU machine (through scripts/gpu-run.sh): air12 is built from its seed,
then for each setting a fresh continuous-batching manager is made the way `transformers serve`
makes it (no warm-up call: graphs are captured on first use), a pass of C identical greedy
requests warms it, and a second pass is timed. For the levels in --profile-levels a third, shorter
pass runs under torch.profiler; its kernels are summed by name and sorted into the categories of
a decode step (experts, dense GEMMs, attention, gathers, sampling, the rest), and the step's wall
time minus the GPU's busy time is the launch/host gap.

A setting is a JSON object of ContinuousBatchingConfig fields plus "experts" (the model's experts
implementation; left out, the one the setting's knobs choose at load, as a server's load does:
0220's pb_triton with PB_FUSED_MOE on), "knobs" (PB_* variables set while the manager is made and
runs) and "levels" (this setting's own concurrency levels), e.g.
    graphs={"use_cuda_graph": true}
    pow2={"use_cuda_graph": true, "knobs": {"PB_DECODE_BUCKETS": "1"}}
Writes profile.json (every pass and the top kernels) and command.txt, and prints one line per
pass. `profile window` (profile_window) turns such folders, brought back from the GPU machine,
into a results window.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import time
from pathlib import Path

from ..runtime import load_hooks

DEFAULT_SETTINGS = {
    "graphs": {"use_cuda_graph": True},
    "graphs-batched": {"use_cuda_graph": True, "experts": "batched_mm"},
    "eager": {"use_cuda_graph": False},
}

# Kernel name patterns, first match wins; a step's kernels are summed per category.
CATEGORIES = [
    # tensor parallelism's collectives (NCCL kernels; gloo runs on the host)
    ("collective", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter", re.I)),
    # upstream's grouped_mm experts run CUTLASS grouped GEMMs (GroupProblemShape in the name)
    ("experts", re.compile(r"GroupProblemShape|grouped_mm|pb_moe_|fused_moe|bmm")),
    ("attention", re.compile(r"fmha|flash|attention|attn|sdpa|softmax", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|sm90_|sm80_|xmma|cublas", re.I)),
    ("gather/scatter", re.compile(r"index|gather|scatter|copy_kernel|cat|unrolled_elementwise_kernel.*copy", re.I)),
    ("sampling", re.compile(r"argmax|multinomial|sort|topk|cumsum|reduce", re.I)),
]


def categorize(name: str) -> str:
    for category, pattern in CATEGORIES:
        if pattern.search(name):
            return category
    return "other"


def parse_setting(text: str) -> tuple[str, dict]:
    name, sep, body = text.partition("=")
    if not sep:
        if name not in DEFAULT_SETTINGS:
            raise SystemExit(f"unknown setting {name!r}; known: {', '.join(DEFAULT_SETTINGS)} or NAME=JSON")
        return name, dict(DEFAULT_SETTINGS[name])
    try:
        value = json.loads(body)
    except ValueError as e:
        raise SystemExit(f"setting {name}: not JSON ({e})")
    if not isinstance(value, dict):
        raise SystemExit(f"setting {name}: expected a JSON object")
    return name, value


class Knobs:
    """PB_* variables set for the life of one manager (read by the engine's patches at use)."""

    def __init__(self, knobs: dict, model=None, experts: str | None = None):
        self.knobs, self.saved, self.model = {k: str(v) for k, v in knobs.items()}, {}, model
        self.experts, self.chosen, self.built = experts, None, None

    def __enter__(self):
        for key, value in self.knobs.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value
        self.reload(check=True)
        # Patches that decide at model load: apply them as a load would, undo on exit. The experts
        # implementation is one of those choices (0220's pb_triton with PB_FUSED_MOE on): given no
        # `experts`, the model runs what the load would have chosen, else what it was built with.
        kwargs = load_hooks.apply(self.model)
        if self.model is not None:
            self.built = self.model.config._experts_implementation
            self.chosen = self.experts or kwargs.get("experts_implementation") or self.built
            if self.chosen == "pb_triton":  # 0220's fused kernels: registered by the patched engine on demand
                from transformers._pb.ops import fused_moe

                fused_moe.register()
            self.model.set_experts_implementation(self.chosen)
        return self

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.reload(check=False)
        load_hooks.restore()
        if self.built is not None:  # the next setting starts from the model as it was built
            self.model.set_experts_implementation(self.built)

    def reload(self, check: bool) -> None:
        """The knob runtime reads the environment once: read it again, and check that every knob
        asked for is in effect (a pristine engine has no knobs to set)."""
        try:
            from transformers._pb import knobs
        except ImportError:
            if self.knobs and check:
                raise SystemExit(f"knobs {sorted(self.knobs)} asked for, but this engine has no knob runtime")
            return
        try:
            knobs.load()
        except knobs.KnobError as e:
            raise SystemExit(f"setting knobs: {e}") from None
        for key, value in self.knobs.items() if check else ():
            if knobs._show(knobs.get(key)) != knobs._show(knobs.parse(key, value)):
                raise SystemExit(f"{key}={value} is not in effect")


def prompts_for(prompt: list[int], concurrency: int, vocab: int | None) -> list[list[int]]:
    """C copies of `prompt`, or with `vocab` C prompts of its length, request i's tokens shifted by
    a step of its own: distinct replies, so an MoE step's rows route to their own experts as
    distinct users' do (identical requests all read the same few experts)."""
    if vocab is None:
        return [prompt] * concurrency
    return [[(t + 7919 * (i + 1)) % vocab for t in prompt] for i in range(concurrency)]


def run_pass(manager, prompt: list[int], concurrency: int, tokens: int, vocab: int | None = None) -> dict:
    """C requests at once (identical, or distinct with `vocab`: prompts_for); wall time from submit
    to the last one finished."""
    t0 = time.perf_counter()
    ids = [manager.add_request(p, max_new_tokens=tokens, record_timestamps=True)
           for p in prompts_for(prompt, concurrency, vocab)]
    pending, first, outputs = set(ids), {}, {}
    while pending:
        result = manager.get_result(timeout=60)
        if result is None:
            raise RuntimeError(f"no result in 60 s ({len(pending)} pending)")
        if result.is_finished():
            pending.discard(result.request_id)
            outputs[result.request_id] = result
    wall = time.perf_counter() - t0
    generated = [len(o.generated_tokens) for o in outputs.values()]
    distinct = len({tuple(o.generated_tokens) for o in outputs.values()})
    replies = hashlib.sha256(json.dumps([outputs[i].generated_tokens for i in ids]).encode()).hexdigest()[:16]
    decode = []
    for o in outputs.values():
        stamps = getattr(o, "timestamps", None) or []
        if len(stamps) >= 2:
            decode.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    return {"concurrency": concurrency, "tokens": tokens, "wall_s": wall, "generated": sum(generated),
            "aggregate_tok_s": sum(generated) / wall, "distinct_replies": distinct,
            "per_stream_decode_tok_s": sorted(decode)[len(decode) // 2] if decode else None,
            "replies_sha": replies, "first_reply_head": outputs[ids[0]].generated_tokens[:8]}


def run_prefill(manager, vocab: int, length: int, reps: int, salt: int = 0) -> dict:
    """Cold prompts of `length` tokens, one at a time, one token each: time to the first token.
    Each prompt has its own tokens (no prefix-cache hit; another `salt`, other prompts); the
    first one is a warm-up."""
    times, warmup = [], None
    for rep in range(reps + 1):
        prompt = [(7 + 9973 * (rep + 1 + salt) * (i + 1)) % vocab for i in range(length)]
        t0 = time.perf_counter()
        rid = manager.add_request(prompt, max_new_tokens=1)
        while True:
            result = manager.get_result(request_id=rid, timeout=120)
            if result is None:
                raise RuntimeError("no prefill result in 120 s")
            if result.is_finished():
                break
        if rep:
            times.append(time.perf_counter() - t0)
        else:
            warmup = time.perf_counter() - t0
    return {"prefill_tokens": length, "ttft_s": sorted(times)[len(times) // 2] if times else None,
            "ttft_all_s": times, "warmup_s": warmup}


def _causal_steps() -> dict:
    """0270's count of the steps it marked causal, or the condition that kept each one masked."""
    try:
        from transformers._pb.runtime import causal_prefill
    except ImportError:
        return {}
    return dict(getattr(causal_prefill, "STEPS", {}))


def profiled_steps(run, steps: int, wall_ms) -> dict:
    """run() under torch.profiler: the kernel table over its `steps` steps, with the wall time a
    step that wall_ms(run's result) gives, and the host gap."""
    import torch

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = run()
        torch.cuda.synchronize()
    table = kernel_table(prof, steps)
    table["wall_ms_per_step"] = wall_ms(result)
    table["gap_ms_per_step"] = table["wall_ms_per_step"] - table["gpu_busy_ms_per_step"]
    return table


def profile_prefill(manager, vocab: int, length: int) -> dict:
    """The kernels of a cold prompt, by category (two prompts of their own under the profiler;
    `wall_ms_per_step` is one prompt's time to its first token)."""
    return profiled_steps(lambda: run_prefill(manager, vocab, length, 1, salt=100), 2,
                          lambda timed: (timed["warmup_s"] + timed["ttft_s"]) * 1000 / 2)


def kernel_table(prof, steps: int) -> dict:
    """Per-step GPU time by kernel name and by category, from a profiler run of `steps` steps."""
    kernels: dict[str, list] = {}
    busy = []
    for event in prof.events():
        if event.device_type.name != "CUDA" or event.device_time <= 0:
            continue
        entry = kernels.setdefault(event.name, [0.0, 0])
        entry[0] += event.device_time
        entry[1] += 1
        busy.append((event.time_range.start, event.time_range.end))
    busy.sort()
    merged, cur = 0.0, None
    for start, end in busy:  # union of kernel intervals: the GPU's busy time
        if cur is None or start > cur[1]:
            if cur:
                merged += cur[1] - cur[0]
            cur = [start, end]
        else:
            cur[1] = max(cur[1], end)
    if cur:
        merged += cur[1] - cur[0]
    by_category: dict[str, float] = {}
    for name, (us, _) in kernels.items():
        category = categorize(name)
        by_category[category] = by_category.get(category, 0.0) + us
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:40]
    return {"steps": steps, "gpu_busy_ms_per_step": merged / 1000 / steps,
            "category_ms_per_step": {k: v / 1000 / steps for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])},
            "top_kernels": [{"name": n[:160], "ms_per_step": us / 1000 / steps, "calls_per_step": c / steps,
                             "category": categorize(n)} for n, (us, c) in top]}


STEP_COLUMNS = ["experts", "gemm", "attention", "gather/scatter", "sampling", "collective", "other"]
STEP_HEADER = ("| experts | other GEMMs | attention | gather / copy | sampling | collectives | other kernels "
               "| host gap |")


def step_table_row(label: str, prof: dict) -> str:
    """One decode step's milliseconds by category (the kernels re-sorted by today's categories,
    so an older run's table reads the same), its GPU busy time and its host gap."""
    totals: dict[str, float] = {}
    for kernel in prof["top_kernels"]:
        category = categorize(kernel["name"])
        totals[category] = totals.get(category, 0.0) + kernel["ms_per_step"]
    unlisted = sum(prof["category_ms_per_step"].values()) - sum(k["ms_per_step"] for k in prof["top_kernels"])
    totals["other"] = totals.get("other", 0.0) + unlisted
    gap = prof["wall_ms_per_step"] - prof["gpu_busy_ms_per_step"]
    return (f"| {label} | {prof['wall_ms_per_step']:.2f} | {prof['gpu_busy_ms_per_step']:.2f} | "
            + " | ".join(f"{totals.get(c, 0.0):.2f}" for c in STEP_COLUMNS) + f" | {gap:.2f} |")


def main(argv: list[str]) -> int:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from ..measure import roofline
    from .servers import AIR12, MODELS, build_model

    p = argparse.ArgumentParser(prog="python -m patchbay.device profile")
    p.add_argument("--out", required=True)
    p.add_argument("--setting", action="append", default=[], help="NAME or NAME=JSON (repeatable)")
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--tokens", type=int, default=256, help="reply length of the timed pass")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--profile-levels", default="1,32")
    p.add_argument("--profile-tokens", type=int, default=24)
    p.add_argument("--prefill", type=int, default=0, help="also time a cold prompt of this many tokens (TTFT)")
    p.add_argument("--distinct-prompts", action="store_true",
                   help="each request of a pass its own prompt (its own replies and, on an MoE model, its own "
                        "experts); default: C identical requests")
    p.add_argument("--model", help="a checkpoint directory instead of air12 (a CPU smoke run takes the tiny one)")
    p.add_argument("--synthetic", default=AIR12, choices=MODELS,
                   help="without --model, what is built on the GPU (the FP8 ones want PB_FP8_WEIGHTS=1 in a "
                   "setting's knobs)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = [parse_setting(s) for s in (args.setting or list(DEFAULT_SETTINGS))]
    levels = [int(x) for x in args.levels.split(",")]
    profile_levels = {int(x) for x in args.profile_levels.split(",") if x}

    t0 = time.monotonic()
    cuda = torch.cuda.is_available()
    if args.model:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model, device_map="cuda" if cuda else "cpu").eval()
    else:
        model = build_model(args.synthetic)
    config = model.config
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    if cuda:
        torch.cuda.synchronize()
    print(f"{args.model or args.synthetic} ready in {time.monotonic() - t0:.1f}s on {device_name}", flush=True)
    prompt = [(1000 + 37 * i) % config.vocab_size for i in range(args.prompt_tokens)]
    try:
        from transformers._pb.knobs import build_info

        build = build_info().get("build_id")
    except ImportError:
        import transformers

        build = f"transformers-{transformers.__version__} (pristine)"
    record = {"device": device_name, "torch": torch.__version__, "model": args.model or args.synthetic,
              "build": build, "settings": {}, "passes": [], "distinct_prompts": args.distinct_prompts}
    distinct = config.vocab_size if args.distinct_prompts else None
    (out / "command.txt").write_text("python -m patchbay.device profile " + shlex.join(argv) + "\n")
    for name, setting in settings:
        setting = dict(setting)
        experts = setting.pop("experts", None)  # None: what the setting's knobs choose at load, as a server's load
        knobs = setting.pop("knobs", {})
        setting_levels = setting.pop("levels", levels)
        gen = GenerationConfig(do_sample=False, max_new_tokens=args.tokens, eos_token_id=-1, pad_token_id=0)
        with Knobs(knobs, model, experts) as applied:
            record["settings"][name] = {"experts": applied.chosen, "knobs": knobs, "cb_config": setting}
            print(f"{name}: experts {applied.chosen}", flush=True)
            try:
                manager = model.init_continuous_batching(generation_config=gen,
                                                         continuous_batching_config=ContinuousBatchingConfig(**setting))
                manager.start()
            except Exception as e:
                print(f"{name}: cannot start: {type(e).__name__}: {e}", flush=True)
                record["passes"].append({"setting": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                continue
            try:
                if args.prefill:
                    row = {"setting": name}
                    try:
                        before = _causal_steps()
                        row.update(run_prefill(manager, config.vocab_size, args.prefill, 2))
                        after = _causal_steps()
                        if after:  # 0270 on: how the prompts' steps were marked
                            row["causal_prefill_steps"] = {k: v - before.get(k, 0) for k, v in after.items()}
                        if cuda:
                            row["profile"] = profile_prefill(manager, config.vocab_size, args.prefill)
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    record["passes"].append(row)
                    print(json.dumps(row), flush=True)
                for level in setting_levels:
                    row = {"setting": name}
                    try:
                        run_pass(manager, prompt, level, args.tokens, distinct)  # warm: graphs for these shapes
                        row.update(run_pass(manager, prompt, level, args.tokens, distinct))
                        roof = roofline.tokens_per_s(config, level)
                        row["roofline_tok_s"] = roof
                        row["of_roofline"] = row["aggregate_tok_s"] / roof
                        if level in profile_levels and cuda:
                            row["profile"] = profiled_steps(
                                lambda: run_pass(manager, prompt, level, args.profile_tokens, distinct), args.profile_tokens,
                                lambda timed: timed["wall_s"] * 1000 / args.profile_tokens)
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    record["passes"].append(row)
                    brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                             if k not in ("profile", "first_reply_head")}
                    if "profile" in row:
                        brief["step_ms"] = {k: round(v, 3) for k, v in row["profile"]["category_ms_per_step"].items()}
                        brief["busy_ms"] = round(row["profile"]["gpu_busy_ms_per_step"], 3)
                        brief["wall_ms"] = round(row["profile"]["wall_ms_per_step"], 3)
                    print(json.dumps(brief), flush=True)
                    (out / "profile.json").write_text(json.dumps(record, indent=1) + "\n")
            finally:
                manager.stop(block=True, timeout=30)
                manager.destroy()
                if hasattr(model, "_cached_continuous_batching_manager"):
                    del model._cached_continuous_batching_manager
                if cuda:
                    torch.cuda.empty_cache()
    (out / "profile.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0
