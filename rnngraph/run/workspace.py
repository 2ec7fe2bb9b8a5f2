"""The Workspace: static buffers for one (schedule, T, B, dtype), carved from flat arenas that all of an
executor's workspaces share (Arenas: one call runs at a time; they grow, never per call).

Layout: every node's value lives in a buffer [P+T, B, F], P the cell's largest delay (1 for
PyTorch's cells); frame t is row P+t and rows 0..P-1 hold the frames before the call (a state's
initial history, written by each forward; unused for other nodes, never read from earlier frames).
A read with delay d at frame t is row P+t-d, so every delayed read, of one frame or of all T, is a
plain view. Gradients mirror values. The packed weights of merged GEMMs lie in an arena of their own, at one
place for every T and B, so that no workspace's values overwrite another's weights. Nothing is allocated after
construction, which is what lets the GPU backend record the loops into CUDA graphs.
"""
from __future__ import annotations

import itertools
import math

import numpy

from ..arrays import address
from ..errors import RnnGraphError
from ..ir.ops import OpKind, accumulate
from ..plan.aliases import GradAliases
from ..plan.backward import read_back, shared_weights
from ..plan.items import FusedGrad, Gemm, GemmGrad
from ..plan.loops import STRATEGIES, strategy_of
from ..plan.schedule import Schedule

ALL = None  # the frame selector meaning "all T frames at once"
SERIAL = itertools.count()
UNTOUCHED = ("untouched", "gradients")      # memo key: their spans in the gradient arena (Workspace.zero_grads)
PADDED = ("untouched", "padded")            # memo key: those of them a chunk walking fewer frames than it holds
                                            # zeroes past the frames walked, with their row's length
LOOP_ITEMS = frozenset(s.item for s in STRATEGIES.values())     # a loop item's kinds, by strategy
ZERO_RUNS = ("zero", "gradients")           # memo key: the runs between them and the caller's, by the caller's
                                            # (zero_grads' filled, padded), as the backend zeroes them (zero_plan)
LOOP_SUMS = ("loop", "sums")                # memo key: (group, parameter) sums a compiled loop takes (Executor._loop)


class Workspace:
    """Static buffers for one (schedule, T, B, dtype): values, packed weights and gradients carved from flat
    arenas (one fill zeroes every gradient), and memoised per-frame views."""

    def __init__(self, sched: Schedule, backend, T: int, B: int, dtype, arenas: Arenas | None = None):
        cell = sched.cell
        arenas = arenas or Arenas(backend)
        self.T, self.B, self.dtype, self.serial, self.version = T, B, dtype, next(SERIAL), 0
        self.P = max(cell.depths.values(), default=1)       # history rows before frame 0
        self.vals, self.grads, self.cat, self.wcat, self.memo = {}, {}, {}, {}, {}
        self.running = None     # a chunk's: (its call's cursor, where the chunks' rows start in it), set by Chunked
        self.shared_weights = shared_weights(cell)
        self.aliases = shared_grads(sched, backend)
        home, windows = self.aliases.home, self.aliases.windows
        blocks, wblocks, pblocks = _blocks(sched, self.P + T, B)
        self.val_arena, vals = carve(arenas, "values", dtype, [s for s, _ in blocks])
        _, wvals = carve(arenas, "weights", dtype, [s for s, _ in wblocks])     # the same for every T and B
        kept, base = read_back(cell), address(self.val_arena)
        self.stash_size = max(((address(v) - base) // v.itemsize + v.size for (_, key), v in zip(blocks, vals)
                               if _read_back(key, kept)), default=0)    # what a chunk sets aside: the leading blocks
        owned = owned_blocks(blocks, self.aliases)
        # the weights' gradients first: at the same offsets whatever T and B (Executor.grad_source)
        self.grad_arena, grads = carve(arenas, "grads", dtype, [s for s, _ in wblocks + pblocks + owned])
        frame_grads = dict(zip((key for _, key in owned), grads[len(wblocks) + len(pblocks):]))
        self.generation = arenas.generation
        for (_, key), v in zip(blocks, vals):
            if isinstance(key, Gemm):
                primary, start = windows.get(key, (key, 0))     # a window: columns of another's gradient
                g = frame_grads[primary][..., start:start + sum(key.sizes)]
                self.cat[key] = (v, g)
                off = 0
                for n, f in zip(key.nodes, key.sizes):
                    self.vals[n], self.grads[n] = v[..., off:off + f], g[..., off:off + f]
                    off += f
            else:
                self.vals[key] = v
                self.grads[key] = frame_grads.get(key)
        for n, h in home.items():
            self.grads[n] = self.grads[h]
        for (_, key), v, g in zip(wblocks + pblocks, wvals + [None] * len(pblocks), grads):
            if isinstance(key, Gemm):
                self.wcat[key] = (v, g)
            else:
                self.vals[key], self.grads[key] = v, g
        for it, (_, g) in self.wcat.items():   # a weight read by one linear op: its grad is a row block
            off = 0
            for n, w, f in zip(it.nodes, it.weights, it.sizes):
                if w not in self.shared_weights:
                    self.grads[w] = g[off:off + f].reshape(cell.params[w])     # head-wise: [k, f/k, K/k]
                off += f

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

    def zero_grads(self, backend, filled: frozenset = frozenset(), walked: int | None = None):
        """Zeroes the gradient arena for a backward, but for the gradients no item of this workspace's backward
        reads or adds to before one stores them whole, or at all (note_untouched: known once one has run), and
        the frames of the gradients in `filled` (the caller's output gradients, copied in whole next): the runs
        between those, as the backend zeroes them (zero_plan, made once per `filled` and whether walked is given).
        walked: a padded chunk's n frames, fewer than the workspace holds, where a loop walks only them: of what
        it stores whole (PADDED) it then writes only the rows before n, so the rest is zeroed too."""
        plans, padded = self.memo.setdefault(ZERO_RUNS, {}), walked is not None
        if (filled, padded) not in plans:
            skip = list(self.memo.get(UNTOUCHED, ()))
            skip += [self._span(f) for f in (self.framed(o, grads=True) for o in filled) if f.flags.c_contiguous]
            runs, start = [], 0
            for a, b in sorted(skip):
                if a > start:
                    runs.append((start, a, 0))
                start = max(start, b)
            if start < self.grad_arena.size:
                runs.append((start, self.grad_arena.size, 0))
            tails = self.memo.get(PADDED, ()) if padded else ()
            plans[filled, padded] = backend.zero_plan(self.grad_arena, sorted(runs + list(tails)))
        backend.zero_runs(self.grad_arena, plans[filled, padded], walked or 0)

    def note_untouched(self, sched: Schedule, backend):
        """After a backward: [start, end) in the gradient arena of each gradient whose buffer needs no zeroing,
        the members a compiled fused backward keeps to itself or stores whole, and the gradients a compiled loop
        writes whole (backend.untouched_grads, loop_stores; compiled: the memo holds a launch for the step or its
        loop at ALL, or for the step at every frame),
        contiguous ones that are none of the cell's outputs, states and parameters, nor an input but one whose
        gradient one write makes whole, and a merged GEMM's whole output gradient where every column is such;
        sorted, once; and of those, the ones a loop walking fewer frames than the workspace holds writes only in
        part (PADDED, a chunk's: its kernel walks only the chunk's n frames, backend.walking_loops, and still stores
        whole the rows before n of a [P + T, B, F] buffer, since frame t writes rows P + t - d, delays d ≤ P, and
        so none before row t) as (start, end, a row's elements), a row of 0 where a span is no such buffer."""
        if UNTOUCHED in self.memo:
            return
        compiled = []       # (step, its loop or None); the GEMMs' gradients too, which every backend runs as planned
        stored = {}         # compiled loop -> what it writes whole (backend.loop_stores)
        walking = set()     # compiled loops of a chunk's workspace that walk only the chunk's frames
        for it in (it for sec in sched.backward for it in sec.items):
            launch = self.memo.get((it, ALL), (None, None))[1]
            if launch and isinstance(it, FusedGrad) or isinstance(it, GemmGrad):
                compiled.append((it, None))
            elif type(it) in LOOP_ITEMS:     # a loop: its GEMMs' gradients, and every item where it is compiled
                steps = [s for st in getattr(it, "stages", ()) for s in st.items]
                compiled += [(s, None) for s in steps if isinstance(s, GemmGrad)]
                if launch:
                    compiled += [(s, it) for s in steps if isinstance(s, FusedGrad)]
                    stored[it] = backend.loop_stores(sched.cell, it)
                    if self.running and strategy_of(it).name in backend.walking_loops:
                        walking.add(it)
                else:           # run frame by frame: where each frame's is compiled, as if hoisted
                    compiled += [(s, None) for s in steps if isinstance(s, FusedGrad) and
                                 all(self.memo.get((s, t), (None, None))[1] for t in range(self.T))]
        still = frozenset().union(*(g for it, g in stored.items() if it not in walking))     # in a padded chunk
        self.memo[UNTOUCHED] = self._spans(sched, backend, compiled, frozenset().union(*stored.values()), ())
        kept = set(self._spans(sched, backend, compiled, still, walking)) if walking else set(self.memo[UNTOUCHED])
        rows = {self._span(g): g[0].size for g in [*self.grads.values(), *(g for _, g in self.cat.values())]
                if g.ndim == 3 and len(g) == self.P + self.T and g.flags.c_contiguous}
        self.memo[PADDED] = [(a, b, rows.get((a, b), 0)) for a, b in self.memo[UNTOUCHED] if (a, b) not in kept]
        self.memo.pop(ZERO_RUNS, None)

    def _spans(self, sched: Schedule, backend, compiled: list, stored: frozenset, partial) -> list:
        """note_untouched's spans, the loops of `partial` storing nothing whole."""
        cell = sched.cell
        kept = {*cell.inputs, *cell.outputs, *cell.params, *(p for p, _ in cell.states.values())} - \
            self.aliases.assigned       # an input's gradient that one GEMM makes whole
        free = backend.untouched_grads(cell, compiled, self.aliases, stored, frozenset(partial)) - kept
        bufs = [self.grads[n] for n in free] + [g for it, (_, g) in self.cat.items()
                                               if it not in self.aliases.windows and set(it.nodes) <= free]
        return sorted({self._span(g) for g in bufs if g.flags.c_contiguous})

    def _span(self, g) -> tuple:
        """[start, end) of gradient buffer g (contiguous) in the gradient arena, in elements."""
        start = (address(g) - address(self.grad_arena)) // self.grad_arena.itemsize
        return start, start + g.size

    # -- frame selection: arrays handed to the rules are rows [N, F] -------------------------------
    def frames(self, buf, d: int = 0):
        """buf [P+T, B, F] read with delay d at every frame: its rows P-d .. P-d+T-1, [T, B, F]."""
        return buf[self.P - d:self.P - d + self.T]

    def framed(self, n: str, grads: bool = False):
        """frames() of node n's value (or gradient) buffer, [T, B, F], made once: a whole call's inputs and outputs
        (a view costs a cupy call some µs of host time, every call)."""
        key = ("framed", n, grads)
        v = self.memo.get(key)
        if v is None:
            v = self.memo[key] = self.frames((self.grads if grads else self.vals)[n])
        return v

    def at(self, buf, t, d: int = 0):
        """buf [P+T, B, F] (a node's, or a merged GEMM's output) read with delay d at frame t ([B, F]) or
        at all frames (ALL, [T·B, F])."""
        return buf[self.P + t - d] if t is not ALL else rows(self.frames(buf, d))

    def read(self, n: str, d: int, t, grads: bool = False):
        """Node n read with delay d at frame t ([B, F]) or at all frames (ALL, [T·B, F]); params as is."""
        buf = (self.grads if grads else self.vals)[n]
        return buf if buf.ndim != 3 else self.at(buf, t, d)

    def add(self, n: str, d: int, t, v, cols=slice(None)):
        """Adds gradient v (rows of the read) into n's gradient at the rows a delay-d read came from."""
        g = self.grads[n]
        if g.ndim != 3:
            accumulate(g, v)
        elif t is not ALL:
            g[self.P + t - d][:, cols] += v
        else:
            self.frames(g, d)[:, :, cols] += v.reshape(self.T, self.B, v.shape[-1])


