"""One arm of 0830's A/B on one H100 (two air12-fp8 servers do not fit side by side: each builds
air12 in bf16 first): a server of air12-fp8 with the arm's knobs, `patchbay ab` against it, the
reference texts forced through it alone and together (teacher-forced logprobs), its /metrics."""
import json, os, sys, time
from pathlib import Path

from patchbay.device.gpu import parse_env
from patchbay.device.servers import with_server
from patchbay.measure import exact
from patchbay.measure.verbs import run

arm, knobs, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
MODEL = "synthetic:air12-fp8"
os.environ.update(parse_env(knobs, "--env"))


def job(url: str) -> int:
    import httpx
    t0 = time.time()
    rc = run("ab", ["--url", url, "--model", MODEL, "--workload", "agent", "--modes", "greedy,sampled",
                    "--concurrency", "1,8", "--reps", "2", "--prompt-tokens", "8000", "--max-tokens", "128",
                    "--results-dir", str(out / f"res-{arm}"), "--window", f"kv-fp8-{arm.lower()}"])
    t1 = time.time()
    for together in (False, True):
        scored = exact.score_served(url, MODEL, together=together)
        (out / f"score-{arm}{'-together' if together else ''}.json").write_text(json.dumps(scored))
    (out / f"metrics-{arm}.txt").write_text(httpx.get(url + "/metrics").text)
    print(f"arm {arm}: ab {t1 - t0:.0f} s, score {time.time() - t1:.0f} s", flush=True)
    return rc


sys.exit(with_server(True, 8000, job, log=out / f"server-{arm}.log", num_blocks=320, model_name=MODEL))
