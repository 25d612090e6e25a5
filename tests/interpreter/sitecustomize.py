"""On the path of every job the tests run under Triton's CPU interpreter (TRITON_INTERPRET=1).

The interpreter computes each tl.dot as one numpy matmul, and numpy hands that to OpenBLAS,
whose kernels are picked by the CPU (and by OPENBLAS_CORETYPE, which some hosts set and the
tests must leave alone): with Haswell's or Zen's kernels one element of a [M, 64] x [64, N]
product came out other bits for another M or another row position, though the Triton kernel
sums alike. A GPU's tensor cores give a row the same bits wherever it sits in the tile, and
the bit checks of this suite (a row alone against batched) ask the same of the interpreter.
So here each row of a dot is its own product, [1, K] x [K, N], on C-ordered copies of the
operands: a row's bits then follow its own values and the other operand alone, not the product's
row count, the row's place in the tile, or how a tile was laid out in memory (loaded through a
TMA descriptor or through pointers). numpy's einsum and a plain sum over k were tried and were not
enough here: a tiny-model request's log probabilities still moved with the batch.
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
        rows = a_data.reshape(-1, a_data.shape[-2], a_data.shape[-1])
        cols = b_data.reshape(-1, b_data.shape[-2], b_data.shape[-1])
        product = np.stack([np.stack([np.matmul(row[None], cols[i])[0] for row in rows[i]])
                            for i in range(rows.shape[0])]).reshape(d.data.shape)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot
