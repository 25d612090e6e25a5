"""The engine process's environment, defined once.

Every engine process patchbay starts gets ENGINE: the local launcher's ranks (launch), the
serving image's every command (its entry point is this module), and GPU jobs
(scripts/gpu-run.sh execs through this module). Each tensor-parallel rank also gets the
standard torch.distributed variables from `rank()`, NVLink multicast off among them.

    python -m patchbay.runtime.procenv [--ranks] -- CMD ARGS...

runs CMD with ENGINE added to the environment (and NO_MULTICAST with --ranks). Standard
library only: it runs in the image and on GPU machines before anything else is installed.
"""

from __future__ import annotations

import os
import sys

# Nothing fetched at run time (weights and tokenizers come from local folders), no tokenizer
# thread pools behind the server's back, logs as they happen.
ENGINE = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
          "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
# NVLink multicast (NVLS, symmetric-memory multicast) stays off on every rank: the machines this
# runs on do not allow it.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def rank(rank: int, world_size: int, master_addr: str, master_port: int, local_rank: int | None = None
         ) -> dict[str, str]:
    """One tensor-parallel rank's torch.distributed environment (local_rank: its GPU on the node,
    the rank itself unless told)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank if local_rank is None else local_rank),
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), **NO_MULTICAST}


def main(argv: list[str]) -> int:
    ranks = argv[:1] == ["--ranks"]
    rest = argv[1:] if ranks else argv
    if rest[:1] != ["--"] or len(rest) < 2:
        sys.stderr.write("usage: python -m patchbay.runtime.procenv [--ranks] -- CMD ARGS...\n")
        return 2
    cmd = rest[1:]
    os.execvpe(cmd[0], cmd, {**os.environ, **ENGINE, **(NO_MULTICAST if ranks else {})})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
