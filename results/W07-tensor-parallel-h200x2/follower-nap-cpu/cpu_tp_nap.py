"""CPU A/B of 0200's follower change: two TP=2 pairs of the tiny model, the build before
(A) and after (B), side by side; `patchbay ab` alternates passes between them."""
import os
import sys
from pathlib import Path

from patchbay import gpu
from patchbay.cli import main as patchbay_main
from patchbay.synth import write_tiny

ROOT = Path("/work/main")
model = str(write_tiny(ROOT / ".cache/models/tiny-s0", seed=0))
engines = [ROOT / "build/engines" / name for name in sys.argv[1:3]]
out = Path(sys.argv[3])
knobs = {"PB_TOKENIZE": "1", "PB_FINGERPRINT": "1", "PB_MODELS_INFO": "1"}


def job(procs):
    for n, engine in enumerate(engines):
        os.environ["PYTHONPATH"] = f"{engine}:{ROOT / 'src'}"
        procs += gpu.start_ranks(model, 2, 8090 + n, knobs, out / f"logs-{'AB'[n]}", device="cpu",
                                 engine_args="--cb-num-blocks 64", rdzv_port=29700 + n)
    return patchbay_main(["ab", "--url", "http://127.0.0.1:8090", "--b-url", "http://127.0.0.1:8091",
                          "--model", model, *sys.argv[4:]])


sys.exit(gpu.with_servers(job))
