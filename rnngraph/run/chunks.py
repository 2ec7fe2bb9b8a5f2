"""Time in chunks, each chunk reading its place in the call from the device: an executor runs a call of T
frames as consecutive chunks, each in the workspace (and, in graph mode, the recording) of its length L, and
every chunk reads where it lies in its call from the call's cursor, one small int64 array on the device
written once a call. One recording of L frames therefore serves every chunk of that length of every call,
whatever T, and a chunk costs the host one replay.

The chunks of a call and the ladder of chunk lengths are planned in run/chunk_plan.py.

The cursor (run/cursor.py) holds, for the chunk running, its first frame t0 and frame count n, the sequences'
lengths, the addresses and strides of the caller's arrays the call reads and writes (its slots) and where
each chunk's values are set aside.

A chunk's forward: its states' history from carry slot c (the call's initial states for c = 0), its inputs
at t0 (zeros past n), the forward body, its outputs written at t0, the values its backward reads set aside in
the stash (every chunk but the last, unless the backward recomputes: the next chunk reuses the memory), each
sequence's state at its own last frame of the chunk into carry slot c + 1, c advanced. Its backward, last
chunk first: its gradient arena zeroed before the replay, but for the gradients its kernels write whole before
any reads them (Workspace.zero_grads: in a padded chunk, a loop walking only its n frames writes whole only
the rows before n of those it stores), its values from the stash (or its forward run again from carry slot c),
the gradients of its outputs at t0 and of its final states (carried from the chunk after it, added at each
sequence's own last frame), the backward body, its input gradients written at t0, its parameter gradients
added up, the gradient of its history carried to the chunk before, c moved back. The results equal one pass
over all T frames up to the order of the parameter gradients' sums. A backward runs once a forward: restoring
or recomputing each chunk's values over the others', it spends them.

The boundary operations (OPS: name -> reference) are kernels where the backend compiles them
(compile_chunk: run/backends/cuda/chunks.py); their buffers (cursor, carries, stash, summed gradients) live in
the executor's arenas, at addresses that stay put while no call is longer than the longest so far.
"""
from __future__ import annotations

import math

import numpy as np

from ..arrays import address, array_module
from ..errors import RnnGraphError
from .cursor import HEAD, Cursor
from .chunk_plan import most_aside, most_chunks, spans
from .workspace import Arenas, stash_size, write_history

# -- the boundary operations' references: (cursor, arrays...) ------------------------------------------------
def _frames_in(cur, dst, k):
    """dst [L, B, F] (a workspace's frames) = slot k's frames t0 .. t0 + n - 1, zeros after them (all zeros
    where the slot is empty)."""
    _, t0, n, _, _ = cur.where()
    src = cur.arrays[k]
    n = 0 if src is None else n         # no gradient given: zeros
    if n:
        dst[:n] = src[t0:t0 + n]
    dst[n:] = 0


def _frames_out(cur, src, k):
    """slot k's frames t0 .. t0 + n - 1 = src [L, B, F]'s first n."""
    _, t0, n, _, _ = cur.where()
    if cur.arrays[k] is not None:      # None: a forward run again writes no outputs
        cur.arrays[k][t0:t0 + n] = src[:n]


def _stash(cur, arena, stash, save):
    """arena [size] to (save) or from the stash at the chunk's offset, where it has one."""
    _, _, _, off, _ = cur.where()
    if off >= 0 and save:
        stash[off:off + arena.size] = arena
    elif off >= 0:
        arena[...] = stash[off:off + arena.size]


def _history_in(cur, h, carry):
    """h [P, B, S] (a state's rows before frame 0) = carry slot c [P, B, S] of carry [N + 1, P, B, S]."""
    h[...] = carry[cur.where()[0]]


def _last_rows(cur, P: int, xp):
    """[P, B] rows part_b .. part_b + P - 1 of a [P + L, B, S] buffer: each sequence's last P frames of the
    chunk (its history rows where it has no frame in it), and the batch index [B]."""
    rows = cur.parts(xp)[None, :] + xp.arange(P)[:, None]
    return rows, xp.arange(cur.B)


def _history_out(cur, v, carry):
    """carry slot c + 1 [P, B, S] = each sequence's last P rows of v [P + L, B, S] in the chunk."""
    carry[cur.where()[0] + 1] = v[_last_rows(cur, carry.shape[1], array_module(v))]


