"""Rounding to a tensor's dtype inside Triton kernels, the way torch's kernels round.

torch rounds a float32 result to float16 or bfloat16 to nearest, ties to even. Triton's
conversion does the same on a GPU, but its CPU interpreter (which the tests use) truncates to
bfloat16, so bfloat16 is rounded here on the float32 bits; then the kernels give the GPU's
results under the interpreter too. Importing this module needs Triton.
"""

import triton
import triton.language as tl


@triton.jit
def round_to(x, MODE: tl.constexpr):
    """float32 x rounded to MODE's dtype (0 float32, 1 float16, 2 bfloat16: ops.common.MODES), as float32."""
    if MODE == 1:
        x = x.to(tl.float16).to(tl.float32)
    elif MODE == 2:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        x = bits.to(tl.float32, bitcast=True)
    return x
