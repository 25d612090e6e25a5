"""Run by tests/test_host_threads.py in a fresh interpreter with the patched engine first on
PYTHONPATH and the PB_* variables the test sets: 0440's start-up call, and torch's intra-op
threads before and after it. Prints one JSON line."""

import json

import torch
from transformers._pb.runtime import host_threads
from transformers._pb import knobs

before = torch.get_num_threads()
try:
    knobs.load()  # the check knobs.init makes at server start, which exits on a bad value
    error = None
except knobs.KnobError as e:
    error = str(e)
if error is None:
    knobs.init()
    host_threads.apply()
print(json.dumps({"before": before, "after": torch.get_num_threads(), "error": error}))
