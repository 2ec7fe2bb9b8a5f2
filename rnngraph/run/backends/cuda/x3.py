"""Products over all frames in float32 where TF32 is not allowed (the hoisted GEMMs and their operands'
gradients, and a weight gradient beside its operand's), in 3xTF32 on cuBLAS's TF32 tensor cores. Each operand
is split as the persistent loop splits its own (persistent/mma.SPLIT_BITS) into big (its TF32 rounding) and small
(the TF32 rounding of the rest), and one TF32 GEMM runs over three times the reduction: a's parts (small, big,
big) against b's (big, small, big) along it, so that its sums add small·big + big·small + big·big (small·small,
below 2⁻²² of a product, is dropped). The parts are TF32 values already, so cuBLAS's products are exact and its
sums float32's: a product is within about 3 · 2⁻²² of its exact value, where float32's own rounding is 2⁻²⁴, and
the results agree with float32 on CUDA cores to that order. One GEMM, not three, so the output is written once.
Operands of many rows (T·B) are split a panel of rows at a time.

The two gradients of one product share its output gradient's parts (grads): split for the operand's gradient as
that product's a (small, big, big side by side in each row), the same buffer read as [3 · rows, cols] is the
weight gradient's a, each row's three parts one after another along its reduction, against the operand's parts
split (big, small, big) the same way.

The split buffers are the backend's (split3: two of 3 · SPLIT_ELEMENTS float32), made at its first such product
(outside any recording) and never replaced, so recorded graphs keep their addresses; the products over all frames
run one after another on the caller's stream (never in lanes), so one pair serves them all.
"""
from __future__ import annotations

from ....arrays import dtype_name
from ....errors import RnnGraphError
from ...settings import switch
from .persistent.mma import SPLIT_BITS

SPLIT_ELEMENTS = 1 << 22     # float32 elements split at a time (a panel of rows, or a whole weight): 48 MB a buffer
ALIGN = 64                   # elements: where a second operand's parts start in a buffer (256 bytes, as cuBLAS likes)
FROM_WORK = 1 << 29          # multiply-adds (output elements · reduction) from which a product runs in 3xTF32

SPLIT = SPLIT_BITS + r"""
extern "C" __global__ void rg_split3_tf32(const float* __restrict__ x, long long rows, int cols, long long ld,
        float* out, long long out_ld, long long part, int small_at) {
    // x [rows, cols] (row stride ld) as three parts of TF32 values (rg_split): part p of element (r, c) at
    // out[r * out_ld + p * part + c], small where p is small_at (0 or 1), big elsewhere
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * cols) return;
    long long r = e / cols, c = e - r * cols;
    unsigned b, s;
    rg_split(__float_as_uint(x[r * ld + c]), b, s);
    float* o = out + r * out_ld + c;
    o[0] = __uint_as_float(small_at == 0 ? s : b);
    o[part] = __uint_as_float(small_at == 1 ? s : b);
    o[2 * part] = __uint_as_float(b);
}
"""

# (ta, tb) -> (the cuBLAS form, where b's reduction lies: along its columns (its parts side by side in a row) or its
# rows (its parts stacked)); a's lies along its columns, and the panels of a's rows split the output's rows. A weight
# gradient alone (tn: out [M, K] = a [N, M]ᵀ · b [N, K]) stays one float32 GEMM: on an H200, split in panels of N,
# it took 1.11-1.33x float32's time (minGRU, minLSTM and the LSTM's products, T·B = 800 to 65,536); it runs in
# 3xTF32 beside its operand's gradient only, sharing that one's split (grads).
FORMS = {(False, True): ("nt", "cols"),     # out [N, M] = a [N, K] · b [M, K]ᵀ
         (False, False): ("nn", "rows")}    # out [N, K] = a [N, M] · b [M, K]


