"""PB_HOST_THREADS: how many threads torch's CPU operations may use in the serving process.

Between GPU steps the batching loop prepares the next step's inputs in host tensors: small
operations, but torch splits any of more than 32,768 elements across its intra-op thread pool
(one thread a core by default). Timing hooks in a TP=1 server on an H200 host (16 cores, W14
host-timeline-v10) found one of them, the zeroing of the step's [7, 8,193] int32 input rows
before a cold 8K-token prompt, taking 3-6 ms of the batching thread's CPU where the same call
takes about 0.1 ms on a 2-core machine: the thread waits on the pool's other threads for a
region of microseconds' work, while the GPU sits idle before the prompt's step. The knob sets
torch's intra-op threads when the server starts (0 keeps torch's own); the model's arithmetic
runs on the GPU and does not use them. A server that computes on the CPU should leave it at 0.
"""

import sys

from .. import knobs


def apply() -> None:
    threads = knobs.get("PB_HOST_THREADS")
    if threads:
        import torch

        torch.set_num_threads(threads)
        sys.stderr.write(f"patchbay: PB_HOST_THREADS: torch's CPU operations use {threads} thread(s)\n")