def write_history(be, h, a):
    """A state's rows before frame 0, h [P, B, S], from its initial value a: None (zeros), [B, S] (every
    earlier frame holds it) or [D, B, S] (the last D frames, oldest first; older frames hold the oldest)."""
    P = h.shape[0]
    if a is None:
        h.fill(0)
    elif a.ndim == 3:
        h[:P - len(a)] = a[0]
        be.copy(h[P - len(a):], a)
    elif P == 1:
        be.copy(h[0], a)
    else:
        h[...] = a


def _blocks(sched: Schedule, rows: int, B: int) -> tuple:
    """(shape, key) of every buffer a workspace carves: frame buffers [rows, B, F] (a merged GEMM's output,
    every other node's value), those of the values a backward reads first (read_back: all a chunk sets aside
    lies in one leading span), the merged weights [ΣF, K] ([ΣF, K/heads] head-wise) and the parameters."""
    cell = sched.cell
    gemms = [it for it in sched.items if isinstance(it, Gemm)]
    blocks = [((rows, B, sum(it.sizes)), it) for it in gemms]
    blocks += [((rows, B, cell.op(n).size), n) for n in cell.graph
               if cell.op(n).kind is not OpKind.PARAM and n not in {m for it in gemms for m in it.nodes}]
    kept = read_back(cell)
    blocks.sort(key=lambda b: not _read_back(b[1], kept))      # stable: the plan's order within each part
    wblocks = [((sum(it.sizes), cell.op(it.operand).size // it.heads), it) for it in gemms]     # [ΣF, K/heads]
    return blocks, wblocks, [(cell.params[p], p) for p in cell.params]


def _read_back(key, kept: set) -> bool:
    """Whether a backward reads the value block of `key` (a node, or a merged GEMM: any of its nodes)."""
    return any(n in kept for n in key.nodes) if isinstance(key, Gemm) else key in kept


def shared_grads(sched: Schedule, backend) -> GradAliases:
    """The classes of equal gradients a backend's workspaces keep in one buffer (plan/aliases.py): none unless
    it shares them (alias_grads); where it does not, only the equal parameter sums (twins) if it copies them."""
    if backend.alias_grads:
        return sched.grad_aliases
    return GradAliases(twins=sched.grad_aliases.twins) if backend.twin_sums else GradAliases()


def owned_blocks(blocks, aliases) -> list:
    """The frame blocks (_blocks) that carve a gradient buffer of their own: all but a class member's whose
    class another node's buffer holds, and a merged GEMM's whose output gradient is another's columns."""
    return [(s, key) for s, key in blocks if key not in aliases.windows and aliases.home.get(key, key) == key]


def stored_bytes(sched: Schedule, T: int, B: int, dtype, aliases: GradAliases = GradAliases()) -> int:
    """The bytes a workspace of (T, B) holds for a call and its backward: every value and its gradient, each
    class of equal gradients once where the backend shares them (aliases: shared_grads)."""
    P = max(sched.cell.depths.values(), default=1)
    blocks, wblocks, pblocks = _blocks(sched, P + T, B)
    values = sum(math.prod(s) for s, _ in blocks + wblocks)
    grads = sum(math.prod(s) for s, _ in owned_blocks(blocks, aliases) + wblocks + pblocks)
    return (values + grads) * numpy.dtype(dtype).itemsize


class Arenas:
    """The flat buffers an executor's workspaces are carved from, one per (kind, dtype), shared by all of
    them (one call runs at a time) and grown, never per call: a request beyond the capacity allocates what it
    needs and at least a quarter more than before (a run whose longest call creeps up grows them a few times,
    not at every call) and bumps `generation`, which retires every workspace carved before (and so its
    recordings). `nbytes` is what they hold."""

    def __init__(self, backend):
        self.backend, self.bufs, self.generation = backend, {}, 0

    def take(self, kind: str, n: int, dtype):
        """The first n elements of the buffer for (kind, dtype), [n]; zeros only when newly allocated."""
        key = (kind, str(dtype))
        buf = self.bufs.get(key)
        if buf is None or buf.size < n:
            grown = 0 if buf is None else buf.size + buf.size // 4
            self.bufs[key] = buf = self.backend.zeros((max(n, grown, 1),), dtype)
            self.generation += 1
        return buf[:n]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.bufs.values())


PAGE, LINE = 4096, 64     # bytes


def carve(arenas: Arenas, kind: str, dtype, shapes):
    """(flat [Σ sizes and gaps], views of the given shapes cut from it), the flat part taken from `arenas`."""
    sizes, (starts, end) = [int(math.prod(s)) for s in shapes], layout(shapes, dtype)
    flat = arenas.take(kind, end, dtype)
    return flat, [flat[o:o + n].reshape(s) for o, n, s in zip(starts, sizes, shapes)]


def layout(shapes, dtype) -> tuple:
    """(the blocks' starts, the end), in elements, of buffers of these shapes carved one after another: block
    k starts k mod 64 cache lines past a 4 KiB boundary, so a frame's rows of different buffers map to
    different cache sets (at one offset mod 4 KiB, a pass over many buffers evicts its own lines)."""
    item = numpy_itemsize(dtype)
    starts, end = [], 0
    for k, s in enumerate(shapes):
        start = -(-end * item // PAGE) * PAGE // item + (k % (PAGE // LINE)) * LINE // item
        starts.append(start)
        end = start + int(math.prod(s))
    return starts, end


def stash_size(sched: Schedule, T: int, B: int, dtype) -> int:
    """The elements of a (T, B) workspace's value arena that a chunk sets aside for its backward: its leading
    blocks, the values a backward reads (_blocks), with the gaps between them (Workspace.stash_size)."""
    blocks, _, _ = _blocks(sched, max(sched.cell.depths.values(), default=1) + T, B)
    kept = read_back(sched.cell)
    k = sum(_read_back(key, kept) for _, key in blocks)
    starts, _ = layout([s for s, _ in blocks], dtype)
    return starts[k - 1] + math.prod(blocks[k - 1][0]) if k else 0


def numpy_itemsize(dtype) -> int:
    """Bytes per element of a dtype given as a numpy dtype, a type or a name (bfloat16 via ml_dtypes)."""
    import numpy
    return numpy.dtype(dtype).itemsize


def rows(a):
    """[..., F] -> [N, F], a view for the buffers a workspace hands out."""
    return a.reshape(-1, a.shape[-1])
