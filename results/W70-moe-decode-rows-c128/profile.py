"""Decode steps of the production set (one GPU) at 1-128 streams under torch.profiler: where a step
goes at C32 and C128. argv: OUT"""
import json, subprocess, sys
from patchbay.device.gpu import parse_env

knobs = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0}', "env")
setting = {"use_cuda_graph": True, "knobs": knobs}
rows = {"use_cuda_graph": True, "knobs": {**knobs, "PB_MOE_DECODE_ROWS": "16"}}
sys.exit(subprocess.call([sys.executable, "-m", "patchbay.device", "profile", "--out", sys.argv[1],
                          "--setting", "production=" + json.dumps(setting),
                          "--setting", "decode-rows-16=" + json.dumps(rows), "--levels", "64,128,192",
                          "--profile-levels", "128", "--tokens", "128", "--profile-tokens", "16",
                          "--prompt-tokens", "600"]))
