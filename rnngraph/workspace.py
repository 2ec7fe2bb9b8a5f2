"""The Workspace: static buffers for one (schedule, T, B, dtype), carved from flat arenas.

Layout: every node's value lives in a buffer [T+1, B, F]; frame t is row t+1 and row 0 holds the
initial state (zeros for nodes that are not states). A read with delay d at frame t is row
max(t+1-d, 0). Gradients mirror values. Nothing is allocated after construction, which is what
lets the GPU backend record the loops into CUDA graphs.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter

from .arrays import array_module
from .errors import RnnGraphError
from .ops import OpKind, accumulate
from .schedule import Gemm, Schedule

ALL = None  # the frame selector meaning "all T frames at once"
SERIAL = itertools.count()


class Workspace:
    """Static buffers for one (schedule, T, B, dtype): values and gradients carved from two flat
    arenas (one fill zeroes every gradient), packed weights, and memoised per-frame views."""

    def __init__(self, sched: Schedule, backend, T: int, B: int, dtype):
        cell = sched.cell
        self.T, self.B, self.dtype, self.serial, self.version = T, B, dtype, next(SERIAL), 0
        self.vals, self.grads, self.cat, self.wcat, self.memo, self.shift = {}, {}, {}, {}, {}, {}
        self.shared_weights = {w for w, k in Counter(w for n in cell.graph if cell.op(n).kind is OpKind.LINEAR
                                                     for w in [cell.reads(n)[1][0]]).items() if k > 1}
        gemms = [it for it in sched.items if isinstance(it, Gemm)]
        blocks = [((T + 1, B, sum(it.sizes)), it) for it in gemms]
        blocks += [((T + 1, B, cell.op(n).size), n) for n in cell.graph
                   if cell.op(n).kind is not OpKind.PARAM and n not in {m for it in gemms for m in it.nodes}]
        shifts = sorted({(u, d["delay"]) for u, _, d in cell.graph.edges(data=True)
                         if d["delay"] >= 2 and cell.op(u).kind is not OpKind.PARAM})
        blocks += [((T, B, cell.op(u).size), ("shift", u, d)) for u, d in shifts]
        wblocks = [((sum(it.sizes), cell.op(it.operand).size), it) for it in gemms]
        pblocks = [(cell.params[p], p) for p in cell.params]
        vals = _carve(backend, dtype, [s for s, _ in blocks + wblocks])
        self.grad_arena, grads = _carve(backend, dtype, [s for s, _ in blocks + wblocks + pblocks], arena=True)
        for (_, key), v, g in zip(blocks + wblocks + pblocks, vals + [None] * len(pblocks), grads):
            if isinstance(key, Gemm) and v.ndim == 3:
                self.cat[key] = (v, g)
                off = 0
                for n, f in zip(key.nodes, key.sizes):
                    self.vals[n], self.grads[n] = v[..., off:off + f], g[..., off:off + f]
                    off += f
            elif isinstance(key, Gemm):
                self.wcat[key] = (v, g)
            elif isinstance(key, tuple):   # frames t-d of node u for all t: [T, B, F]
                self.shift[key[1:]] = v
            else:
                self.vals[key], self.grads[key] = v, g
        for it, (_, g) in self.wcat.items():   # a weight read by one linear op: its grad is a row block
            off = 0
            for n, w, f in zip(it.nodes, it.weights, it.sizes):
                if w not in self.shared_weights:
                    self.grads[w] = g[off:off + f]
                off += f

        xp = backend.xp
        self.gather = {d: xp.asarray(xp.maximum(xp.arange(T) + 1 - d, 0)) for _, d in shifts}

    def refresh_shifts(self):
        """Fills the [T, B, F] buffers of values read d ≥ 2 frames back (frames before d-1 read row 0)."""
        for (u, d), buf in self.shift.items():
            array_module(buf).take(self.vals[u], self.gather[d], axis=0, out=buf)

    def bind_params(self, params: dict):
        """Parameters are used in place; a new array object invalidates recorded loops and views."""
        for n, a in params.items():
            if self.vals.get(n) is not a:
                if a.dtype != self.dtype:
                    raise RnnGraphError(f"parameter '{n}' is {a.dtype} but the workspace is {self.dtype}; "
                                        "cast parameters and inputs to one dtype")
                self.vals[n] = a
                self.version += 1
                self.memo.clear()

    # -- frame selection: arrays handed to the rules are rows [N, F] -------------------------------
    def read(self, n: str, d: int, t, grads: bool = False):
        """Node n read with delay d at frame t ([B, F]) or at all frames (ALL, [T·B, F]); params as is."""
        buf = (self.grads if grads else self.vals)[n]
        if buf.ndim != 3:
            return buf
        if t is not ALL:
            return buf[max(t + 1 - d, 0)]
        if d <= 1:
            return rows(buf[1 - d:self.T + 1 - d])
        if grads:
            raise RnnGraphError(f"internal: no gradient view of '{n}' read {d} frames back over all frames")
        return rows(self.shift[(n, d)])   # d ≥ 2: filled by refresh_shifts() after the loop

    def add(self, n: str, d: int, t, v, cols=slice(None)):
        """Adds gradient v (rows of the read) into n's gradient at the rows a delay-d read came from."""
        g = self.grads[n]
        if g.ndim != 3:
            accumulate(g, v)
        elif t is not ALL:
            g[max(t + 1 - d, 0)][:, cols] += v
        else:
            T, B = self.T, self.B
            v = v.reshape(T, B, v.shape[-1])
            if d <= 1:
                g[1 - d:T + 1 - d, :, cols] += v
            else:
                g[0:max(T + 1 - d, 0), :, cols] += v[d - 1:]
                g[0, :, cols] += v[:d - 1].sum(axis=0)


def _carve(backend, dtype, shapes, arena=False):
    """Views of the given shapes cut from one flat zeroed buffer (returned first when arena=True)."""
    sizes = [int(math.prod(s)) for s in shapes]
    flat = backend.zeros((max(sum(sizes), 1),), dtype)
    offs = list(itertools.accumulate([0] + sizes))
    views = [flat[o:o + n].reshape(s) for o, n, s in zip(offs, sizes, shapes)]
    return (flat, views) if arena else views


def rows(a):
    """[..., F] -> [N, F], a view for the buffers a workspace hands out."""
    return a.reshape(-1, a.shape[-1])
