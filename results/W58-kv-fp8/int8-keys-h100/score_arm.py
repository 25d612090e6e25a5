"""0840 on one H100: a server of air12-fp8 with the production set, FP8 weights, PB_KV_FP8 and
PB_KV_INT8_KEYS; the reference texts forced through it alone and together (each token's logprob),
to set against W58's arm A (a bf16 cache, the same logprobs in two calls)."""
import json, os, sys
from pathlib import Path

from patchbay.device.gpu import parse_env
from patchbay.device.servers import with_server
from patchbay.measure import exact

knobs, out = sys.argv[1], Path(sys.argv[2])
MODEL = "synthetic:air12-fp8"
os.environ.update(parse_env(knobs, "--env"))


def job(url: str) -> int:
    for together in (False, True):
        scored = exact.score_served(url, MODEL, together=together)
        (out / f"score-C{'-together' if together else ''}.json").write_text(json.dumps(scored))
    return 0


sys.exit(with_server(True, 8000, job, log=out / "server-C.log", num_blocks=320, model_name=MODEL))
