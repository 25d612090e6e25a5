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


def fp8_depth(scale_k: int, *starts: int) -> int | None:
    """0810: the depth (BLOCK_K) of a float8 product's steps: each step must lie in one scale column
    (`scale_k` columns a scale), so the depth divides it and every k a step starts at (`starts`: a
    shard's first model-wide column, a chunk's length). The deepest that fits; under the
    interpreter at most 64, as the bf16 launches there. None: none fits, and the caller expands
    the weight instead."""
    for depth in (64, 32) if INTERPRET else (128, 64, 32):
        if scale_k % depth == 0 and all(start % depth == 0 for start in starts):
            return depth
    return None


FP8_STEP_SCALE = False  # set by fp8_weights: PB_FP8_STEP_SCALE (0960) on, and every loaded scale below 2 ** 7
FP8_STEP_SCALE_MAX = 2.0 ** 7  # 0960: a scale times 2 ** 120 stays finite in float32 below this


def fp8_step_scale(x) -> bool:
    """0960: whether the float8 kernels scale each step's sum rather than each weight element, for
    activations x: the knob in force and x bfloat16 or float32 (the dtypes e4m3's bits widen to
    exactly, fp8_tiles.unscaled)."""
    import torch

    return FP8_STEP_SCALE and x.dtype in (torch.bfloat16, torch.float32)


def dot_precision(x) -> str:
    """tl.dot's input_precision for operands of x's dtype: IEEE float32 unless torch allows TF32
    for matmuls (half-precision operands ignore it)."""
    import torch

    return "tf32" if x.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"


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
