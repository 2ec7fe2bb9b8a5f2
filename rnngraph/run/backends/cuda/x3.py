"""Products over all frames in float32 where TF32 is not allowed (the hoisted GEMMs and the weight gradients), in
3xTF32 on cuBLAS's TF32 tensor cores: each operand split into big (its TF32 rounding) and small (the TF32 rounding
of the rest), as the persistent loop splits its operands (persistent/mma.SPLIT_BITS), and three TF32 GEMMs adding
small·big, big·small, then big·big into the output (small·small, below 2⁻²² of a product, is dropped). Both
operands are TF32 values already, so cuBLAS's products are exact and its sums float32's: a product is within about
3 · 2⁻²² of its exact value, where float32's own rounding is 2⁻²⁴, and the results agree with float32 on CUDA
cores to that order. Where the operands are many rows (T·B), they are split a panel of rows at a time.

The split buffers (SPLIT_ELEMENTS float32 each, four) are the backend's, made at its first such product (outside
any recording) and never replaced, so recorded graphs keep their addresses; the products over all frames run one
after another on the caller's stream (never in lanes), so one set serves them all.
"""
from __future__ import annotations

from ...settings import switch
from .persistent.mma import SPLIT_BITS

SPLIT_ELEMENTS = 1 << 22     # float32 elements a split buffer (16 MB): a panel's rows, or the whole weight operand
FROM_WORK = 1 << 29          # multiply-adds (rows · columns · reduction) from which a product runs in 3xTF32

SPLIT = SPLIT_BITS + r"""
extern "C" __global__ void rg_split_tf32(const float* __restrict__ x, long long rows, int cols, long long ld,
        float* big, float* small) {
    // x [rows, cols] (row stride ld) as big + small, both [rows, cols] contiguous and TF32 values (rg_split)
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * cols) return;
    long long r = e / cols;
    unsigned b, s;
    rg_split(__float_as_uint(x[r * ld + (e - r * cols)]), b, s);
    big[e] = __uint_as_float(b);
    small[e] = __uint_as_float(s);
}
"""

# (ta, tb) -> the cuBLAS form, which operands run in panels of rows (a, b: a always) and whether the panels split
# the output's rows (else they split the reduction, every panel adding into the whole output)
FORMS = {(False, True): ("nt", (True, False), True),      # out [N, M] = a [N, K] · b [M, K]ᵀ
         (False, False): ("nn", (True, False), True),     # out [N, K] = a [N, M] · b [M, K]
         (True, False): ("tn", (True, True), False)}      # out [M, K] = a [N, M]ᵀ · b [N, K]


def applies(be, a, b, out, ta: bool, tb: bool) -> bool:
    """Whether out (+)= op(a) · op(b) runs in 3xTF32: float32 matrices cuBLAS takes, with TF32 not allowed
    (else cuBLAS runs them in TF32 itself), at least FROM_WORK multiply-adds, a whole operand within a split
    buffer, and RNNGRAPH_GEMM_3XTF32 not 0."""
    if be.blas is None or be.blas.tf32 or (ta, tb) not in FORMS or str(out.dtype) != "float32" or \
            not a.dtype == b.dtype == out.dtype or \
            not be.blas.usable(a, b, out) or a.ndim != 2 or switch("RNNGRAPH_GEMM_3XTF32") is False:
        return False
    _, panels, _ = FORMS[ta, tb]
    reduction = a.shape[0] if ta else a.shape[1]
    return out.size * reduction >= FROM_WORK and max(x.shape[1] for x in (a, b)) <= SPLIT_ELEMENTS and \
        all(x.size <= SPLIT_ELEMENTS for x, p in zip((a, b), panels) if not p)


def product(be, a, b, out, ta: bool, tb: bool, accumulate: bool):
    """out (+)= op(a) · op(b) in 3xTF32 (applies() said so): a panel of rows at a time, each operand split into
    the backend's buffers (be.split3), then small·big, big·small, big·big."""
    form, (_, b_panels), rows_of_out = FORMS[ta, tb]
    gemm, bufs = getattr(be.blas, form), be.split3          # bufs [4, SPLIT_ELEMENTS]: a's big, small, b's
    whole = None if b_panels else _split(be, b, bufs[2], bufs[3])
    N, beta = a.shape[0], 1.0 if accumulate else 0.0
    step = SPLIT_ELEMENTS // max(a.shape[1], b.shape[1] if b_panels else 1)
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        A = _split(be, a[r0:r1], bufs[0], bufs[1])
        B = whole or _split(be, b[r0:r1], bufs[2], bufs[3])
        o = out[r0:r1] if rows_of_out else out
        first = beta if rows_of_out or r0 == 0 else 1.0
        gemm(A[1], B[0], o, beta=first, tf32=True)
        gemm(A[0], B[1], o, beta=1.0, tf32=True)
        gemm(A[0], B[0], o, beta=1.0, tf32=True)


def _split(be, x, big, small) -> tuple:
    """(big, small) of x [rows, cols] (unit column stride), contiguous views of the two buffers."""
    rows, cols = x.shape
    n = rows * cols
    big, small = big[:n].reshape(rows, cols), small[:n].reshape(rows, cols)
    kernel = be.raw("rg_split_tf32", SPLIT)
    xp = be.xp
    kernel(((n + 255) // 256,), (256,), (x, xp.int64(rows), xp.int32(cols), xp.int64(x.strides[0] // x.itemsize),
                                         big, small))
    return big, small
