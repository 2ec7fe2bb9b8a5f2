"""The chunk boundary kernels (rnngraph/run/backends/cuda/chunks.py) run on the CPU: their CUDA source compiled
as C++ by g++ (one thread walking each grid-stride loop), reading the call's cursor with the real addresses of
numpy arrays. A backend that runs them in place of the references (chunks.OPS) gives bit for bit what the
references give, in chunks of K frames and in the ladder, ragged, recomputing, batch-first (strided slots), for
float64, float32 and bfloat16 (the same roundings), and the sources compile with NVRTC for sm_90."""
import ctypes

import numpy as np
import pytest

from cuda_on_cpu import F16, PRELUDE, compiled, needs_cxx
from nvrtc import nvrtc_compile
from rnngraph.nn import Recurrent
from rnngraph.run.backends.cuda.backend import CupyBackend
from rnngraph.run.backends.cuda.chunks import LAUNCHES, chunk_launch, chunk_source
from rnngraph.run.backends.cuda.source import CTYPES, HALF_PRELUDE
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.run.chunks import OPS
from test_history import skip_cell

K = 4


def _library(src: str):
    """The kernels of `src` compiled for the CPU (once per source)."""
    half = HALF_PRELUDE
    for a, b in F16.items():
        half = half.replace(a, b)
    text = PRELUDE.replace("struct rg_dim { int x; };", "struct rg_dim { int x, y; };") + \
        "using std::max;\nstatic rg_dim blockDim = {1, 1}, gridDim = {1, 1};\n" + half + src
    return compiled(text)


class _Kernel:
    """A compiled kernel called as cupy calls a RawKernel: kernel(grid, block, args)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, grid, block, args):
        conv = {np.int32: ctypes.c_int, np.int64: ctypes.c_longlong}
        self.fn(*[ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray) else conv[type(a)](int(a))
                  for a in args])


class ChunkKernels(NumpyBackend):
    """numpy, with every chunk boundary operation run by its CUDA kernel compiled for the CPU; `ran` counts them."""
    name = "chunk-kernels"
    frame_args = CupyBackend.frame_args

    def __init__(self):
        super().__init__("staged")
        self.ran = {}

    def compile_chunk(self, op, cursor, args):
        self.ran[op] = self.ran.get(op, 0) + 1
        return chunk_launch(self, op, cursor, args)

    def raw(self, name, src):
        return _Kernel(getattr(_library(src), name))


def _results(layer, x, lengths, rng):
    y, fin = layer(x, None, lengths)
    fins = fin if isinstance(fin, tuple) else (fin,)
    gy = rng.standard_normal(y.shape).astype(y.dtype)
    gfin = tuple(rng.standard_normal(f.shape).astype(f.dtype) for f in fins)
    gx, g0, grads = layer.backward(gy, gfin if len(gfin) > 1 else gfin[0])
    return [y, *fins, gx, *(g0 if isinstance(g0, tuple) else (g0,)), *grads.values()]


@needs_cxx
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "min_gru", skip_cell])
@pytest.mark.parametrize("how", ["chunks", "ladder", "recompute", "batch_first"])
def test_the_kernels_give_what_the_references_give(cell, dtype, how):
    kw = dict(num_layers=2, bidirectional=True, dtype=dtype, seed=4, buckets=how == "ladder",
              recompute=how == "recompute", batch_first=how == "batch_first")
    kernels = ChunkKernels()
    ran, ref = Recurrent(cell, 3, 5, backend=kernels, **kw), Recurrent(cell, 3, 5, **kw)
    for layer in (ran, ref):
        layer.backend.chunk_frames = K
    for T in (K + 1, 3 * K + 2, 11):
        rng = np.random.default_rng(T)
        x = rng.standard_normal((3, T, 3) if how == "batch_first" else (T, 3, 3)).astype(ref.dtype)
        lengths = np.array([T, int(rng.integers(0, T + 1)), max(T - K - 1, 0)])
        got = _results(ran, x, lengths, np.random.default_rng(1))
        want = _results(ref, x, lengths, np.random.default_rng(1))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    assert set(kernels.ran) == set(OPS) == set(LAUNCHES)


@pytest.mark.parametrize("dtype", list(CTYPES))
def test_the_chunk_kernels_compile_for_sm90(dtype):
    nvrtc_compile(chunk_source(CTYPES[dtype]), f"chunks_{dtype}")
