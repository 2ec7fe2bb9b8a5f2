"""numpy's own BLAS, found in the process (threadpoolctl) for the compiled CPU loops to call: the library,
its GEMM symbols and their integer width, and its thread pool, so that the loops and numpy share one."""
from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

import numpy

# (symbol pattern of a CBLAS routine, bits of its integer arguments), in the order they are tried:
# scipy-openblas (numpy's wheels), other 64-bit-integer builds, then the LP64 CBLAS of OpenBLAS, MKL, BLIS
GEMM_SYMBOLS = (("scipy_cblas_{}64_", 64), ("cblas_{}64_", 64), ("cblas_{}", 32))


@dataclass(frozen=True)
class Blas:
    """A loaded CBLAS: where it is, what it is, its GEMM and GEMV addresses (s and d) and their integer width."""
    path: str
    api: str            # threadpoolctl's internal_api: openblas, mkl, blis, ...
    version: str
    kernel: str         # the kernel set it runs (OpenBLAS: the core type, e.g. Haswell or SkylakeX)
    bits: int
    sgemm: int
    dgemm: int
    sgemv: int
    dgemv: int
    set_threads: int | None     # OpenBLAS's openblas_set_num_threads_local: sets the count, returns the old one
    somatcopy: int | None = None    # OpenBLAS's out-of-place transposes (s and d), an extension of CBLAS
    domatcopy: int | None = None

    def describe(self) -> str:
        return f"{self.api} {self.version} ({self.kernel} kernels, {threads()} threads) {os.path.basename(self.path)}"


def _numpy_blas_info() -> dict | None:
    """threadpoolctl's record of the BLAS numpy links (the one in numpy's own folder where there are several)."""
    from threadpoolctl import threadpool_info
    numpy.dot(numpy.ones((2, 2)), numpy.ones((2, 2)))       # the library is loaded by now
    found = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    home = os.path.dirname(os.path.dirname(numpy.__file__))
    own = [i for i in found if os.path.realpath(i["filepath"]).startswith(os.path.realpath(home))]
    return (own or found or [None])[0]


@functools.lru_cache(maxsize=None)
def numpy_blas() -> Blas | str:
    """numpy's BLAS as a Blas, or one line saying why the compiled loops cannot call it."""
    try:
        info = _numpy_blas_info()
    except ImportError:
        return "threadpoolctl is not installed (it finds numpy's BLAS); pip install threadpoolctl"
    if info is None:
        return "numpy links no BLAS library that threadpoolctl can see"
    lib = ctypes.CDLL(info["filepath"])
    for pattern, bits in GEMM_SYMBOLS:
        fns = [getattr(lib, pattern.format(k), None) for k in ("sgemm", "dgemm", "sgemv", "dgemv")]
        if None not in fns:
            local = getattr(lib, "openblas_set_num_threads_local", None)
            copies = [getattr(lib, pattern.format(k), None) for k in ("somatcopy", "domatcopy")]
            return Blas(info["filepath"], info["internal_api"], str(info.get("version")),
                        str(info.get("architecture") or info.get("threading_layer") or "-"), bits,
                        *(_address(f) for f in fns + [local] + copies))
    return (f"numpy's BLAS ({info['filepath']}) exports no CBLAS sgemm/dgemm/sgemv/dgemv the loops know "
            f"({', '.join(p.format('sgemm') for p, _ in GEMM_SYMBOLS)})")


def _address(fn) -> int | None:
    return None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value


def omatcopy(blas: Blas, dtype: str):
    """BLAS's out-of-place transpose of a row-major matrix for dtype ('float32' or 'float64'), called as
    fn(rows, cols, a, b): b [cols, rows] = a [rows, cols]ᵀ (both contiguous); None where the BLAS has none."""
    address = {"float32": blas.somatcopy, "float64": blas.domatcopy}.get(dtype)
    if address is None:
        return None
    integer, real = (ctypes.c_int64 if blas.bits == 64 else ctypes.c_int32), \
        (ctypes.c_float if dtype == "float32" else ctypes.c_double)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, integer, integer, real, ctypes.c_void_p, integer,
                          ctypes.c_void_p, integer)(address)
    return lambda rows, cols, a, b: fn(101, 112, rows, cols, 1.0, a.ctypes.data, cols, b.ctypes.data, rows)


def threads() -> int:
    """The threads of numpy's BLAS pool (the loops' GEMMs run in it; their fused passes run on the calling thread)."""
    from threadpoolctl import threadpool_info
    return next((i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"), 1)


def cpu_info() -> str:
    """One line for a benchmark's header: numpy's BLAS and its threads, torch's threads where torch is loaded,
    and where the compiled loops' fused passes run."""
    import sys
    blas = numpy_blas()
    torch = sys.modules.get("torch")
    parts = [f"numpy BLAS {blas.describe() if isinstance(blas, Blas) else blas}"]
    parts += [f"torch {torch.get_num_threads()} threads"] if torch is not None else []
    return "; ".join(parts + ["compiled loops' fused passes on the calling thread"])


class Threads:
    """Runs calls with numpy's BLAS limited to n threads, the count restored after each (n None: as it is)."""

    def __init__(self, n: int | None):
        self.n, self.set = n, None
        blas = numpy_blas()
        if n is not None and isinstance(blas, Blas) and blas.set_threads:
            self.set = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(blas.set_threads)

    def run(self, fn, *args):
        if self.n is None:
            return fn(*args)
        if self.set is None:                 # another BLAS: threadpoolctl's (slower) limit
            from threadpoolctl import threadpool_limits
            with threadpool_limits(self.n, user_api="blas"):
                return fn(*args)
        old = self.set(self.n)
        try:
            return fn(*args)
        finally:
            self.set(old)
