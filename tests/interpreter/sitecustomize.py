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

    # A launch patches triton.language for the interpreter and restores it after its grid; the
    # interpreter then patches the language again at every call of a @triton.jit function inside
    # the grid (inspect.getmembers over its modules), much of a kernel job's time, though each
    # repeat changes nothing. Within a launch each language module is patched once: by the launch,
    # or (triton.language.core, for tl.sum and the like) at the first call that needs it, which,
    # as the interpreter's own patching does, stays patched after the launch.
    import inspect

    import triton.language as tl

    _launches: list[set[int]] = []  # for the running launch: the language modules patched
    _found: dict[tuple[int, int], frozenset[int]] = {}

    def _langs(fn) -> frozenset[int]:
        """The language modules `_patch_lang(fn)` patches: those among fn's globals."""
        names = fn.__globals__
        key = (id(names), len(names))
        if key not in _found:
            _found[key] = frozenset(id(v) for v in names.values() if inspect.ismodule(v) and v in (tl, tl.core))
        return _found[key]

    _launch = interpreter.GridExecutor.__call__

    def launch(self, *args, **kwargs):
        _launches.append(set(_langs(self.fn)))
        try:
            return _launch(self, *args, **kwargs)
        finally:
            _launches.pop()

    def call(self, *args, **kwargs):  # InterpretedFunction.__call__, less the repeated patching
        langs = _langs(self.fn)
        if not (_launches and langs <= _launches[-1]):
            interpreter._patch_lang(self.fn)
            if _launches:
                _launches[-1].update(langs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.GridExecutor.__call__ = launch
    interpreter.InterpretedFunction.__call__ = call

    # Triton's semantic layer works out an overflow check of every integer add, sub and mul for
    # device_assert, which drops it unless the interpreter's options say debug (they never do
    # here): much of a kernel job's time, for no check. Without debug it is skipped as well.
    _semantic = interpreter.interpreter_semantic
    _overflow_check = _semantic.binary_op_sanitize_overflow_impl

    def overflow_check(lhs, rhs, binary_op):
        if _semantic.builder.options.debug:
            return _overflow_check(lhs, rhs, binary_op)

    _semantic.binary_op_sanitize_overflow_impl = overflow_check
