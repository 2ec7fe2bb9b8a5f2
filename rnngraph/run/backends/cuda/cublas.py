"""cuBLAS through its C API, so that GEMMs can be recorded into CUDA graphs.

CuPy 14 refuses cuBLAS calls during stream capture, but cuBLAS itself supports capture when its
workspace is set up front. We load the libcublas that CuPy already loaded into this process, with
our own handle and workspace. Row-major arrays with unit column stride; leading dimensions are the
row strides, so merged-buffer column views need no copy. 3-D views [k, rows, cols] (heads) run as one
strided-batched GEMM, each head's matrix at its batch stride.
"""
from __future__ import annotations

import ctypes

from ....arrays import dtype_name

_OP_N, _OP_T = 0, 1
_WORKSPACE_BYTES = 32 << 20
_HALF = {"float16": 2, "bfloat16": 14}    # cudaDataType CUDA_R_16F, CUDA_R_16BF
_COMPUTE_32F, _GEMM_DEFAULT = 68, -1      # cublasComputeType_t CUBLAS_COMPUTE_32F; cublasGemmAlgo_t (tensor cores allowed)
_R_32F, _COMPUTE_32F_FAST_TF32 = 0, 77    # cudaDataType CUDA_R_32F; float32 products on TF32 tensor cores


