"""0840 on one H100: a server of air12-fp8 with the production set, FP8 weights and PB_KV_INT8; the
reference texts forced through it alone and together (each token's logprob), to set against W58's
arm A (a bf16 cache; its logprobs are the same bits across restarts); then `patchbay ab` at C1 and
C8 with 8K prompts as W58's arms ran it."""
import json, os, sys
from pathlib import Path

from patchbay.device.gpu import parse_env
from patchbay.device.servers import with_server
from patchbay.measure import exact

knobs, out = sys.argv[1], Path(sys.argv[2])
arm = sys.argv[3] if len(sys.argv) > 3 else "int8"
MODEL = "synthetic:air12-fp8"
os.environ.update(parse_env(knobs, "--env"))


def job(url: str) -> int:
    for together in (False, True):
        scored = exact.score_served(url, MODEL, together=together)
        (out / f"score-{arm}{'-together' if together else ''}.json").write_text(json.dumps(scored))
    if os.environ.get("AB", "1") == "0":
        return 0
    from patchbay.measure.verbs import run
    return run("ab", ["--url", url, "--model", MODEL, "--workload", "agent", "--modes", "greedy,sampled",
                      "--concurrency", "1,8", "--reps", "2", "--prompt-tokens", "8000", "--max-tokens", "128",
                      "--results-dir", str(out / f"res-{arm}"), "--window", f"kv-{arm}"])


sys.exit(with_server(True, 8000, job, log=out / f"server-{arm}.log", num_blocks=320, model_name=MODEL))