def _grads_in(cur, g, gcarry):
    """g [P + L, B, S] += gcarry [P, B, S] at each sequence's last P rows of the chunk."""
    g[_last_rows(cur, gcarry.shape[0], array_module(g))] += gcarry


def _accumulate(cur, acc, g):
    """acc [n] = g [n] for the backward's first chunk (the last one), else acc + g."""
    c, _, _, _, N = cur.where()
    if c == N - 1:
        acc[...] = g
    else:
        acc += g


def _advance(cur, forward):
    """c += step (a forward) or c -= 1 (a backward)."""
    cur.dev[0] += cur.dev[1] if forward else -1


OPS = {"frames_in": _frames_in, "frames_out": _frames_out, "stash": _stash, "history_in": _history_in,
       "history_out": _history_out, "grads_in": _grads_in, "accumulate": _accumulate, "advance": _advance}


class Chunked:
    """The chunked forward and backward of an executor (its _forward_body and _run_sections run a chunk's
    bodies); K the last call's chunk length, grad_flat [N] its summed parameter gradients (grad_source)."""

    def __init__(self, ex):
        self.ex, self.K = ex, None
        self.bufs = Arenas(ex.backend)  # outputs and input gradients where the caller gives none: read through
        self.grad_flat = None           # the cursor's slots, never recorded, so they may move freely
        self.grads: dict = {}           # parameter name -> its summed gradient, a view of grad_flat's buffer
        self.cur = self.last = None     # the last forward: (its chunks, workspaces by length, recompute, params)
        self.stash_sizes: dict = {}     # (L, B, dtype) -> stash_size, worked out once a shape
        self.carved = None              # the last _carve: (its key, workspaces, stash offsets)

    @property
    def slots(self) -> tuple:
        """(first input slot, first output slot, first output-gradient slot, first input-gradient slot)."""
        i, o = len(self.ex.cell.inputs), len(self.ex.cell.outputs)
        return 0, i, i + o, i + 2 * o

    def forward(self, params: dict, inputs: dict, init: dict, lengths, K: int, in_ladder: bool = False,
                walks: bool = False, recompute: bool = False, into=None):
        """As Executor.forward, in the chunks spans(T, K, in_ladder, walks) says; recompute: set no values aside and
        run each chunk's forward again in the backward (the inputs are then read again: keep them unchanged).
        Outputs are `into`'s arrays (name -> [T, B, F]) where given, else this object's (the next call reuses)."""
        ex, be, cell = self.ex, self.ex.backend, self.ex.cell
        x0 = inputs[next(iter(cell.inputs))]
        T, B, dtype = x0.shape[0], x0.shape[1], x0.dtype
        self.K, chunks = K, spans(T, K, in_ladder, walks)
        ws, offsets = self._carve(T, B, dtype, chunks, recompute, in_ladder, walks)
        i0, o0, _, _ = self.slots
        for k, x in enumerate(inputs.values()):
            self.cur.arrays[i0 + k] = _unit_columns(be, x)
        outs = {}
        for k, o in enumerate(cell.outputs):
            a = (into or {}).get(o)
            if a is None or tuple(a.shape) != (T, B, cell.op(o).size) or a.strides[2] != a.itemsize:
                a = self.bufs.take(f"y {o}", T * B * cell.op(o).size, dtype).reshape(T, B, -1)
            self.cur.arrays[o0 + k] = outs[o] = a
        self.cur.write(be, T, chunks, offsets, lengths)
        for s, (p, _) in cell.states.items():
            write_history(be, self.carry[s][0], init.get(s))
        for _, L, _ in chunks:
            w = ex.ws = ws[L]
            w.bind_params({n: params[n] for n in cell.params})
            ex._run_body("chunk fwd", w, self._forward_body)
        self.last = (chunks, ws, recompute)
        N, P = len(chunks), ws[chunks[0][1]].P
        return outs, {s: self.carry[s][N, P - 1] if D == 1 else self.carry[s][N, P - D:]
                      for s, D in cell.depths.items()}

    def backward(self, grad_outputs: dict | None, grad_finals: dict | None, into=None):
        """As Executor.backward, over the chunks of the last forward, last chunk first; once a forward."""
        ex, be, cell, cur = self.ex, self.ex.backend, self.ex.cell, self.cur
        if self.last is None:
            raise RnnGraphError("backward() runs once after a call in chunks: the chunks' stored values share one "
                                "buffer and are spent by it; run forward() again for another backward")
        chunks, ws, recompute = self.last
        (T, B), dtype, N = (chunks[-1][0] + chunks[-1][2], cur.B), self.acc.dtype, len(chunks)
        _, o0, go, gi = self.slots
        for k, o in enumerate(cell.outputs):
            g = (grad_outputs or {}).get(o)
            cur.arrays[o0 + k] = None                    # a forward run again writes no outputs
            cur.arrays[go + k] = None if g is None else _unit_columns(be, g)    # None: zeros
        gins = {}
        for k, (n, F) in enumerate(cell.inputs.items()):
            a = (into or {}).get(n)
            if a is None or tuple(a.shape) != (T, B, F) or a.strides[2] != a.itemsize:
                a = self.bufs.take(f"gx {n}", T * B * F, dtype).reshape(T, B, F)
            cur.arrays[gi + k] = gins[n] = a
        cur.rewind(be, N, o0)
        P = ws[chunks[0][1]].P
        for s in cell.states:
            g, gc = (grad_finals or {}).get(s), self.gcarry[s]
            gc.fill(0)
            if g is not None:        # [B, F]: the last frame's; [D, B, F]: each of the last D frames'
                be.copy(gc[P - 1] if g.ndim == 2 else gc[P - len(g):], g)
        filled = frozenset(cell.outputs)        # their frames' gradients are the chunk's first writes (frames_in)
        for i in reversed(range(N)):
            _, L, n = chunks[i]
            w = ex.ws = ws[L]
            if recompute and i < N - 1:         # the last chunk's values are still in place
                ex._run_body("chunk fwd", w, self._forward_body)
            w.zero_grads(be, filled, n if n < L else None)
            ex._run_body("chunk bwd", w, self._backward_body)
            w.note_untouched(ex.sched, be)
        self.grad_flat = self.acc
        cur.arrays[:] = [None] * cur.slots      # the caller's arrays are not held past the call
        self.last = None                        # and its stored values are spent: the chunks' memory is shared
        return gins, {s: self.gcarry[s][P - 1] if D == 1 else self.gcarry[s][P - D:]
                      for s, D in cell.depths.items()}, dict(self.grads)

    def _carve(self, T: int, B: int, dtype, chunks: list, recompute: bool, in_ladder: bool, walks: bool) -> tuple:
        """(workspace by chunk length, stash offset by chunk), the buffers the recordings read carved from the
        executor's arenas: were one to grow, every workspace carved before is retired, so carve until none does.
        The cursor, the carried states and the stash have room for any call of at most T frames (most_chunks,
        most_aside), so that no call after the longest one grows a buffer. A call like the last one (its chunks,
        B, dtype, recompute) in the same workspaces finds them carved already."""
        ex, cell = self.ex, self.ex.cell
        N, take, K = len(chunks), ex.arenas.take, self.K
        key = (tuple(chunks), K, in_ladder, walks, B, dtype, recompute, ex.arenas.generation)
        ws = {L: ex.workspace(L, B, dtype, chunk=True) for L in sorted({L for _, L, _ in chunks})}
        if self.carved and self.carved[0] == key and all(a is b for a, b in zip(ws.values(), self.carved[1].values())):
            return self.carved[1], self.carved[2]
        room = most_chunks(T, K, in_ladder)
        aside = 0 if recompute else most_aside(T, K, in_ladder, walks, lambda L: self._stash_size(L, B, dtype))
        while True:
            generation = ex.arenas.generation
            ws = {L: ex.workspace(L, B, dtype, chunk=True) for L in sorted({L for _, L, _ in chunks})}
            sizes = [0 if recompute or i == N - 1 else ws[L].stash_size for i, (_, L, _) in enumerate(chunks)]
            offsets = [int(o) if s else -1 for o, s in zip(np.cumsum([0] + sizes[:-1]), sizes)]
            w = next(iter(ws.values()))
            P, slots = w.P, 2 * (len(cell.inputs) + len(cell.outputs))
            self.cur = Cursor(take("chunk cursor", HEAD + B + 3 * slots + 3 * room, np.int64), B, slots)
            for w in ws.values():       # the loops walking time read the running chunk's frame count n there
                w.running = (self.cur.dev, self.cur.table())
            self.stash = take("chunk stash", max(sum(sizes), aside), dtype)
            self.carry = {s: take(f"chunk carry {s}", (room + 1) * P * B * S, dtype).reshape(room + 1, P, B, S)
                          for s, (_, S) in cell.states.items()}
            self.gcarry = {s: take(f"chunk gcarry {s}", P * B * S, dtype).reshape(P, B, S)
                           for s, (_, S) in cell.states.items()}
            base = address(w.grad_arena)    # the parameters' gradients lead every workspace's arena, at one offset each
            grad_at = {n: ((address(w.grads[n]) - base) // w.grad_arena.itemsize, w.grads[n].shape)
                       for n in cell.params}
            self.acc = take("chunk grads", max((o + math.prod(sh) for o, sh in grad_at.values()), default=0), dtype)
            self.grads = {n: self.acc[o:o + math.prod(sh)].reshape(sh) for n, (o, sh) in grad_at.items()}
            if ex.arenas.generation == generation:
                self.carved = (key[:-1] + (generation,), ws, offsets)
                return ws, offsets

    def _stash_size(self, L: int, B: int, dtype) -> int:
        key = (L, B, str(dtype))
        if key not in self.stash_sizes:
            self.stash_sizes[key] = stash_size(self.ex.sched, L, B, dtype)
        return self.stash_sizes[key]

    def _op(self, ws, key: tuple, *args):
        """The boundary operation key[0] (OPS) on args: the backend's kernels, compiled once per workspace and
        key, else the reference."""
        memo = ("chunk",) + key
        if memo not in ws.memo:
            ws.memo[memo] = self.ex.backend.compile_chunk(key[0], self.cur, args)
        if ws.memo[memo]:
            self.ex.backend.launch(ws.memo[memo])
        else:
            OPS[key[0]](self.cur, *args)

    def _forward_body(self, ws, run_loop):
        ex, cell = self.ex, self.ex.cell
        i0, o0, _, _ = self.slots
        for s, (p, _) in cell.states.items():
            self._op(ws, ("history_in", s), ws.vals[p][:ws.P], self.carry[s])
        for k, n in enumerate(cell.inputs):
            self._op(ws, ("frames_in", n), ws.frames(ws.vals[n]), i0 + k)
        ex._forward_body(ws, run_loop)
        for k, o in enumerate(cell.outputs):
            self._op(ws, ("frames_out", o), ws.frames(ws.vals[o]), o0 + k)
        self._op(ws, ("stash", "save"), ws.val_arena[:ws.stash_size], self.stash, True)
        for s, (p, _) in cell.states.items():
            self._op(ws, ("history_out", s), ws.vals[p], self.carry[s])
        self._op(ws, ("advance", "forward"), True)

    def _backward_body(self, ws, run_loop):
        ex, cell = self.ex, self.ex.cell
        _, _, go, gi = self.slots
        self._op(ws, ("stash", "load"), ws.val_arena[:ws.stash_size], self.stash, False)
        for k, o in enumerate(cell.outputs):
            self._op(ws, ("frames_in", "grad", o), ws.frames(ws.grads[o]), go + k)
        for s, (p, _) in cell.states.items():
            self._op(ws, ("grads_in", s), ws.grads[p], self.gcarry[s])
        ex._run_sections(ex.backward_sections, ws, run_loop)
        for k, n in enumerate(cell.inputs):
            self._op(ws, ("frames_out", "grad", n), ws.frames(ws.grads[n]), gi + k)
        self._op(ws, ("accumulate",), self.acc, ws.grad_arena[:self.acc.size])
        for s, (p, _) in cell.states.items():
            ex.backend.copy(self.gcarry[s], ws.grads[p][:ws.P])
        self._op(ws, ("advance", "backward"), False)


def _unit_columns(be, a):
    """a [T, B, F] as the kernels address it: unit feature stride (a copy where it has another)."""
    return a if a.strides[2] == a.itemsize else be.xp.ascontiguousarray(a)
