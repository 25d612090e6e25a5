"""What prompt-lookup drafting would accept on a model's own replies, before the engine drafts.

Prompt-lookup drafting guesses a reply's next tokens from the text it already has: where the last
few tokens (an n-gram) occurred earlier in the prompt or the reply, the tokens that followed them
there are proposed, one forward pass scores them all, and the longest prefix the model agrees with
is kept plus the model's own next token. Issue 26 asks for it with drafted == serial, byte for byte:
then a reply's tokens are the serial reply's whatever was drafted, and what a drafter accepts can be
read off the serial reply alone, by walking the drafter along it (`replay`). This module does that
for the replies a model gives through the engine (`probe`), so the gain drafting can reach, and the
draft length and n-gram sizes worth building, are measured before the engine work:

- tokens a step: reply tokens over verify steps. A step that verifies d drafted tokens reads the
  weights once, so where a step's cost does not grow with its rows (a small model whose steps are
  bound by launches, like synthetic:trained on a GPU) this is the speed-up's ceiling.
- air12 bytes: on an MoE every drafted token routes to its own experts, so a verify step of one
  sequence reads the weights a decode step of d + 1 sequences reads (`roofline.step_params`); the
  estimate divides the reply's tokens by the steps' bytes against plain decode's.

Each draft length is walked fixed and adaptive (a step drafts one more token than the last step
kept, up to the longest), over two ranges of n-gram sizes.

`python -m patchbay drafts` runs it on `synthetic:trained` (a model that copies what it has read):
edits of held-out standard-library files and summaries of prose, greedy and sampled.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass

from .. import ROOT

# Draft lengths and n-gram ranges (longest, shortest) the report compares.
DRAFT_LENGTHS = (1, 2, 4, 8)
ADAPTIVE_MAX = 8  # the adaptive rows' longest draft
NGRAMS = ((4, 2), (3, 1))
EDIT_INSTRUCTION = ("Here is a file of our repository. Add type hints where they are missing and fix anything "
                    "you think is a bug. Reply with the whole edited file.")
PROSE_INSTRUCTION = "Summarize the text below in five bullet points for a new team member."


def _engine_lookup():
    """engine/_pb/runtime/draft_lookup.py as a module of its own (stdlib only): the class the
    engine drafts with, so what this measures is what the engine would keep."""
    spec = importlib.util.spec_from_file_location("patchbay._engine_draft_lookup",
                                                  ROOT / "engine" / "_pb" / "runtime" / "draft_lookup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Lookup = _engine_lookup().Lookup


@dataclass
class Replay:
    """One reply walked by a drafter: its verify steps and what they drafted and kept."""
    tokens: int
    steps: int
    drafted: int  # tokens proposed over all steps
    accepted: int  # of them, kept
    step_drafts: list[int]  # tokens proposed at each step
    from_reply: int = 0  # of the kept ones, those copied from the reply itself (a loop), not the prompt

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def replay(prompt: list[int], reply: list[int], k: int, longest: int = 4, shortest: int = 2,
           adaptive: bool = False) -> Replay:
    """The verify steps a drafter of up to k tokens takes along `reply` (the serial reply to
    `prompt`): each step keeps the drafted tokens that agree with the reply, then the model's own.
    `adaptive`: k is the most a step drafts; a step drafts one more than the last step kept
    (starting at k), so a request whose drafts miss drafts little."""
    look = Lookup(prompt, longest, shortest)
    pos = drafted = accepted = from_reply = 0
    step_drafts = []
    length = k
    while pos < len(reply):
        start, guess = look.match(length) if length > 0 else (-1, [])
        agree = 0
        while agree < len(guess) and pos + agree < len(reply) and guess[agree] == reply[pos + agree]:
            agree += 1
        advance = min(agree + 1, len(reply) - pos)  # past the reply's end nothing is kept
        look.extend(reply[pos:pos + advance])
        pos += advance
        drafted += len(guess)
        accepted += advance - 1
        from_reply += advance - 1 if start >= len(prompt) else 0
        step_drafts.append(len(guess))
        if adaptive and guess:
            length = min(k, agree + 1)
    return Replay(len(reply), len(step_drafts), drafted, accepted, step_drafts, from_reply)


def bytes_speedup(runs: list[Replay], config) -> float:
    """Plain decode's weight bytes over drafting's for the same tokens, one sequence, where a
    verify step of d drafts reads what a decode step of d + 1 sequences reads (see the module)."""
    from .roofline import step_params

    cost = {}
    plain = sum(r.tokens for r in runs) * step_params(config, 1)
    drafting = 0.0
    for r in runs:
        for d in r.step_drafts:
            if d not in cost:
                cost[d] = step_params(config, d + 1)
            drafting += cost[d]
    return plain / drafting if drafting else 0.0


# ---- the replies, inside the engine ------------------------------------------------------------


def prompts(tok, budget: int) -> list[tuple[str, list[int]]]:
    """(kind, prompt ids) in plain text, the way synthetic:trained was trained (it has never seen a
    chat template, and after one its replies are noise): an edit of each held-out standard-library
    file (the instruction, the file, and the reply begun with the file's first line, as a model that
    rewrites a file starts), and a summary of each part of the long article (new text, where
    drafts mostly miss). Each text is cut to about `budget` tokens."""
    from ..runtime.trained import held_out_files
    from .prompt_texts import LONG_ARTICLE

    def cut(text: str) -> str:
        return tok.decode(tok(text, add_special_tokens=False)["input_ids"][:budget])

    paragraphs = [p for p in LONG_ARTICLE.split("\n\n") if p.strip()]
    quarter = -(-len(paragraphs) // 4)
    parts = ["\n\n".join(paragraphs[i:i + quarter]) for i in range(0, len(paragraphs), quarter)]
    texts = []
    for path in held_out_files():
        body = cut(path.read_text())
        first = body.splitlines()[0]
        texts.append(("edit", f"# {EDIT_INSTRUCTION}\n\n{body}\n\n# The whole edited file:\n\n{first}\n"))
    texts += [("prose", f"{cut(part)}\n\n{PROSE_INSTRUCTION}\n\n-") for part in parts]
    return [(kind, tok(text, add_special_tokens=False)["input_ids"]) for kind, text in texts]


def probe(model_dir: str, max_tokens: int = 256, budget: int = 1024, seed: int = 0) -> dict:
    """Each prompt's greedy and sampled replies as token ids, from continuous batching in the engine
    on sys.path (run in the engine's environment: `probe_engine`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, ContinuousBatchingConfig, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    asked = prompts(tok, budget)
    eos = model.generation_config.eos_token_id
    modes = {"greedy": GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos),
             "sampled": GenerationConfig(max_new_tokens=max_tokens, do_sample=True, temperature=0.7, top_p=0.95,
                                         top_k=0, eos_token_id=eos)}
    blocks = -(-(budget + 128 + max_tokens) // 256) * len(asked) + 8
    out = {"model": model_dir, "max_tokens": max_tokens, "records": []}
    for mode, config in modes.items():
        torch.manual_seed(seed)
        cache = ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=2048)
        batch = model.generate_batch(inputs=[ids for _, ids in asked], generation_config=config,
                                     continuous_batching_config=cache, progress_bar=False)
        for key in sorted(batch, key=lambda k: int(str(k).rsplit("_", 1)[-1])):
            index = int(str(key).rsplit("_", 1)[-1])
            kind, ids = asked[index]
            out["records"].append({"mode": mode, "kind": kind, "prompt": ids,
                                   "reply": list(batch[key].generated_tokens)})
    return out


