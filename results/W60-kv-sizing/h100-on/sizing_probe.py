"""0850 on one H100: one server with an automatically sized pool (no --cb-num-blocks). `score`: the
reference texts forced through it alone and together (to set against W59's bf16 arm, a pool of 320
pages). `load`: `ab` agent greedy+logprobs at C32 and C64 with 600-token prompts, then C16 with
8K-token prompts; /metrics' memory gauges before and after. The server log has the sizing lines."""
import json, os, re, sys
from pathlib import Path

import httpx

from patchbay.device.gpu import parse_env
from patchbay.device.servers import with_server
from patchbay.measure import exact
from patchbay.measure.verbs import run

knobs, out, model, what = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.update(parse_env(knobs, "--env"))


def mem(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(pb_gpu_memory_\w+|pb_kv_blocks_total)\{?[^ ]*\}? (\S+)$",
                                                                  text, re.M)}


def job(url: str) -> int:
    (out / f"mem-{what}-before.json").write_text(json.dumps(mem(url)))
    rc = 0
    if what == "score":
        for together in (False, True):
            scored = exact.score_served(url, model, together=together)
            (out / f"score{'-together' if together else ''}.json").write_text(json.dumps(scored))
    else:
        rc = run("ab", ["--url", url, "--model", model, "--workload", "agent", "--modes", "greedy,logprobs",
                        "--concurrency", "32,64", "--reps", "1", "--warmup", "1", "--requests", "1", "--max-tokens",
                        "96", "--prompt-tokens", "600", "--results-dir", str(out / "res"), "--window", "sizing-600"])
        (out / f"mem-{what}-mid.json").write_text(json.dumps(mem(url)))
        rc |= run("ab", ["--url", url, "--model", model, "--workload", "agent", "--modes", "greedy",
                         "--concurrency", "16", "--reps", "1", "--warmup", "1", "--requests", "1", "--max-tokens",
                         "64", "--prompt-tokens", "8000", "--results-dir", str(out / "res"), "--window", "sizing-8k"])
    (out / f"mem-{what}-after.json").write_text(json.dumps(mem(url)))
    print(what, "after", mem(url), flush=True)
    return rc


sys.exit(with_server(True, 8000, job, log=out / f"server-{what}.log", num_blocks=None, model_name=model))
