"""Two jit kernels for tests/test_vllm_reuse.py, imported only after
pcpcheck.worker.release_kernels.import_triton (interpreter mode is read when a kernel is
decorated): int32 arithmetic through a jit helper, wrapping past 2**31 in some lanes."""

import triton
import triton.language as tl


@triton.jit
def scaled(x, factor):
    return x * factor + 7


@triton.jit
def scale(src, dst, factor, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(src + offsets, mask=offsets < n, other=0)
    tl.store(dst + offsets, scaled(values, factor) - 1, mask=offsets < n)