def probe_engine(engine_env: dict[str, str], model_dir: str, max_tokens: int) -> dict:
    """`probe` in a fresh interpreter whose transformers is the given engine."""
    from .exact import run_in_engine

    return run_in_engine("patchbay.measure.draft", [model_dir, str(max_tokens)], engine_env, "the drafting probe",
                         timeout=3600)


# ---- the report ---------------------------------------------------------------------------------


def summarize(records: list[dict], air_config=None) -> list[dict]:
    """One row per (kind, mode, draft length, n-grams): tokens a step, acceptance, and where
    `air_config` is given the bytes-bound speed-up on its geometry."""
    rows = []
    groups = sorted({(r["kind"], r["mode"]) for r in records})
    for kind, mode in groups:
        chosen = [r for r in records if r["kind"] == kind and r["mode"] == mode]
        for longest, shortest in NGRAMS:
            for k, adaptive in [(k, False) for k in DRAFT_LENGTHS] + [(ADAPTIVE_MAX, True)]:
                runs = [replay(r["prompt"], r["reply"], k, longest, shortest, adaptive) for r in chosen]
                tokens, steps = sum(r.tokens for r in runs), sum(r.steps for r in runs)
                drafted, accepted = sum(r.drafted for r in runs), sum(r.accepted for r in runs)
                row = {"kind": kind, "mode": mode, "k": f"<={k} adaptive" if adaptive else k,
                       "ngrams": f"{longest}..{shortest}",
                       "replies": len(runs), "tokens": tokens, "steps": steps,
                       "tokens_per_step": tokens / steps if steps else 0.0,
                       "drafted": drafted, "accepted": accepted,
                       "acceptance": accepted / drafted if drafted else 0.0,
                       "steps_drafting": sum(1 for r in runs for d in r.step_drafts if d),
                       "from_reply": sum(r.from_reply for r in runs)}
                if air_config is not None:
                    row["air12_bytes_speedup"] = bytes_speedup(runs, air_config)
                rows.append(row)
    return rows


def headline(rows: list[dict], name: str) -> str:
    """The adaptive drafter's tokens a step on edits and its air12 bytes where drafts miss most."""
    def row(kind, mode):
        return next(r for r in rows if r["kind"] == kind and r["mode"] == mode and r["ngrams"] == "4..2"
                    and str(r["k"]).endswith("adaptive"))

    parts = []
    for kind, mode in (("edit", "greedy"), ("edit", "sampled"), ("prose", "sampled")):
        r = row(kind, mode)
        parts.append(f"{kind} {mode} {r['tokens_per_step']:.2f} tokens a step (air12 bytes "
                     f"x{r.get('air12_bytes_speedup', 0.0):.3f})")
    return f"prompt-lookup (K adaptive <= {ADAPTIVE_MAX}, n-grams 4..2) on {name}'s replies: " + "; ".join(parts)


def render(rows: list[dict]) -> str:
    lines = ["| kind | mode | n-grams | K | replies | tokens | steps drafting | acceptance | kept from the reply "
             "| tokens a step | air12 bytes |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        air = f"x{r['air12_bytes_speedup']:.3f}" if "air12_bytes_speedup" in r else "-"
        lines.append(f"| {r['kind']} | {r['mode']} | {r['ngrams']} | {r['k']} | {r['replies']} | {r['tokens']} | "
                     f"{r['steps_drafting']} of {r['steps']} | {r['acceptance']:.3f} | {r['from_reply']} of {r['accepted']} | "
                     f"{r['tokens_per_step']:.3f} | {air} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m patchbay.measure.draft MODEL_DIR MAX_TOKENS\n")
        return 2
    print(json.dumps(probe(argv[0], int(argv[1]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
