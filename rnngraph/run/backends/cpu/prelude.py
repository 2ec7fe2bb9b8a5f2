"""What every generated CPU source imports (numba): numpy's BLAS GEMMs, MKL's (split over numba's threads, and
packed), float32 transcendentals that the compiler vectorises, half-precision loads and stores, and the
compiler that marks arguments as not aliasing.

Arrays reach the generated functions as 1-D windows with an element offset and a row stride (ld), as a CUDA
kernel gets a pointer and a row stride: element (row r, feature f) of an operand is w[s + r·ld + f]."""
from __future__ import annotations

import math

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
import numba
from numba import njit, prange, types
from numba.core.compiler import Compiler
from numba.extending import intrinsic

from ....errors import RnnGraphError
from .blas import CBLAS_PACK_B, Mkl, mkl, numpy_blas

BLAS = numpy_blas()
if isinstance(BLAS, str):
    raise RnnGraphError(BLAS)
_INT = types.int64 if BLAS.bits == 64 else types.int32
# the symbols the compiled code calls, their integer width in the name: a cached loop never calls another width
SGEMM, DGEMM, SGEMV, DGEMV = (f"rg_{k}_i{BLAS.bits}" for k in ("sgemm", "dgemm", "sgemv", "dgemv"))
for _name, _address in ((SGEMM, BLAS.sgemm), (DGEMM, BLAS.dgemm), (SGEMV, BLAS.sgemv), (DGEMV, BLAS.dgemv)):
    llvm.add_symbol(_name, _address)


def _gemm_type(name: str, real):
    """CBLAS ?gemm(order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)."""
    return types.ExternalFunction(name, types.void(types.int32, types.int32, types.int32, _INT, _INT, _INT, real,
                                                   types.voidptr, _INT, types.voidptr, _INT, real, types.voidptr, _INT))


def _gemv_type(name: str, real):
    """CBLAS ?gemv(order, trans, M, N, alpha, A, lda, x, incx, beta, y, incy)."""
    return types.ExternalFunction(name, types.void(types.int32, types.int32, _INT, _INT, real, types.voidptr, _INT,
                                                   types.voidptr, _INT, real, types.voidptr, _INT))


_sgemm, _dgemm = _gemm_type(SGEMM, types.float32), _gemm_type(DGEMM, types.float64)
_sgemv, _dgemv = _gemv_type(SGEMV, types.float32), _gemv_type(DGEMV, types.float64)
ROW_MAJOR, NO, YES, PACKED = 101, 111, 112, 151      # CBLAS order and transpose codes, MKL's packed operand

MKL = mkl()
MKL_NAMES = {k: f"rg_mkl_{k}" for k in ("sgemm", "dgemm", "sgemm_pack", "dgemm_pack", "sgemm_compute", "dgemm_compute")}
if isinstance(MKL, Mkl):     # else no compiled code calls them (the backend uses MKL only where it is)
    for _k, _address in MKL.symbols.items():
        llvm.add_symbol(MKL_NAMES[_k], _address)
_I = types.int32                # MKL's integers (its LP64 interface)
_mkl_sgemm, _mkl_dgemm = (types.ExternalFunction(MKL_NAMES[k], types.void(
    _I, _I, _I, _I, _I, _I, r, types.voidptr, _I, types.voidptr, _I, r, types.voidptr, _I)) for k, r in
    (("sgemm", types.float32), ("dgemm", types.float64)))
# cblas_?gemm_pack(layout, identifier, trans, m, n, k, alpha, src, ld, dest)
_spack, _dpack = (types.ExternalFunction(MKL_NAMES[k], types.void(_I, _I, _I, _I, _I, _I, r, types.voidptr, _I,
                                                                   types.voidptr))
                  for k, r in (("sgemm_pack", types.float32), ("dgemm_pack", types.float64)))
# cblas_?gemm_compute(layout, transa, transb, m, n, k, a, lda, b, ldb, beta, c, ldc)
_scompute, _dcompute = (types.ExternalFunction(MKL_NAMES[k], types.void(
    _I, _I, _I, _I, _I, _I, types.voidptr, _I, types.voidptr, _I, r, types.voidptr, _I))
    for k, r in (("sgemm_compute", types.float32), ("dgemm_compute", types.float64)))

JIT = dict(cache=True, error_model="numpy", nogil=True)    # numpy's float semantics: x/0 is inf, no exception


class NoAlias(Compiler):
    """numba's compiler with every array argument marked noalias (LLVM then vectorises loops over many
    arrays). Sound for the generated functions: their arguments are distinct buffers, or windows of one
    buffer whose written elements no other argument reads or writes (checked where they are made)."""

    def __init__(self, typingctx, targetctx, library, args, return_type, flags, locals):
        flags.noalias = True
        super().__init__(typingctx, targetctx, library, args, return_type, flags, locals)


# -- pointers and bits ---------------------------------------------------------------------------
@intrinsic
def address(typingctx, arr, offset):
    """A void pointer to element `offset` of a 1-D array."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
    return types.voidptr(arr, types.intp), codegen


def _bitcast(src, dst, dst_ir):
    @intrinsic
    def cast(typingctx, x):
        return dst(src), lambda context, builder, sig, args: builder.bitcast(args[0], dst_ir)
    return cast


f32_bits = _bitcast(types.float32, types.uint32, ir.IntType(32))
bits_f32 = _bitcast(types.uint32, types.float32, ir.FloatType())


# -- GEMMs ---------------------------------------------------------------------------------------
@njit(**JIT)
def gemm32(ta, tb, M, N, K, a, sa, lda, b, ldb, beta, c, sc, ldc):
    """c[sc:] [M, N] = op(a[sa:]) [M, K] · op(b) [K, N] (+ beta · c), row-major with leading dimensions; op
    transposes a stored [K, M] where ta, b stored [N, K] where tb. One row (M = 1) runs as a GEMV, which
    BLAS runs several times faster than a GEMM of one row."""
    if M == 1 and not ta:
        _sgemv(ROW_MAJOR, NO if tb else YES, N if tb else K, K if tb else N, np.float32(1), address(b, 0), ldb,
               address(a, sa), 1, np.float32(beta), address(c, sc), 1)
    else:
        _sgemm(ROW_MAJOR, YES if ta else NO, YES if tb else NO, M, N, K, np.float32(1), address(a, sa), lda,
               address(b, 0), ldb, np.float32(beta), address(c, sc), ldc)


@njit(**JIT)
def gemm64(ta, tb, M, N, K, a, sa, lda, b, ldb, beta, c, sc, ldc):
    """gemm32 in float64."""
    if M == 1 and not ta:
        _dgemv(ROW_MAJOR, NO if tb else YES, N if tb else K, K if tb else N, 1.0, address(b, 0), ldb,
               address(a, sa), 1, float(beta), address(c, sc), 1)
    else:
        _dgemm(ROW_MAJOR, YES if ta else NO, YES if tb else NO, M, N, K, 1.0, address(a, sa), lda, address(b, 0),
               ldb, float(beta), address(c, sc), ldc)


@njit(**JIT)
def pack32(tb, M, N, K, b, ldb, packed):
    """packed = op(b) [K, N] in MKL's packed layout for products of M rows (op: b stored [N, K] where tb)."""
    _spack(ROW_MAJOR, CBLAS_PACK_B, YES if tb else NO, M, N, K, np.float32(1), address(b, 0), ldb,
           address(packed, 0))


@njit(**JIT)
def pack64(tb, M, N, K, b, ldb, packed):
    """pack32 in float64."""
    _dpack(ROW_MAJOR, CBLAS_PACK_B, YES if tb else NO, M, N, K, 1.0, address(b, 0), ldb, address(packed, 0))


@njit(**JIT)
def gemm_packed32(M, N, K, a, sa, lda, packed, beta, c, sc, ldc):
    """c[sc:] [M, N] = a[sa:] [M, K] · (packed by pack32) (+ beta · c), row-major."""
    _scompute(ROW_MAJOR, NO, PACKED, M, N, K, address(a, sa), lda, address(packed, 0), N, np.float32(beta),
              address(c, sc), ldc)


@njit(**JIT)
def gemm_packed64(M, N, K, a, sa, lda, packed, beta, c, sc, ldc):
    """gemm_packed32 in float64."""
    _dcompute(ROW_MAJOR, NO, PACKED, M, N, K, address(a, sa), lda, address(packed, 0), N, float(beta),
              address(c, sc), ldc)


@njit(parallel=True, **JIT)
def gemm_rows32(parts, ta, tb, M, N, K, a, lda, b, ldb, beta, c, ldc):
    """c [M, N] (+ beta · c) = op(a) · op(b) in MKL, c's rows in `parts` ranges on numba's threads (row r of
    op(a): a's row r, or its column r where ta)."""
    for p in prange(parts):
        r0, r1 = M * p // parts, M * (p + 1) // parts
        _mkl_sgemm(ROW_MAJOR, YES if ta else NO, YES if tb else NO, r1 - r0, N, K, np.float32(1),
                   address(a, r0 if ta else r0 * lda), lda, address(b, 0), ldb, np.float32(beta), address(c, r0 * ldc),
                   ldc)


@njit(parallel=True, **JIT)
def gemm_rows64(parts, ta, tb, M, N, K, a, lda, b, ldb, beta, c, ldc):
    """gemm_rows32 in float64."""
    for p in prange(parts):
        r0, r1 = M * p // parts, M * (p + 1) // parts
        _mkl_dgemm(ROW_MAJOR, YES if ta else NO, YES if tb else NO, r1 - r0, N, K, 1.0,
                   address(a, r0 if ta else r0 * lda), lda, address(b, 0), ldb, float(beta), address(c, r0 * ldc), ldc)


