"""The GPU backend on CuPy: generated fused kernels, capturable GEMMs, CUDA-graph replay, and the loop
strategies' kernels through their runner modules in this room.

cupy is imported lazily, so rnngraph works without it. Any CUDA build of cupy (cupy-cuda12x,
cupy-cuda13x) works: only the generic `cupy` module is used.
"""
from __future__ import annotations

import functools
import warnings

from ....errors import RnnGraphError, RnnGraphWarning
from ....plan.backward import kept_values
from ....plan.items import Fused, FusedGrad, Gemm, GemmGrad, Pair, ParamSum
from ....plan.loops import STRATEGIES, strategy_of
from ...settings import switch
from ..base import ArrayBackend, GatherPlan, head_parts, strategy_runners
from . import x3
from .chunks import chunk_launch
from .fused import fusable
from .gather import copy_runs_launch, runs_table, zero_runs_launch, zero_runs_table
from .matmul import GEMV_ROWS, matmul_source
from .pair import GEMV_FUSED_ROWS, PAIR_MAX_BYTES, pair_kernel
from .param_grad import param_grad_launches
from .recordings import Recordings, chunk_frames_setting
from .rows import group_kernel, row_group
from .source import CTYPES, complete, options
from .split import add_parts_launch, product_parts, with_parts

_KERNELS: dict = {}      # process-wide cache: (kernel name, generated source, options) -> compiled kernel object
ROOM = strategy_runners(__package__)     # loop item kind -> this room's module for its strategy


class CupyBackend(ArrayBackend):
    """cupy arrays. In mode 'graph', each forward and backward body (or, where that is not capturable,
    each time loop) is recorded once as a CUDA graph and replayed.

    matmul: 'cublas' runs every GEMM through cuBLAS's C API, which can be recorded, so whole bodies
    are captured; 'own' (with capture) compiles the per-frame GEMMs into our capturable GEMV (B ≤ 8)
    and tiled GEMM kernels and runs CuPy's cuBLAS eagerly around the loop, so only time loops are captured.
    tf32: float32 products may round their inputs to TF32 (10-bit mantissa) on tensor cores, as torch's
    allow_tf32: cuBLAS's GEMMs and the persistent loop's (needs matmul 'cublas'; rnngraph.torch sets it from
    torch's flags). Off by default: float32 then rounds as float32.
    """
    name = "cupy"
    modes = ("naive", "staged", "graph")
    compiles_heads = True
    keeps_transposes = True
    twin_sums = True        # an LSTM's b_ih and b_hh: 4 bias sums over all rows, not 8
    kernel_loops = frozenset(s.name for s in STRATEGIES.values() if s.item in ROOM)
    walking_loops = frozenset({"persistent", "elementwise", "scan"})      # their kernels read n from the cursor

    def __init__(self, mode: str = "staged", matmul: str = "cublas", lanes: int = 1, max_graphs: int = 1024,
                 max_graph_bytes: int | None = None, chunk_frames: int | None = None, tf32: bool = False):
        import cupy
        from .cublas import Cublas
        super().__init__(mode)
        if matmul not in ("cublas", "own"):
            raise RnnGraphError(f"unknown matmul {matmul!r}; choose 'cublas' or 'own'")
        self.xp = cupy
        capture = self.capture = mode == "graph"
        self.chunk_frames = chunk_frames_setting(chunk_frames) if capture else 0   # graph mode: recordings of K frames
                                                                                   # (None: each strategy's)
        self.graphs = Recordings(cupy, max_graphs, max_graph_bytes) if capture else None
        self._head_transposed: dict = {}  # id(packed head-wise per-frame W) -> (W, [(W_j [k, o, i], W_j's heads
                                          # transposed [k, i, o])]), for our own kernels' d operand
        self.blas = None
        if matmul == "cublas":
            try:
                self.blas = Cublas(cupy)
            except (OSError, RuntimeError, AttributeError) as e:
                warnings.warn(f"cuBLAS C API unavailable ({e}); using rnngraph's own GEMM kernels",
                              RnnGraphWarning, stacklevel=2)
        self.matmul = "cublas" if self.blas else "own"
        if tf32 and not self.blas:
            raise RnnGraphError("tf32=True needs cuBLAS (matmul='cublas'): rnngraph's own GEMM kernels compute "
                                "float32 in float32")
        if self.blas:
            self.blas.tf32 = bool(tf32)
        self.records = ("all" if self.blas else "loops") if capture else None
        self.own_loop_gemms = capture and self.matmul == "own"    # per-frame GEMMs as our own kernels
        self.lanes = [cupy.cuda.Stream(non_blocking=True) for _ in range(lanes if lanes > 1 else 0)]

    def to_numpy(self, a):
        return self.xp.asnumpy(a)

    def unstored(self, sched) -> frozenset:
        """The fused members whose values no kernel stores (rows.group_kernel): those of every elementwise group,
        the loop's too where it runs its groups (stages, persistent; the elementwise and scan loops' own kernels
        store their groups' members); and what a loop strategy's own kernels do not store, where its room says (the
        persistent loop's pairs' GEMM sums, the scan's products nothing else reads)."""
        cell, loop = sched.cell, [it for st in sched.loop for it in st]
        groups = [*sched.pre, *(() if sched.loop_strategy in ("elementwise", "scan") else loop), *sched.post]
        own = {n for sec in sched.forward for it in sec.items
               for n in getattr(ROOM.get(type(it)), "unstored", lambda cell, it: ())(cell, it)}
        return frozenset(own) | {n for it in groups if isinstance(it, Fused) and not row_group(cell, it.nodes)
                                 for n in set(it.nodes) - kept_values(cell, it.nodes)}

    def gather_plan(self, idx, runs) -> GatherPlan:
        """The runs as a device table: gather() copies them all in one launch (gather.py)."""
        return GatherPlan(len(idx), runs, runs_table(self.xp, runs))

    def gather(self, src, plan: GatherPlan, out):
        kernel, grid, block, args = copy_runs_launch(self, src, plan.table, plan.runs, out)
        kernel(grid, block, args)

    def zero_plan(self, a, runs):
        """(runs, their bytes a device table and the longest's bytes, or None for a run or none: a memset)."""
        return runs, zero_runs_table(self.xp, a, runs) if len(runs) > 1 else None

    def zero_runs(self, a, plan, k: int = 0):
        """Every run in one kernel (gather.py), a lone run by a memset."""
        runs, table = plan
        if table is None:
            return super().zero_runs(a, runs, k)
        kernel, grid, block, args = zero_runs_launch(self, a, *table, k)
        kernel(grid, block, args)

    def copy(self, dst, src):
        """One asynchronous memcpy where both are contiguous, of one shape or dst [1, ...] of src's (a few µs of host
        time, against ~15 for a copy kernel launched through indexing), else an elementwise copy."""
        if dst.flags.c_contiguous and src.flags.c_contiguous and dst.dtype == src.dtype and \
                (dst.shape == src.shape or dst.shape == (1, *src.shape)):
            dst.data.copy_from_device_async(src.data, dst.nbytes)
        else:
            dst[...] = src

    def upload(self, dst, host):
        dst.set(host)

    def compile_chunk(self, op, cursor, args):
        return chunk_launch(self, op, cursor, args)

    def synchronize(self):
        self.xp.cuda.get_current_stream().synchronize()

    @functools.cached_property
    def memory_bytes(self) -> int:
        return self.xp.cuda.runtime.memGetInfo()[1]         # the current GPU's total

    def pack(self, out, parts, transpose: bool = False):
        super().pack(out, parts, transpose)
        if transpose:
            heads = self._head_transposed.get(id(out))
            for w, tr in heads[1] if heads and heads[0] is out else ():
                tr[...] = w.transpose(0, 2, 1)

    # -- matrix products ----------------------------------------------------------------------
    def gemm(self, a, b, out, *, ta: bool = False, tb: bool = False, accumulate: bool = False):
        form = _BLAS_FORMS.get((ta, tb, accumulate))
        if self.blas and form and self.blas.usable(a, b, out):
            form(self.blas, a, b, out)
        else:
            super().gemm(a, b, out, ta=ta, tb=tb, accumulate=accumulate)

    def gemm_frames(self, a, b, out, *, ta: bool = False, tb: bool = False, accumulate: bool = False):
        """float32 with TF32 not allowed in 3xTF32 on tensor cores where x3.applies, else gemm."""
        if x3.applies(self, a, b, out, ta, tb):
            x3.product(self, a, b, out, ta, tb, accumulate)
        else:
            self.gemm(a, b, out, ta=ta, tb=tb, accumulate=accumulate)

    def gemm_grads_frames(self, g, w, x, gx, gw, *, accumulate: bool = False):
        """Both in 3xTF32, g split once for the two (x3.grads), where x3.applies_grads; else gemm_frames each."""
        if not (x3.applies_grads(self, g, w, x, gx, gw) and x3.grads(self, g, w, x, gx, gw, accumulate)):
            super().gemm_grads_frames(g, w, x, gx, gw, accumulate=accumulate)

    @functools.cached_property
    def split3(self):
        """[2, 3 · x3.SPLIT_ELEMENTS] float32: x3's split operands, made once (recordings keep the address)."""
        return self.xp.empty((2, 3 * x3.SPLIT_ELEMENTS), self.xp.float32)

    def head_gemm(self, a, b, out, *, ta: bool = False, tb: bool = False, accumulate: bool = False):
        """One strided-batched cuBLAS GEMM over the heads (capturable), else the reference."""
        form = _BLAS_FORMS.get((ta, tb, accumulate))
        if self.blas and form and self.blas.usable(a, b, out):
            form(self.blas, a, b, out)
        else:
            super().head_gemm(a, b, out, ta=ta, tb=tb, accumulate=accumulate)

    def _compile_gemm(self, cell, item, views, per_frame):
        """A per-frame GEMM as our own capturable kernel (x [B, K] · W [M, K]ᵀ), when they run the loop; a
        head-wise one as one launch per (linear op, head): out_j[h] = x[h] · W_j[h]ᵀ."""
        x, w, out = views
        if not (per_frame and self.own_loop_gemms):
            return None
        if item.heads == 1:
            return (self.matmul_launch(x, w, out, accumulate=False),)
        return tuple(self.matmul_launch(xh[h], wj[h], o[h], accumulate=False)
                     for o, wj, xh in head_parts(item, out, w, x) for h in range(item.heads))

    def _compile_gemm_grad(self, cell, item, views, per_frame):
        """d operand [B, K] += g [B, M] · W [M, K] as our own kernel, through the transpose pack keeps; a
        head-wise one per (linear op, head) through its heads' transposes, kept from now on (pack refreshes them)."""
        g, w, _, gx, _ = views
        if not (per_frame and self.own_loop_gemms and self.transposed(w) is not None):
            return None
        if item.item.heads == 1:
            return (self.matmul_launch(g, self.transposed(w), gx, accumulate=True),)
        parts = head_parts(item.item, g, w, gx)
        kept = self._head_transposed.get(id(w))
        if kept is None or kept[0] is not w:
            kept = self._head_transposed[id(w)] = (w, [(wj, wj.transpose(0, 2, 1).copy()) for _, wj, _ in parts])
        return tuple(self.matmul_launch(gj[h], tr[h], gxh[h], accumulate=True)
                     for (gj, _, gxh), (_, tr) in zip(parts, kept[1]) for h in range(item.item.heads))

    def _compile_param_sum(self, cell, item, views, per_frame):
        """out [F] += Σ_rows of each reading node's backward expression for the vector parameter."""
        terms, out = views
        return tuple(ln for n, slot, g, ins, y in terms
                     for ln in param_grad_launches(self, cell, n, slot, g, ins, y, out))

    def matmul_launch(self, a, w, c, accumulate: bool):
        """c [N, M] (+)= a [N, K] · w [M, K]ᵀ with our own kernels (capturable without cuBLAS): one launch."""
        N, K = a.shape
        M = w.shape[0]
        if a.strides[1] != a.itemsize or c.strides[1] != c.itemsize or not w.flags.c_contiguous:
            raise RnnGraphError("internal: capturable matmul needs unit column strides")
        kind = "gemv" if N <= GEMV_ROWS else "gemm"
        k = self._matmul_kernel(kind, a.dtype)
        args = (a, self.xp.int64(a.strides[0] // a.itemsize), w, c, self.xp.int64(c.strides[0] // c.itemsize),
                self.xp.int32(N), self.xp.int32(M), self.xp.int32(K), self.xp.int32(accumulate))
        grid = ((M * 32 + 255) // 256,) if kind == "gemv" else ((M + 31) // 32, (N + 31) // 32)
        return k, grid, (256,), args

    def _matmul_kernel(self, kind, dtype):
        ctype = CTYPES[str(dtype)]
        return self.raw(f"rg_{kind}_{ctype}", matmul_source(kind, ctype))

    # -- fused elementwise groups --------------------------------------------------------------
    def _compile_fused(self, cell, item, env, per_frame):
        """A fused group's generated kernel at one frame (or all): a thread per element, or a block per row
        where it holds a row reduction; None where ops lack a kernel rule."""
        spec = _spec(cell, item, "fwd")
        return spec and (self._fused_launch(spec, _fused_arrays(spec, env)),)

    def _compile_fused_grad(self, cell, item, views, per_frame):
        """The group's backward kernel, adding the parts of products that left their sum to it (split.py)."""
        env, genv, targets, _, parts = views
        spec = _spec(cell, item.item, "bwd_atomic" if item.atomic else "bwd")
        if spec and parts:
            spec = with_parts(spec, {n: p.shape[0] for n, p in parts.items()})
        return spec and (self._fused_launch(spec, _fused_arrays(spec, env, genv, targets), list(parts.values())),)

    def backward_spec(self, cell, step, loop, aliases):
        """The spec of the group's elementwise kernel (_spec), which runs it hoisted, frame by frame and inside the
        persistent loop's kernel (persistent/phases.sources); None for the elementwise loop's kernel (it reads
        every member's gradient) and the scan's, and for row, atomic and parameter-summing kernels."""
        if loop is not None and strategy_of(loop).name != "persistent" or step.params or step.atomic or \
                not step.one_kernel or row_group(cell, step.item.nodes):
            return None
        return _spec(cell, step.item, "bwd")

    def product_parts(self, g, w, cell, reader, node, parts=None):
        """In parts where they measured faster and the reader's kernel adds them (split.py)."""
        spec = _spec(cell, reader.item, "bwd_atomic" if reader.atomic else "bwd")
        return product_parts(self, g, w, spec, node, parts)

    def add_parts(self, out, parts):
        self.launch((add_parts_launch(self, out, parts),))

    def _compile_pair(self, cell, item, views, per_frame):
        """GEMV (rows ≤ 8) plus the fused group as one kernel, one block per feature, while rows × the
        weights' bytes stay within PAIR_MAX_BYTES: beyond that (B = 1 at H ≥ 1024, B = 8 at H = 512 in
        fp32) the H200 ran the GEMM and the fused kernel faster apart."""
        (x, w, out), env = views
        gemm, fused = item.gemm, item.fused
        dense = all(a.strides[-1] == a.itemsize for a in (x, w, out)) and w.flags.c_contiguous
        if x.shape[0] > GEMV_FUSED_ROWS or x.shape[0] * w.nbytes > PAIR_MAX_BYTES or not dense or \
                not fusable(cell, fused.nodes):
            return None
        spec = _spec(cell, fused, "fwd")
        kernel = self.raw(*pair_kernel(spec, gemm, CTYPES[str(out.dtype)]))
        return ((kernel, (out.shape[1] // len(gemm.nodes),), (128,),
                 self._pair_args(x, w, out, spec, _fused_arrays(spec, env))),)

    def _pair_args(self, a, w, c, spec, arrays):
        """GEMV operand a [N, K], weights w [M, K] and output c, then the fused group's arguments."""
        cp = self.xp
        head = (a, cp.int64(a.strides[0] // a.itemsize), w, cp.int32(w.shape[1]), c,
                cp.int64(c.strides[0] // c.itemsize))
        return head + self._fused_args(spec, arrays)

    def _fused_launch(self, spec, arrays, parts=()):
        out = arrays[len(spec.in_names)]
        kernel = self.raw(*spec.source(CTYPES[str(out.dtype)]))
        return (kernel, *spec.launch_shape(*out.shape), self._fused_args(spec, arrays, parts))

    def _fused_args(self, spec, arrays, parts=()):
        """Pointer and row-stride pairs of a fused kernel's arrays, its parts [S, rows, F] (spec.parts), then its
        rows and features."""
        rows, F = arrays[len(spec.in_names)].shape
        if any(p.shape[1:] != (rows, F) for p in parts):
            raise RnnGraphError("internal: a product's parts are not shaped like the rows of the kernel adding them")
        return tuple(self.row_args(arrays) + list(parts) + [self.xp.int64(rows), self.xp.int32(F)])

    def row_args(self, arrays) -> list:
        """Pointer and row-stride pairs: rows [N, F] with unit column stride, or vectors [F] (stride 0)."""
        args = []
        for a in arrays:
            if a.ndim == 2 and a.shape[1] > 1 and a.strides[1] != a.itemsize:
                raise RnnGraphError("internal: kernel operands need unit column stride")
            args += [a, self.xp.int64(0 if a.ndim == 1 else a.strides[0] // a.itemsize)]
        return args

    def half_problem(self, dtype) -> str | None:
        """Why half-precision `dtype` cannot run on this GPU and cupy, or None. bfloat16 needs cupy's
        ml_dtypes support (cupy 14) and cuBLAS's bfloat16 GEMMs (compute capability 8.0)."""
        cp = self.xp
        try:
            cp.zeros(1, dtype)
        except Exception as e:
            return (f"cupy {cp.__version__} has no {dtype.name} arrays ({type(e).__name__}: {e}); "
                    "bfloat16 needs cupy 14 or newer with ml_dtypes installed")
        cc = int(cp.cuda.Device().compute_capability)       # "90" for 9.0
        if dtype.name == "bfloat16" and cc < 80:
            return (f"bfloat16 GEMMs need a GPU of compute capability 8.0 or newer (this one is {cc // 10}.{cc % 10}); "
                    "use float16 or float32")
        return None

    def frame_args(self, arrays, B: int) -> list:
        """Pointer and stride pairs of arrays addressed by frame: [N, B, F] views whose element (t, b, f)
        is at (t·B + b)·ld + f, or vectors [F] (ld = 0)."""
        args = []
        for a in arrays:
            ld = 0 if a.ndim == 1 else a.strides[0] // (B * a.itemsize)
            if a.ndim != 1 and (a.strides[-1] != a.itemsize or a.strides[0] != B * ld * a.itemsize
                                or (B > 1 and a.strides[1] != ld * a.itemsize)):
                raise RnnGraphError("internal: loop kernel operands need frame-major rows with unit column stride")
            args += [a, self.xp.int64(ld)]
        return args

    def running_args(self, running) -> tuple:
        """(run, tab) of a kernel walking time: a chunk's workspace's cursor and where its chunks' rows start
        (the kernel walks the running chunk's n frames), else a null pointer (it walks all T)."""
        return (running[0], self.xp.int32(running[1])) if running else (self.xp.uint64(0), self.xp.int32(0))

    def raw(self, name: str, src: str, cooperative: bool = False):
        """The compiled kernel `name` of `src`, built once per process and compiler options (cooperative: launched
        so; fast math in bfloat16 unless RNNGRAPH_FAST_MATH=0: source.options)."""
        opts = options(src, fast=switch("RNNGRAPH_FAST_MATH") is not False)
        if (name, src, opts) not in _KERNELS:
            _KERNELS[name, src, opts] = self.xp.RawKernel(complete(src), name, options=opts,
                                                          enable_cooperative_groups=cooperative)
        return _KERNELS[name, src, opts]

    COMPILE = {Gemm: _compile_gemm, GemmGrad: _compile_gemm_grad, Fused: _compile_fused,
               FusedGrad: _compile_fused_grad, Pair: _compile_pair, ParamSum: _compile_param_sum}
    RUNNERS = ROOM

    def overlap(self, fns):
        """With lanes > 1: the stage's items fork onto the lane streams and join back (events);
        inside a capture this records parallel branches of the graph."""
        if not self.lanes:
            return super().overlap(fns)
        cp, main = self.xp, self.xp.cuda.get_current_stream()
        fork = cp.cuda.Event(disable_timing=True)
        fork.record(main)
        joins = []
        for k, fn in enumerate(fns):
            lane = self.lanes[k % len(self.lanes)]
            lane.wait_event(fork)
            with lane:
                fn()
            joins.append(cp.cuda.Event(disable_timing=True))
            joins[-1].record(lane)
        for e in joins:
            main.wait_event(e)

    # -- CUDA graphs ---------------------------------------------------------------------------
    def record(self, key, fn):
        """Eager unless capturing; then recorded once per key and replayed (recordings.Recordings)."""
        return self.graphs.run(key, fn) if self.capture else fn()

    def forget(self, serials: set):
        if self.capture:
            self.graphs.forget(serials)

    def cache_info(self) -> dict:
        return self.graphs.info() if self.capture else super().cache_info()


_BLAS_FORMS = {(False, True, False): lambda blas, x, w, out: blas.nt(x, w, out),     # forward
               (False, False, True): lambda blas, g, w, out: blas.nn(g, w, out),     # d operand
               (True, False, True): lambda blas, g, x, out: blas.tn(g, x, out)}      # d weights


_SPECS: dict = {}

def _spec(cell, item, direction):
    """The generated kernel spec of a fused group (rows.group_kernel), built once per (cell, group, direction);
    None where an op has no kernel rule."""
    key = (id(cell), item, direction)
    if key not in _SPECS:
        _SPECS[key] = (cell, group_kernel(cell, item.nodes, direction))
    return _SPECS[key][1]


def _fused_arrays(spec, env, genv=None, targets=None) -> list:
    """The arrays behind a fused kernel's arguments, in its order (slice reads as column views)."""
    pick = {"ext": lambda k: _slice(env[k[:2]], k[2]), "val": env.__getitem__, "out": env.__getitem__,
            "grad": lambda k: genv[k], "gext": lambda k: _slice(targets[k[:2]], k[2])}
    return [pick[kind](key) for kind, key in spec.inputs + spec.outputs]


def _slice(a, cols):
    return a if cols is None else a[..., cols[0]:cols[1]]
