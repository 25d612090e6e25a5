"""Run by tests/test_sort_free.py in a fresh interpreter with TRITON_INTERPRET=1, the patched
engine first on the path: 0660's Triton kernel against its torch version. Prints one JSON object."""

import json
import os

assert os.environ.get("TRITON_INTERPRET") == "1"

import torch  # noqa: E402
from transformers._pb.runtime import sort_free  # noqa: E402

torch.manual_seed(0)
VOCAB = 3001  # not a multiple of the kernel's block
rows = []  # (name, logits row, top_p, min_p)
for i in range(12):
    rows.append((f"normal-{i}", torch.randn(VOCAB) * 3, (0.95, 0.9, 0.5, 0.99)[i % 4], (0.0, 0.0, 0.05, 0.0)[i % 4]))
rows.append(("ties", torch.round(torch.randn(VOCAB) * 2), 0.8, 0.0))
masked = torch.randn(VOCAB) * 3
masked[::3] = float("-inf")
rows.append(("masked", masked, 0.9, 0.0))
one = torch.full((VOCAB,), float("-inf"))
one[1234] = 0.0
rows.append(("one-token", one, 0.95, 0.0))
rows.append(("flat-tiny-top-p", torch.zeros(VOCAB), 1e-6, 0.0))
rows.append(("flat-uncut", torch.zeros(VOCAB), 1.0, 0.0))
rows.append(("peaked", torch.cat([torch.tensor([30.0, 29.0]), torch.randn(VOCAB - 2)]), 0.95, 0.0))
rows.append(("min-p-only", torch.randn(VOCAB) * 3, 1.0, 0.3))
rows.append(("nothing-allowed", torch.full((VOCAB,), float("-inf")), 0.95, 0.0))

x = torch.stack([r[1] for r in rows])
top_p = torch.tensor([r[2] for r in rows])
min_p = torch.tensor([r[3] for r in rows])
cases = []
for trial in range(3):
    keys = torch.tensor([(977 * i + 7919 * trial) % 2**32 for i in range(len(rows))]) + 2**31
    kernel = sort_free.kernel(x, top_p, min_p, keys).tolist()
    reference = sort_free.reference(x, top_p, min_p, keys).tolist()
    alone = [int(sort_free.kernel(x[i:i + 1], top_p[i:i + 1], min_p[i:i + 1], keys[i:i + 1])) for i in range(len(rows))]
    for i, (name, *_) in enumerate(rows):
        cases.append({"row": name, "trial": trial, "kernel": kernel[i], "reference": reference[i], "alone": alone[i]})
# A row shorter than SPLIT blocks: parts past its end hold nothing.
small = torch.randn(4, 21) * 2
small_top_p, small_min_p = torch.tensor([0.9, 0.5, 1.0, 0.8]), torch.tensor([0.0, 0.1, 0.0, 0.0])
small_keys = torch.tensor([11, 22, 33, 44])
small_equal = [sort_free.kernel(small, small_top_p, small_min_p, small_keys + t).tolist()
               == sort_free.reference(small, small_top_p, small_min_p, small_keys + t).tolist() for t in range(20)]
print(json.dumps({"cases": cases, "one_token": 1234, "small_equal": small_equal}))