@njit(parallel=True, **JIT)
def zero_parts(parts, a):
    """a [n] = 0, in `parts` ranges on numba's threads."""
    n = a.size
    for p in prange(parts):
        a[n * p // parts:n * (p + 1) // parts] = 0


@njit(parallel=True, **JIT)
def copy_parts(parts, dst, src):
    """dst [n] = src [n], in `parts` ranges on numba's threads."""
    n = dst.size
    for p in prange(parts):
        dst[n * p // parts:n * (p + 1) // parts] = src[n * p // parts:n * (p + 1) // parts]


def fast_threads() -> bool:
    """Whether numba's thread pool is one that wakes in microseconds (OpenMP's or TBB's; its own workqueue took
    about 100 µs a call here, as long as Python's threads)."""
    zero_parts(2, np.ones(2, np.uint8))
    return numba.threading_layer() in ("omp", "tbb")


@njit(**JIT)
def widen(h, s, ld, rows, cols, out):
    """out [rows·cols] float32 = the bfloat16 bits h[s + r·ld + f], rows r and features f (a GEMM's operand)."""
    for r in range(rows):
        src, dst = h[s + r * ld:s + r * ld + cols], out[r * cols:(r + 1) * cols]
        for f in range(cols):
            dst[f] = bf16_load(src[f])


@njit(**JIT)
def narrow(acc, rows, cols, h, s, ld):
    """The bfloat16 bits h[s + r·ld + f] = acc [rows·cols] float32, each rounded once."""
    for r in range(rows):
        src, dst = acc[r * cols:(r + 1) * cols], h[s + r * ld:s + r * ld + cols]
        for f in range(cols):
            dst[f] = bf16_store(src[f])


@njit(**JIT)
def gemm_bf16(tb, M, N, K, a, sa, lda, b32, ldb, beta, c, sc, ldc, a32, c32):
    """gemm32 on bfloat16 bits: a widened into a32 [M·K], b32 the float32 copy of b, c accumulated in c32
    [M·N] (loaded first where beta) and rounded once when stored."""
    widen(a, sa, lda, M, K, a32)
    if beta:
        widen(c, sc, ldc, M, N, c32)
    gemm32(False, tb, M, N, K, a32, 0, K, b32, ldb, beta, c32, 0, N)
    narrow(c32, M, N, c, sc, ldc)


# -- half storage: bfloat16 bits as uint16 ------------------------------------------------------
@njit(**JIT)
def bf16_load(h):
    return bits_f32(np.uint32(h) << np.uint32(16))


@njit(**JIT)
def bf16_store(v):
    """float32 -> bfloat16 bits, rounded to nearest even (NaN stays NaN), as ml_dtypes rounds."""
    x = f32_bits(v)
    if (x & np.uint32(0x7fffffff)) > np.uint32(0x7f800000):
        return np.uint16((x >> np.uint32(16)) | np.uint32(0x40))
    return np.uint16((x + np.uint32(0x7fff) + ((x >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


# -- float32 transcendentals, vectorisable -------------------------------------------------------------
# libm's expf and tanhf are calls the compiler cannot vectorise (numba has no vector math library here), so the
# float32 rules use these, straight-line float32 code the loops vectorise: within 2 units in the last place of
# the exact values (tests/test_cpu_backend.py), as numpy's and torch's own float32 functions are within a few.
# Their Horner steps may fuse into FMAs (fastmath 'contract' on them alone). A sigmoid took about 0.2 ns an
# element so, against 0.9 computed in float64 and rounded (this 2-core Xeon).
LOG2E, LN2_HI, LN2_LO, ROUND = 1.4426950408889634, 0.693359375, -2.12194440e-4, 12582912.0     # ROUND: 1.5 · 2²³
EXP_MAX, EXP_MIN = 88.72283, -87.33654      # e^x overflows above, is subnormal below (returned as 0)
TANH_SERIES = (-1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075, -929569 / 638512875,
               6404582 / 10854718875, -443861162 / 1856156927625)      # tanh's odd Taylor coefficients, x³ on


@njit(fastmath={"contract"}, **JIT)
def exp32(x):
    """e^x in float32: 2^k · e^r with k = x·log2(e) rounded (adding 1.5 · 2²³ rounds to an integer), r = x − k·ln2
    in two parts (Cody–Waite, |r| ≤ ln2/2) and e^r its Taylor series to r⁷ (truncation < 2e-8 relative); 2^k
    in two factors, so that each stays normal."""
    c = min(max(x, np.float32(EXP_MIN)), np.float32(EXP_MAX))
    k = (c * np.float32(LOG2E) + np.float32(ROUND)) - np.float32(ROUND)
    r = (c - k * np.float32(LN2_HI)) - k * np.float32(LN2_LO)
    p = np.float32(1 / 5040)
    p = p * r + np.float32(1 / 720)
    p = p * r + np.float32(1 / 120)
    p = p * r + np.float32(1 / 24)
    p = p * r + np.float32(1 / 6)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1)
    p = p * r + np.float32(1)
    ki = np.int32(k)
    half = ki >> 1
    y = p * bits_f32(np.uint32((half + 127) << 23)) * bits_f32(np.uint32((ki - half + 127) << 23))
    y = np.float32(math.inf) if x > np.float32(EXP_MAX) else y
    y = np.float32(0) if x < np.float32(EXP_MIN) else y
    return y if x == x else x


@njit(fastmath={"contract"}, **JIT)
def tanh32(x):
    """tanh in float32: its odd Taylor series to x¹⁹ below |x| = 0.6 (truncation < 1e-8), 1 − 2/(e^{2|x|} + 1)
    above, where no cancellation loses digits; signed. (A test of x == x here, for NaN, kept the loops scalar.)"""
    a = abs(x)
    s = a * a
    c3, c5, c7, c9, c11, c13, c15, c17, c19 = TANH_SERIES
    p = ((((((((np.float32(c19) * s + np.float32(c17)) * s + np.float32(c15)) * s + np.float32(c13)) * s +
               np.float32(c11)) * s + np.float32(c9)) * s + np.float32(c7)) * s + np.float32(c5)) * s + np.float32(c3))
    small = a + a * s * p
    big = np.float32(1) - np.float32(2) / (exp32(np.float32(2) * a) + np.float32(1))
    return math.copysign(small if a < np.float32(0.6) else big, x)      # NaN stays NaN: both branches are


@njit(**JIT)
def log1p32(x):
    return np.float32(math.log1p(np.float64(x)))


@njit(**JIT)
def rsqrt32(x):
    return np.float32(1) / math.sqrt(x)


@njit(**JIT)
def rsqrt64(x):
    return 1.0 / math.sqrt(x)
