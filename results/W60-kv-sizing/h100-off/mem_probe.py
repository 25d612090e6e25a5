"""Does a production server with an automatically sized KV pool survive logprobs at C32/C64? One
server of air12 (bf16) or air12-fp8, no --cb-num-blocks, `ab` agent greedy+logprobs; /metrics'
memory gauges before and after; the server log's sizing lines and errors."""
import json, os, re, sys, time
from pathlib import Path

import httpx

from patchbay.device.gpu import parse_env
from patchbay.device.servers import with_server
from patchbay.measure.verbs import run

knobs, out, model, levels = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.update(parse_env(knobs, "--env"))


def mem(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(pb_gpu_memory_\w+|pb_kv_blocks_total)\{?[^ ]*\}? (\S+)$", text, re.M)}


def job(url: str) -> int:
    (out / "mem-before.json").write_text(json.dumps(mem(url)))
    rc = run("ab", ["--url", url, "--model", model, "--workload", "agent", "--modes", "greedy,logprobs",
                    "--concurrency", levels, "--reps", "2", "--warmup", "1", "--requests", "1", "--max-tokens", "96",
                    "--prompt-tokens", "600", "--results-dir", str(out / "res"), "--window", "mem-probe"])
    try:
        (out / "mem-after.json").write_text(json.dumps(mem(url)))
        print("after", mem(url), flush=True)
    except Exception as e:
        print("metrics failed:", e, flush=True)
    return rc


sys.exit(with_server(True, 8000, job, log=out / "server.log", num_blocks=None, model_name=model))
