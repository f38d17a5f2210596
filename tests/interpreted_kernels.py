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


@triton.jit
def scalar_other(src, dst, n, other):
    """One element per program; a lane past `n` reads `other` (a scalar: the interpreter's load
    reads its value to decide whether one is given)."""
    pid = tl.program_id(0)
    tl.store(dst + pid, tl.load(src + pid, mask=pid < n, other=other))


@triton.jit
def mixed(src, dst, n, shift, BLOCK: tl.constexpr):
    """A handle given twice, an int64 promotion, a where, a bool mask, a loop on a loaded
    bound: the kinds of builtin call a slot kernel makes."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    values = tl.load(src + offsets, mask=inside, other=-1)
    wide = values.to(tl.int64) * values + shift
    doubled = values + values  # one handle twice, then two of the same type
    picked = tl.where(values % 2 == 0, wide, -wide) + (doubled + values)
    bound = tl.load(src)
    for i in range(0, bound % 3):
        picked += i
    tl.store(dst + offsets, picked, mask=inside & ~(values == 7))