class Cublas:
    """C = op(...) products on row-major views: the three forms the executor needs. tf32: float32 products
    may round their inputs to TF32 (10-bit mantissa) on tensor cores, as torch's allow_tf32; set it before
    any GEMM is recorded (a recorded graph keeps the compute type it was recorded with)."""

    tf32 = False

    def __init__(self, cupy):
        self.cp = cupy
        (cupy.ones((2, 2), "float32") @ cupy.ones((2, 2), "float32")).sum()   # makes CuPy load cuBLAS
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "libcublas.so" in ln and "libcublasLt" not in ln})
        if not paths:
            raise OSError("libcublas is not loaded in this process")
        self.lib = ctypes.CDLL(paths[0])
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.workspace = cupy.empty(_WORKSPACE_BYTES, "uint8")
        self._check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                                   ctypes.c_size_t(_WORKSPACE_BYTES)), "cublasSetWorkspace")
        self.scalars = {(dt, v): ctype(v) for dt, ctype in (("float32", ctypes.c_float), ("float64", ctypes.c_double))
                        for v in (0.0, 1.0)}

    @staticmethod
    def _check(status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    @staticmethod
    def usable(*arrays) -> bool:
        """Whether the arrays are all matrices [rows, cols], or all heads [k, rows, cols], with unit column stride."""
        return len({a.ndim for a in arrays}) == 1 and all(
            a.ndim in (2, 3) and (a.shape[-1] <= 1 or a.strides[-1] == a.itemsize) and a.strides[-2] > 0
            and (a.ndim == 2 or a.strides[0] >= 0) for a in arrays)

    def _gemm(self, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, beta, tf32=False):
        """C = op(A) op(B) (+ C), column-major as cuBLAS sees our row-major views; heads (3-D views) as one
        strided-batched GEMM. Half storage goes through GemmEx: tensor cores, float32 products and sums,
        C rounded once when stored; float32 too where self.tf32 or tf32 (operands TF32 already: x3.py)."""
        dt = dtype_name(c.dtype)
        self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(self.cp.cuda.get_current_stream().ptr)),
                    "cublasSetStream")
        ptr = lambda x: ctypes.c_void_p(x.data.ptr)
        if c.ndim == 3:
            return self._batched(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, beta)
        if dt in _HALF or (dt == "float32" and (self.tf32 or tf32)):
            one, scale = ctypes.byref(self.scalars[("float32", 1.0)]), ctypes.byref(self.scalars[("float32", beta)])
            h, compute = (_HALF[dt], _COMPUTE_32F) if dt in _HALF else (_R_32F, _COMPUTE_32F_FAST_TF32)
            self._check(self.lib.cublasGemmEx(self.handle, ta, tb, m, n, k, one, ptr(a), h, max(lda, 1), ptr(b), h,
                                              max(ldb, 1), scale, ptr(c), h, max(ldc, 1), compute, _GEMM_DEFAULT),
                        "cublasGemmEx")
            return
        fn = self.lib.cublasSgemm_v2 if dt == "float32" else self.lib.cublasDgemm_v2
        self._check(fn(self.handle, ta, tb, m, n, k, ctypes.byref(self.scalars[(dt, 1.0)]),
                       ptr(a), max(lda, 1), ptr(b), max(ldb, 1),
                       ctypes.byref(self.scalars[(dt, beta)]), ptr(c), max(ldc, 1)),
                    "cublas gemm")

    def _batched(self, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, beta):
        """_gemm over heads: a, b, c [heads, rows, cols], each head's matrix at its batch stride (strides[0])."""
        dt, heads = dtype_name(c.dtype), c.shape[0]
        ptr = lambda x: ctypes.c_void_p(x.data.ptr)
        stride = lambda x: ctypes.c_longlong(x.strides[0] // x.itemsize)
        if dt in _HALF:
            one, scale = ctypes.byref(self.scalars[("float32", 1.0)]), ctypes.byref(self.scalars[("float32", beta)])
            h = _HALF[dt]
            self._check(self.lib.cublasGemmStridedBatchedEx(
                self.handle, ta, tb, m, n, k, one, ptr(a), h, max(lda, 1), stride(a), ptr(b), h, max(ldb, 1), stride(b),
                scale, ptr(c), h, max(ldc, 1), stride(c), heads, _COMPUTE_32F, _GEMM_DEFAULT),
                "cublasGemmStridedBatchedEx")
            return
        fn = self.lib.cublasSgemmStridedBatched if dt == "float32" else self.lib.cublasDgemmStridedBatched
        self._check(fn(self.handle, ta, tb, m, n, k, ctypes.byref(self.scalars[(dt, 1.0)]),
                       ptr(a), max(lda, 1), stride(a), ptr(b), max(ldb, 1), stride(b),
                       ctypes.byref(self.scalars[(dt, beta)]), ptr(c), max(ldc, 1), stride(c), heads),
                    "cublas strided-batched gemm")

    def parts(self, g, w, parts):
        """parts [S, N, K] (float32) = g [N, M]'s S column slices · the matching row slices of w [M, K] (half
        storage), one strided-batched GEMM: a split-K product whose parts the reader adds (split.py)."""
        S, (N, M), K = parts.shape[0], g.shape, w.shape[1]
        L, h = M // S, _HALF[str(g.dtype)]
        self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(self.cp.cuda.get_current_stream().ptr)),
                    "cublasSetStream")
        one, zero = ctypes.byref(self.scalars[("float32", 1.0)]), ctypes.byref(self.scalars[("float32", 0.0)])
        ptr = lambda x: ctypes.c_void_p(x.data.ptr)
        self._check(self.lib.cublasGemmStridedBatchedEx(
            self.handle, _OP_N, _OP_N, K, N, L, one, ptr(w), h, _ld(w), ctypes.c_longlong(L * _ld(w)), ptr(g), h,
            _ld(g), ctypes.c_longlong(L), zero, ptr(parts), _R_32F, K, ctypes.c_longlong(N * K), S, _COMPUTE_32F,
            _GEMM_DEFAULT), "cublasGemmStridedBatchedEx (parts)")

    def nt(self, x, w, out, beta=0.0, tf32=False):
        """out [N, M] = x [N, K] · w [M, K]ᵀ (+ out when beta=1); per head for [k, ...] views. tf32: on TF32
        tensor cores whatever self.tf32 (for operands that are TF32 values already)."""
        (N, K), M = x.shape[-2:], w.shape[-2]
        self._gemm(_OP_T, _OP_N, M, N, K, w, _ld(w), x, _ld(x), out, _ld(out), beta, tf32)

    def nn(self, g, w, out, beta=1.0, tf32=False):
        """out [N, K] += g [N, M] · w [M, K] (= where beta=0); per head for [k, ...] views."""
        (N, M), K = g.shape[-2:], w.shape[-1]
        self._gemm(_OP_N, _OP_N, K, N, M, w, _ld(w), g, _ld(g), out, _ld(out), beta, tf32)

    def tn(self, g, x, out, beta=1.0, tf32=False):
        """out [M, K] += g [N, M]ᵀ · x [N, K] (= where beta=0); per head for [k, ...] views."""
        (N, M), K = g.shape[-2:], x.shape[-1]
        self._gemm(_OP_N, _OP_T, K, M, N, x, _ld(x), g, _ld(g), out, _ld(out), beta, tf32)


def _ld(a) -> int:
    """The row stride of a matrix, or of each head's matrix, in elements."""
    return a.strides[-2] // a.itemsize
