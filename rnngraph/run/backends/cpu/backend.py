"""The compiled CPU backend: numpy arrays, each direction's time loop and each fused group compiled with numba
from the op table's kernel rules, the GEMMs in numpy's own BLAS; and the loop strategies' runners, each the
module of this room named like its strategy. What it does not compile runs numpy's reference, so its
results are the numpy backend's (float64 to rounding, 1e-12; float32 to 1e-5).

numba is imported only when the backend is made; run/backends/__init__.py falls back to 'numpy' without it."""
from __future__ import annotations

import ctypes
import functools

import numpy

from ....arrays import dtype_name
from ....ir.ops import hands_on
from ....plan.backward import kept_values
from ....plan.items import Fused, FusedGrad, ParamSum
from ....plan.loops import STRATEGIES
from ....errors import RnnGraphError
from ..base import ArrayBackend, strategy_runners
from .blas import Mkl, Threads, mkl as find_mkl, numpy_blas, omatcopy, threads
from .fused import fused_source, group_spec, overlaps, spec_arrays
from .jit import load
from .source import storage_of, window


ROOM = strategy_runners(__package__)     # loop item kind -> this room's module for its strategy


def _nothing():
    """The launch of a fused backward whose every gradient is in another node's buffer already."""


class CpuBackend(ArrayBackend):
    """numpy arrays; compile() turns fused groups and whole time loops into numba functions (cached on disk,
    jit.py) and the GEMMs accumulate in BLAS without temporaries. Mode 'naive' compiles nothing.

    Threads: where MKL is installed, every GEMM, each direction's loop and the gradients' zeroing run on
    rnngraph's own pool (numba's, one thread a core), split by rows, MKL sequential inside; else the GEMMs run
    in numpy's BLAS pool. A hoisted fused pass over many rows splits them the same way (an LSTM's input biases at
    T = 100, B = 32, H = 256: 1.30 -> 0.57 ms a step, for half a second more of numba's compiling on a first call
    with its cache empty). blas_threads limits either pool for
    rnngraph's calls: 1 where another pool computes between them in the same process (torch's, under
    rnngraph.torch), since two pools of spinning threads on the same cores slow each other down several-fold."""
    name = "cpu"
    xp = numpy
    keeps_transposes = True     # numpy's BLAS: the loops' per-frame GEMMs read Wᵀ untransposed (stages.Loop.gemm)
    alias_grads = True          # an LSTM's five equal gate gradients one buffer (plan/aliases.py)
    kernel_loops = frozenset(s.name for s in STRATEGIES.values() if s.item in ROOM and s.runs_as is None)

    def __init__(self, mode: str = "staged", blas_threads: int | None = None, mkl: bool = True):
        super().__init__(mode)
        from . import prelude
        if blas_threads is not None and (not isinstance(blas_threads, int) or blas_threads < 1):
            raise RnnGraphError(f"blas_threads must be a positive int or None (numpy's BLAS as it is), got "
                                f"{blas_threads!r}")
        if not isinstance(mkl, bool):
            raise RnnGraphError(f"mkl must be True (MKL where it is installed) or False (numpy's BLAS), got {mkl!r}")
        self.prelude, self.mkl = prelude, find_mkl() if mkl else "mkl=False asks for numpy's BLAS"
        if isinstance(self.mkl, Mkl) and (blas_threads or threads()) > 1 and not prelude.fast_threads():
            self.mkl = "numba's thread pool here is its own workqueue, as slow to wake as Python's threads"
        self.threads = Threads(blas_threads, own=isinstance(self.mkl, Mkl))
        self.keeps_transposes = not isinstance(self.mkl, Mkl)       # MKL packs W itself, transposing as it goes
        self._omatcopy = {d: omatcopy(numpy_blas(), d) for d in ("float32", "float64")}     # the prelude found the BLAS

    def gemm(self, a, b, out, *, ta: bool = False, tb: bool = False, accumulate: bool = False):
        """As numpy's, through BLAS straight into out (accumulating with beta = 1: no temporary, no extra pass):
        MKL's on the backend's threads, out's rows split among them, where it is; else numpy's BLAS in its pool."""
        wa, wb, wc, name = window(a), window(b), window(out), dtype_name(out.dtype)
        if name not in ("float32", "float64") or {a.ndim, b.ndim, out.ndim} != {2} or \
                {a.dtype, b.dtype} != {out.dtype} or None in (wa, wb, wc) or 0 in a.shape + out.shape:
            return super().gemm(a, b, out, ta=ta, tb=tb, accumulate=accumulate)
        (M, N), K, single = out.shape, a.shape[0 if ta else 1], name == "float32"
        if isinstance(self.mkl, Mkl):
            fn = self.prelude.gemm_rows32 if single else self.prelude.gemm_rows64
            return fn(self.threads.parts(M, M * N * K), ta, tb, M, N, K, wa[0], wa[1], wb[0], wb[1],
                      1 if accumulate else 0, wc[0], wc[1])
        fn = self.prelude.gemm32 if single else self.prelude.gemm64
        self.threads.run(fn, ta, tb, M, N, K, wa[0], 0, wa[1], wb[0], wb[1], 1 if accumulate else 0, wc[0], 0, wc[1])

    def unstored(self, sched) -> frozenset:
        """The members of compiled fused groups that the rest of the step never reads (fused.group_spec)."""
        cell, out = sched.cell, set()
        for it in sched.items if self.mode != "naive" else ():
            if isinstance(it, Fused) and group_spec(cell, it.nodes, "fwd") is not None:
                out |= set(it.nodes) - kept_values(cell, it.nodes)
        return frozenset(out)

    def copy(self, dst, src):
        """dst[...] = src, its bytes split over the backend's threads where both are contiguous arrays of one
        shape and dtype (a call's inputs and output gradients into its workspace: an MGU's step at T = 100,
        B = 32, H = 256 took 0.7 ms less, 3%)."""
        same = isinstance(src, numpy.ndarray) and src.shape == dst.shape and src.dtype == dst.dtype
        parts = self.threads.parts(dst.size, dst.size) if same and dst.flags.c_contiguous and \
            src.flags.c_contiguous else 1
        if parts > 1:
            return self.prelude.copy_parts(parts, dst.reshape(-1).view(numpy.uint8), src.reshape(-1).view(numpy.uint8))
        super().copy(dst, src)

    def backward_spec(self, cell, step, loop, aliases):
        """The spec of the group's compiled function (fused.group_spec), hoisted or inside any compiled loop."""
        return group_spec(cell, step.item.nodes, "bwd", aliases)

    def zero(self, a):
        """memset, split over the backend's threads: a workspace's gradients (LSTM, T = 100, B = 32, H = 256:
        104 MB) in 5.1 ms on two threads of a 2-core Xeon, against 9.2 for one memset and more for numpy's fill."""
        if not a.flags.c_contiguous:
            return super().zero(a)
        parts = self.threads.parts(a.nbytes, a.size)
        if parts > 1:
            self.prelude.zero_parts(parts, a.reshape(-1).view(numpy.uint8))
        else:
            ctypes.memset(a.ctypes.data, 0, a.nbytes)

    def transpose_into(self, dst, src):
        """Through BLAS's out-of-place transpose where it has one (OpenBLAS): a [1024, 256] float32 matrix in
        54-65 µs, against 336 for numpy's transposed copy, once a forward for the per-frame weights."""
        fn = self._omatcopy.get(dtype_name(src.dtype))
        if fn is None or src.ndim != 2 or src.size == 0 or not (src.flags.c_contiguous and dst.flags.c_contiguous):
            return super().transpose_into(dst, src)
        self.threads.run(fn, *src.shape, src, dst)

    def _compile_fused(self, cell, item, env, per_frame):
        return self._fused_launch(cell, item.nodes, "fwd", per_frame, lambda keys: spec_arrays(keys, env))

    def _compile_fused_grad(self, cell, item, views, per_frame):
        env, genv, targets, aliases, parts = views
        if item.params or item.atomic or not item.one_kernel or parts:     # parts: the executor adds them first
            return None
        return self._fused_launch(cell, item.item.nodes, "bwd", per_frame,
                                  lambda keys: spec_arrays(keys, env, genv, targets), aliases)

    def _fused_launch(self, cell, nodes, direction, per_frame, arrays, aliases=None):
        """One call of a group's compiled function on its arrays ([R, F] rows, vectors [F]), or None; nothing
        to call where the group writes nothing (its gradients are all other nodes' buffers: plan/aliases.py)."""
        spec = group_spec(cell, nodes, direction, aliases)
        if spec is None or self.mode == "naive" or overlaps(spec, per_frame):
            return None
        if not spec.outputs:
            return ((_nothing, ()),)
        storage = storage_of(arrays(spec.outputs[:1])[0])
        if storage is None:
            return None
        F = cell.op(nodes[-1]).size
        made = arrays(spec.inputs + spec.outputs)
        rows = next(a.shape[0] for a in made if a.ndim == 2)
        parts = 1 if per_frame else self.threads.parts(rows, rows * F)
        name, src, keys = fused_source(spec, F, storage, split=parts > 1)
        wins = [window(a) for a in arrays(keys)]
        if any(w is None for w in wins):
            return None
        args = (rows, *(x for w, ld in wins for x in (w, 0, ld)))
        module = load(src)
        return ((getattr(module, f"{name}_split"), (parts, *args)),) if parts > 1 else ((getattr(module, name), args),)

    def _compile_param_sum(self, cell, item, views, per_frame):
        """out [F] += Σ_rows g [N, F] of each term whose rule hands the parameter the gradient itself (a bias of
        an add), as the GEMM gᵀ · 1 in MKL on the backend's threads: 0.12 ms against numpy's sum's 0.32 for
        [3200, 256] float32 columns of a wider buffer on this 2-core Xeon. None for other rules, or without MKL."""
        terms, out = views
        if not isinstance(self.mkl, Mkl) or dtype_name(out.dtype) not in ("float32", "float64") or \
                not all(hands_on(cell.op(n).kind, slot) for n, slot, *_ in terms):
            return None
        ones, col = numpy.ones((terms[0][2].shape[0], 1), out.dtype), out.reshape(-1, 1)
        column_sum = functools.partial(self.gemm, ta=True, accumulate=True)
        return tuple((column_sum, (g, ones, col)) for _, _, g, *_ in terms)

    COMPILE = {Fused: _compile_fused, FusedGrad: _compile_fused_grad, ParamSum: _compile_param_sum}
    RUNNERS = ROOM

    def launch(self, launchable):
        """Runs what compile returned: (compiled function, arguments) calls, in order."""
        for fn, args in launchable:
            self.threads.run(fn, *args)
