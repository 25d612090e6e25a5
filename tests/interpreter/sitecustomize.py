"""On the path of every job the tests run under Triton's CPU interpreter (TRITON_INTERPRET=1).

The interpreter computes each tl.dot as one numpy matmul, and numpy hands that to OpenBLAS,
whose kernels are picked by the CPU (and by OPENBLAS_CORETYPE, which some hosts set and the
tests must leave alone): with Haswell's or Zen's kernels one element of a [M, 64] x [64, N]
product came out other bits for another M or another row position, though the Triton kernel
sums alike. A GPU's tensor cores give a row the same bits wherever it sits in the tile, and
the bit checks of this suite (a row alone against batched) ask the same of the interpreter.
So here a dot is numpy's einsum without BLAS on C-ordered copies of its operands: each element
summed over k in one fixed order, whatever the product's shape, the element's place in it, or how
the tiles were laid out in memory (a tile loaded through a TMA descriptor and the same tile loaded
through pointers give the same bits).
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    import numpy as np
    from triton.runtime import interpreter

    _blas_dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:  # fp8: upstream's conversion
            return _blas_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        acc = d.data.dtype
        a_data, b_data = a.data.astype(acc, order="C"), b.data.astype(acc, order="C")
        product = np.einsum("...ik,...kj->...ij", a_data, b_data, optimize=False)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot
