"""Loop strategy 'stages' on the CPU: a direction's whole time loop as one compiled function over a range of
the batch's rows, each range on its own thread (a frame's rows never read one another's: the items below act
row by row). Each frame runs the loop's items in order: a merged GEMM straight into its output rows (its
backward accumulating into the operand's gradient, no temporary), through MKL's packed GEMM where it is
installed (the weights packed once a call) else numpy's BLAS; a fused group as its compiled function (fused.py)
in one pass over the rows × F; and the runner that compiles it on the executor's views.

Every buffer arrives as a window (source.window) and frame t's rows b0.. of a node read with delay d start at
((P + t − d)·B + b0)·ld. None where an item has no compiled form (a row reduction, parameter gradients inside
the loop as the naive schedule has, float16): the executor then runs the loop frame by frame.
"""
from __future__ import annotations

import numpy as np

from ....plan.items import Fused, FusedGrad, Gemm, GemmGrad, Pair
from .blas import CBLAS_PACK_B, Mkl
from .fused import fused_source, group_spec, overlaps
from .jit import load
from .source import storage_of, window

LOOP_SOURCE = '''
@njit(**JIT)
def {name}(T, P, B, b0, m, {args}):
{setup}
    for t in {frames}:
{body}
'''

# the loop over `parts` ranges of rows on numba's threads, each with its own packed weights (k[p])
ROWS_SOURCE = '''
@njit(parallel=True, **JIT)
def rows(T, P, B, parts, {args}):
    for p in prange(parts):
        b0 = B * p // parts
        loop(T, P, B, b0, B * (p + 1) // parts - b0, {part_args})
'''


class Loop:
    """The source of one time loop being generated: its arguments (windows, by what they hold), the fused
    functions it calls, and its body, item by item."""

    def __init__(self, cell, views, storage: str, transposed=lambda w: None, packed: bool = False):
        self.cell, self.storage, self.B, self.transposed = cell, storage, views.B, transposed
        self.packed = packed and storage in ("float32", "float64")
        self.vals, self.grads, self.aliases = views.vals, views.grads, views.aliases
        self.cat, self.wcat = getattr(views, "cat", {}), getattr(views, "wcat", {})     # elementwise: no GEMMs
        self.args, self.arrays, self.functions, self.setup, self.body = {}, [], {}, [], []
        self.packs = []     # (N, K) of each packed weight: its buffer an argument of its own for each range of rows

    def arg(self, key, array) -> tuple | None:
        """(argument name, row stride) of an array, passed once as a window; None where it has no window."""
        if key not in self.args:
            w = window(array)
            if w is None:
                return None
            self.args[key] = (f"a{len(self.arrays)}", w[1])
            self.arrays.append(w[0])
        return self.args[key]

    def rows(self, grads: bool, n: str, d: int, cols=None) -> tuple | None:
        """(window name, its first element at frame t, row stride) of node n read with delay d (its columns
        cols where a slice reads it); a parameter is itself at every frame."""
        buf = (self.grads if grads else self.vals)[n]
        view = buf if cols is None else buf[..., cols[0]:cols[1]]
        made = self.arg(("grad" if grads else "val", n, cols), view)
        if made is None:
            return None
        name, ld = made
        return name, ("0" if buf.ndim == 1 else f"((P + t - {d}) * B + b0) * {ld}"), ld

    # -- one method per item kind: False where the item has no compiled form ----------------------------
    def gemm(self, it: Gemm) -> bool:
        """out [m, ΣF] = x@t-d [m, K] · Wᵀ at frame t; packed where MKL is, else in float32 and float64 as
        x · (Wᵀ kept by pack) [K, ΣF], untransposed: OpenBLAS's small GEMMs ran 1.4× (B = 32, H = 256) to 3×
        (B = 8, H = 128) faster so with its SkylakeX kernels, as fast with its Haswell ones."""
        x = self.rows(False, it.operand, it.delay)
        out, w = self.arg(("cat", it), self.cat[it][0]), self.arg(("w", it), self.wcat[it][0])
        if x is None or out is None or w is None:
            return False
        N, K = sum(it.sizes), self.cell.op(it.operand).size
        rows = (out[0], f"((P + t) * B + b0) * {N}", N)
        wt = self.transposed(self.wcat[it][0]) if self.storage in ("float32", "float64") else None
        if wt is not None and not self.packed:
            self.call(False, N, K, x, self.arg(("wt", it), wt)[0], N, 0, rows, it)
        else:
            self.call(True, N, K, x, w[0], w[1], 0, rows, it)
        return True

    def gemm_grad(self, step: GemmGrad) -> bool:
        """dx@t-d [m, K] += d out [m, ΣF] · W [ΣF, K] at frame t (the weights' gradients are hoisted); '=' where
        this is the one write of dx (plan/aliases.py: assigned)."""
        it = step.item
        if step.params:
            return False
        gx = self.rows(True, it.operand, it.delay)
        g, w = self.arg(("dcat", it), self.cat[it][1]), self.arg(("w", it), self.wcat[it][0])
        if gx is None or g is None or w is None:
            return False
        N, K = sum(it.sizes), self.cell.op(it.operand).size      # g's rows: columns of a wider one's (aliases)
        beta = 0 if it.operand in self.aliases.assigned else 1          # its gradient's one write (aliases)
        self.call(False, K, N, (g[0], f"((P + t) * B + b0) * {g[1]}", g[1]), w[0], w[1], beta, gx, it)
        return True

    def call(self, tb: bool, N: int, K: int, a: tuple, w: str, ldb: int, beta: int, c: tuple, it):
        """The BLAS call c [m, N] (+)= a [m, K] · op(w) (w stored [N, K] where tb); packed where MKL is (its
        rows' own copy of op(w), packed before the loop); half storage through float32 copies (the weights'
        widened once before the loop, operand and result per frame, rounded once when stored)."""
        bits = "32" if self.storage == "float32" else "64"
        if self.packed:
            buf = f"k{len(self.packs)}"
            self.packs.append((N, K))
            self.setup.append(f"pack{bits}({tb}, m, {N}, {K}, {w}, {ldb}, {buf})")
            self.body.append(f"gemm_packed{bits}(m, {N}, {K}, {a[0]}, {a[1]}, {a[2]}, {buf}, {beta}, {c[0]}, {c[1]}, "
                             f"{c[2]})")
            return
        if self.storage in ("float32", "float64"):
            self.body.append(f"gemm{bits}(False, {tb}, m, {N}, {K}, {a[0]}, {a[1]}, {a[2]}, {w}, {ldb}, {beta}, "
                             f"{c[0]}, {c[1]}, {c[2]})")
            return
        if ("w32", it) not in self.args:
            rows, cols = self.wcat[it][0].shape
            self.setup.append(f"widen({w}, 0, {cols}, {rows}, {cols}, "
                              f"{self.arg(('w32', it), np.zeros(rows * cols, np.float32))[0]})")
        w32 = self.args["w32", it][0]
        a32 = self.arg(("a32", it, tb), np.zeros(self.B * K, np.float32))[0]
        c32 = self.arg(("c32", it, tb), np.zeros(self.B * N, np.float32))[0]
        self.body.append(f"gemm_bf16({tb}, m, {N}, {K}, {a[0]}, {a[1]}, {a[2]}, {w32}, {ldb}, {beta}, {c[0]}, {c[1]}, "
                         f"{c[2]}, {a32}, {c32})")

    def fused(self, it: Fused, direction: str = "fwd", step=None) -> bool:
        """The group's compiled function at frame t, its arguments the rows of what it reads and writes."""
        spec = group_spec(self.cell, it.nodes, direction, self.aliases)
        if spec is None or overlaps(spec, per_frame=True):
            return False
        if not spec.outputs:        # its gradients are all other nodes' buffers (plan/aliases.py)
            return True
        name, src, keys = fused_source(spec, self.cell.op(it.nodes[-1]).size, self.storage)
        self.functions[name] = src
        parts = []
        for kind, key in keys:
            grads, (n, d, cols) = kind in ("grad", "gext"), (key if kind in ("ext", "gext") else (key, 0, None))
            r = self.rows(grads, n, d, cols)
            if r is None:
                return False
            parts.append(f"{r[0]}, {r[1]}, {r[2]}")
        self.body.append(f"{name}(m, {', '.join(parts)})")
        return True

    def fused_grad(self, step: FusedGrad) -> bool:
        return step.one_kernel and not step.params and not step.atomic and self.fused(step.item, "bwd")

    def pair(self, it: Pair) -> bool:
        return self.gemm(it.gemm) and self.fused(it.fused)

    def source(self, reverse: bool) -> str:
        frames = "range(T - 1, -1, -1)" if reverse else "range(T)"
        packs, arrays = [f"k{i}" for i in range(len(self.packs))], [name for name, _ in self.args.values()]
        args = packs + arrays
        rows = ROWS_SOURCE.format(args=", ".join(args), part_args=", ".join([f"{k}[p]" for k in packs] + arrays))
        text = rows + LOOP_SOURCE.format(name="loop", args=", ".join(args),
                                  setup="\n".join("    " + ln for ln in self.setup) or "    pass",
                                  frames=frames, body="\n".join("        " + ln for ln in self.body))
        return "".join(self.functions[k] for k in sorted(self.functions)) + text


ITEMS = {Gemm: Loop.gemm, Fused: Loop.fused, Pair: Loop.pair, GemmGrad: Loop.gemm_grad, FusedGrad: Loop.fused_grad}


def compile(be, cell, loop, views):
    """The loop as one compiled call on the executor's views, or None where an item has no compiled form. Where
    the backend's GEMMs run in MKL, its rows split into Threads.parts ranges on numba's threads; half storage
    runs all rows on one thread (its GEMMs' float32 copies are the loop's own)."""
    vals, T, B, P = views.vals, views.T, views.B, views.P
    storage = storage_of(next(v for v in vals.values() if v.ndim == 3))
    if storage is None or be.mode == "naive":
        return None
    packed = be.mkl if isinstance(be.mkl, Mkl) else None
    gen = Loop(cell, views, storage, be.transposed, packed is not None)
    for st in loop.stages:
        for it in st.items:
            make = ITEMS.get(type(it))
            if make is None or not make(gen, it):
                return None
    module = load(gen.source(loop.reverse))
    parts = be.threads.parts(B) if gen.packed else 1
    if parts == 1 and not gen.packs:
        return ((module.loop, (T, P, B, 0, B, *gen.arrays)),)
    size = packed.sizes[storage == "float64"]
    rows = [B * (p + 1) // parts - B * p // parts for p in range(parts)]
    bufs = [np.empty((parts, max(size(CBLAS_PACK_B, m, N, K) for m in rows)), np.uint8) for N, K in gen.packs]
    return ((module.rows, (T, P, B, parts, *bufs, *gen.arrays)),)
