"""The BLAS the compiled CPU loops call: numpy's own, found in the process (threadpoolctl): the library, its GEMM
symbols and their integer width, and its thread pool; or MKL where the `mkl` package is installed, sequential,
on rnngraph's own threads (Threads: a loop's rows, a GEMM's rows, split over the cores), its packed GEMM
packing a loop's weights once a call instead of once a frame."""
from __future__ import annotations

import ctypes
import functools
import os
import re
from dataclasses import dataclass
from importlib import metadata

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


@dataclass(frozen=True)
class Mkl:
    """MKL loaded from the `mkl` package with 32-bit integers and its sequential threading layer: every GEMM of
    a step then runs on rnngraph's own threads (numba's pool, split by rows), so no BLAS pool spins between them.
    Its packed GEMM (cblas_?gemm_pack_get_size, _pack, _compute) lets a loop pack its weights once a call."""
    path: str
    version: str
    symbols: dict       # cblas_{s,d}gemm{,_pack,_compute} without the prefix -> address, for the compiled code
    sizes: tuple        # (s, d) ctypes: bytes of a packed operand, (identifier, m, n, k) -> int

    def describe(self) -> str:
        return f"MKL {self.version} (every GEMM, sequential on rnngraph's threads; the loops' weights packed)"


MKL_LP64, MKL_SEQUENTIAL, CBLAS_PACK_B = 0, 1, 162


@functools.lru_cache(maxsize=None)
def mkl() -> Mkl | str:
    """MKL from the `mkl` package, or one line saying why rnngraph does without it (numpy's BLAS then runs the
    GEMMs in its own pool, packing the per-frame weights again every frame). RNNGRAPH_MKL=0 turns it off."""
    if os.environ.get("RNNGRAPH_MKL") == "0":
        return "RNNGRAPH_MKL=0 turns it off"
    try:
        lib_file = next(f for f in metadata.distribution("mkl").files or () if f.name.startswith("libmkl_rt.so"))
    except (metadata.PackageNotFoundError, StopIteration):
        return "MKL is not installed (pip install mkl, or pip install 'rnngraph[cpu]' on x86-64)"
    path = os.path.realpath(lib_file.locate())
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return f"MKL ({path}) does not load: {e}"
    lib.MKL_Set_Interface_Layer.argtypes = lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
    if lib.MKL_Set_Interface_Layer(MKL_LP64) != MKL_LP64 or \
            lib.MKL_Set_Threading_Layer(MKL_SEQUENTIAL) != MKL_SEQUENTIAL:
        return f"MKL ({path}) was set up before rnngraph loaded it (64-bit integers or its own threads)"
    text = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(text, 256)
    version = re.search(r"Version ([\d.]+)", text.value.decode())
    sizes = []
    for k in "sd":
        size = getattr(lib, f"cblas_{k}gemm_pack_get_size")
        size.restype, size.argtypes = ctypes.c_size_t, [ctypes.c_int] * 4
        sizes.append(size)
    symbols = {f"{k}gemm{fn}": _address(getattr(lib, f"cblas_{k}gemm{fn}")) for k in "sd"
               for fn in ("", "_pack", "_compute")}
    return Mkl(path, version.group(1) if version else "?", symbols, tuple(sizes))


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
    """The threads of numpy's BLAS pool: the cores, or fewer where the user limits it (OPENBLAS_NUM_THREADS …);
    rnngraph's own pool (Threads) takes as many."""
    info = _numpy_blas_info()
    return info["num_threads"] if info else 1


def cpu_info() -> str:
    """One line for a benchmark's header: numpy's BLAS and its threads, torch's threads where torch is loaded,
    MKL where the GEMMs run in it, and the loops' threads."""
    import sys
    blas = numpy_blas()
    torch = sys.modules.get("torch")
    parts = [f"numpy BLAS {blas.describe() if isinstance(blas, Blas) else blas}"]
    parts += [f"torch {torch.get_num_threads()} threads"] if torch is not None else []
    found = mkl()
    parts += [found.describe() if isinstance(found, Mkl) else f"no MKL: {found}"]
    return "; ".join(parts + [f"compiled loops' rows over {threads()} threads"])


SPLIT_WORK = 1 << 18    # element operations (a GEMM's multiply-adds, a pass's elements) worth a second thread


class Threads:
    """numpy's BLAS pool limited to n threads for rnngraph's calls (n None: as it is). Where every GEMM runs in
    MKL (own), rnngraph splits its work over numba's pool of as many threads instead: a loop's rows, a GEMM's
    and a memset's bytes in parts() ranges at once (numba's OpenMP pool wakes in about 2 µs; Python's threads
    took 85 here). A frame's rows are independent, so a loop's parts never wait on each other."""

    def __init__(self, n: int | None, own: bool = False):
        self.n, self.set, self.size = n, None, n or threads()
        self.own = own and self.size > 1
        blas = numpy_blas()
        if n is not None and isinstance(blas, Blas) and blas.set_threads:
            self.set = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(blas.set_threads)

    def parts(self, rows: int, work: int | None = None) -> int:
        """How many threads share `rows` rows of `work` element operations (None: a time loop, always worth it):
        one unless the pool is rnngraph's."""
        worth = work is None or work >= SPLIT_WORK
        return max(1, min(self.size, rows)) if self.own and worth else 1

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