def applies(be, a, b, out, ta: bool, tb: bool) -> bool:
    """Whether out (+)= op(a) · op(b) runs in 3xTF32: float32 matrices cuBLAS takes in a form of FORMS, with TF32
    not allowed (else cuBLAS runs them in TF32 itself), at least FROM_WORK multiply-adds, b whole within a split
    buffer, and RNNGRAPH_GEMM_3XTF32 not 0."""
    if be.blas is None or be.blas.tf32 or (ta, tb) not in FORMS or dtype_name(out.dtype) != "float32" or \
            not a.dtype == b.dtype == out.dtype or a.ndim != 2 or not be.blas.usable(a, b, out) or \
            switch("RNNGRAPH_GEMM_3XTF32") is False:
        return False
    return out.size * a.shape[1] >= FROM_WORK and max(a.shape[1], b.size) <= SPLIT_ELEMENTS


def applies_grads(be, g, w, x, gx, gw) -> bool:
    """Whether both gradients of a product (grads) run in 3xTF32: where the operand's (gx (+)= g · w) does, and x
    and gw are float32 matrices cuBLAS takes beside g."""
    return applies(be, g, w, gx, False, False) and x.dtype == gw.dtype == g.dtype and x.ndim == 2 and \
        be.blas.usable(g, x, gw)


def product(be, a, b, out, ta: bool, tb: bool, accumulate: bool):
    """out (+)= op(a) · op(b) in 3xTF32 (where applies() says so): b split whole into the second buffer, then a
    panel of a's rows at a time split into the first (be.split3 [2, 3 · SPLIT_ELEMENTS]) and one TF32 GEMM into
    those rows of out."""
    form, b_along = FORMS[ta, tb]
    gemm, bufs = getattr(be.blas, form), be.split3
    room = bufs.shape[1] // 3           # SPLIT_ELEMENTS when the buffers were made
    if b.size > room:
        raise RnnGraphError(f"internal: a whole operand of {b.size} elements exceeds x3's buffers ({room})")
    whole = _split(be, b, bufs[1], b_along, 1)
    N, beta, step = a.shape[0], 1.0 if accumulate else 0.0, room // a.shape[1]
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        gemm(_split(be, a[r0:r1], bufs[0], "cols", 0), whole, out[r0:r1], beta=beta, tf32=True)


def grads(be, g, w, x, gx, gw, accumulate: bool):
    """gx [N, K] (+)= g [N, M] · w [M, K] and gw [M, K] += g [N, M]ᵀ · x [N, K] in 3xTF32 (where applies_grads() says
    so), g split once for both a panel of rows at a time: w split whole (big, small, big stacked) into the second
    buffer, and each panel's x after it. False where no panel of one row fits beside w (the caller then runs the two
    products apart)."""
    N, M = g.shape
    K, bufs = w.shape[1], be.split3
    room, at = bufs.shape[1] // 3, -(-3 * w.size // ALIGN) * ALIGN      # x's parts from an aligned offset
    step = min(room // M, (3 * room - at) // (3 * K))
    if step < 1:
        return False
    whole = _split(be, w, bufs[1], "rows", 1)
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        A = _split(be, g[r0:r1], bufs[0], "cols", 0)         # [rows, 3M]: (small, big, big) of each row
        be.blas.nn(A, whole, gx[r0:r1], beta=1.0 if accumulate else 0.0, tf32=True)
        X = _split(be, x[r0:r1], bufs[1][at:], "cols", 1)    # [rows, 3K]: (big, small, big)
        be.blas.tn(A.reshape(3 * (r1 - r0), M), X.reshape(3 * (r1 - r0), K), gw, beta=1.0, tf32=True)
    return True


def _split(be, x, buf, along: str, small_at: int):
    """x [rows, cols] (unit column stride) as its three parts in buf, small the part small_at: side by side,
    [rows, 3 · cols] (along 'cols'), or stacked, [3 · rows, cols] (along 'rows'); a contiguous view of buf."""
    rows, cols = x.shape
    n, xp = rows * cols, be.xp
    out_ld, part = (3 * cols, cols) if along == "cols" else (cols, n)
    be.raw("rg_split3_tf32", SPLIT)(((n + 255) // 256,), (256,), (
        x, xp.int64(rows), xp.int32(cols), xp.int64(x.strides[0] // x.itemsize), buf, xp.int64(out_ld),
        xp.int64(part), xp.int32(small_at)))
    return buf[:3 * n].reshape((rows, 3 * cols) if along == "cols" else (3 * rows, cols))
