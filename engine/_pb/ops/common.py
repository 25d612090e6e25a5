"""What the ops share, defined once: where Triton runs, sizes, the dtype codes the kernels round
to, the kernel modules, and the one way an op puts its function in upstream's place and back.

Importing this module does not import Triton (a CPU engine without it still starts).
"""

import functools
import importlib
import importlib.util
import os
import sys

import torch

# Triton drives CUDA devices, and the CPU only through its interpreter (the tests).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
TRITON = importlib.util.find_spec("triton") is not None
# the MODE a kernel takes for the dtype it rounds to (kernels.rounding.round_to)
MODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


@functools.cache
def kernels(name: str):
    """ops.kernels.<name>, imported at an op's first launch: importing it imports Triton, and
    jit-decorates under the interpreter when TRITON_INTERPRET is set."""
    return importlib.import_module(f"{__package__}.kernels.{name}")


class Swap:
    """One upstream attribute an op puts its own version in place of at model load: `owner()`
    gives the class or module that holds it (imported when first needed, not at engine start).
    `install` replaces it once (a second model load keeps the first original), `upstream` is the
    original the op falls back to (installed or not), `restore` puts it back (in-process A/Bs
    and tests)."""

    def __init__(self, owner, name: str):
        self.owner, self.name, self.saved = owner, name, None

    def install(self, new, note: str = "") -> None:
        if self.saved is None:
            holder = self.owner()
            self.saved = getattr(holder, self.name)
            setattr(holder, self.name, new)
            if note:
                sys.stderr.write(f"patchbay: {note}\n")

    def upstream(self):
        return self.saved if self.saved is not None else getattr(self.owner(), self.name)

    def restore(self) -> None:
        if self.saved is not None:
            setattr(self.owner(), self.name, self.saved)
            self.saved = None
