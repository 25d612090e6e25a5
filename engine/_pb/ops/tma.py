"""Host-side TMA descriptors for the prompt-sized Triton kernels (0400, 0410, 0430).

A Hopper TMA unit reads a tensor whose innermost dimension is contiguous, whose base address and
every outer stride are multiples of 16 bytes, and whose innermost extent is at least 16 bytes.
`descriptor` builds Triton's host descriptor for such a tensor, read a `block` at a time, or gives
None where TMA cannot read it (or this Triton has no host descriptors), so the caller keeps its
pointer loads.
"""


def descriptor(tensor, block: list[int]):
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    size = tensor.element_size()
    if (tensor.stride(-1) != 1 or tensor.data_ptr() % 16 or tensor.shape[-1] * size < 16
            or any(stride * size % 16 for stride in tensor.stride()[:-1])):
        return None
    return TensorDescriptor.from_tensor(tensor, block)
