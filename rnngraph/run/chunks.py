"""Time in chunks: an executor runs a call of T frames as consecutive chunks of at most K frames, each in
the workspace (and, in graph mode, the recorded graphs) of its own length, so one recording of K frames
serves every T, and a call records at most the graphs of its remainder's length besides.

Forward, chunk by chunk: chunk c starts from the states chunk c-1 ended in (each sequence's own last
frame: lengths are clipped to the chunk, and a sequence with no frame left in it passes its state
through), its outputs are copied into the call's output buffer, and its stored values (the workspace's
value arena) are copied aside, since the next chunk reuses the same memory. Backward, last chunk first:
the chunk's values are copied back, its backward runs with the gradient of its final states taken from
the chunk after it (the gradient of that chunk's initial states), and the parameter gradients add up.
The result equals one pass over all T frames up to the order of the parameter gradients' sums.

With recomputation (Executor's recompute: long sequences within memory) nothing is set aside but each
chunk's initial states: the backward runs each chunk's forward again, from its initial states and
inputs (the caller's arrays, referenced, not copied: they must not change before the backward), then
its backward. Memory is then one chunk's workspace plus the states at the chunks' boundaries, for one
more forward pass; the results are the same (the forward is deterministic).

Everything a call needs beyond the workspaces (outputs, input gradients, parameter gradients, the values
set aside) lives in one Arenas, which grows with the longest call and is reused by every shorter one.
"""
from __future__ import annotations

from .workspace import Arenas, carve


class Chunked:
    """The chunked forward and backward of an executor (ex._forward / ex._backward run one chunk)."""

    def __init__(self, ex, K: int):
        self.ex, self.K = ex, K
        self.bufs = Arenas(ex.backend)
        self.grad_flat = None   # [N]: the last backward's parameter gradients, carved (Executor.grad_source)
        self.last = None        # the last forward: its chunks [(t0, n, lengths [B] or None, stash offset,
                                # (params, inputs, initial states) to recompute it, or None)], stash, B

    def spans(self, T: int) -> list:
        """[(t0, n)]: chunks of K frames from frame 0, the last one holding what remains."""
        return [(t0, min(self.K, T - t0)) for t0 in range(0, T, self.K)]

    def forward(self, params: dict, inputs: dict, init: dict, lengths, recompute: bool = False, into=None):
        """As Executor.forward; outputs are views of this object's buffers (the next call reuses them), or
        the arrays `into` names. recompute: keep each chunk's initial states only, and run its forward again
        in the backward."""
        ex, be, cell = self.ex, self.ex.backend, self.ex.cell
        x0 = inputs[next(iter(cell.inputs))]
        T, B, dtype = x0.shape[0], x0.shape[1], x0.dtype
        spans = self.spans(T)
        sizes = [0] * len(spans) if recompute else \
            [ex.workspace(n, B, dtype).val_arena.size for _, n in spans[:-1]] + [0]   # the last stays in place
        stash = self.bufs.take("stash", sum(sizes), dtype)
        outs = _buffers(self.bufs, "y", dtype, {o: (T, B, cell.op(o).size) for o in cell.outputs}, into)
        ends = None if lengths is None else be.to_numpy(lengths)      # one copy to the host a call
        chunks, off = [], 0
        for (t0, n), size in zip(spans, sizes):
            whole = ends is None or ends.min() >= t0 + n          # no sequence ends before the chunk does
            part = None if whole else be.xp.clip(lengths - t0, 0, n)                 # [B]
            x = {k: v[t0:t0 + n] for k, v in inputs.items()}
            again = (params, x, init) if recompute else None
            o, finals = ex._forward(params, x, init, part)
            for name, y in o.items():
                be.copy(outs[name][t0:t0 + n], y)
            if size:
                be.copy(stash[off:off + size], ex.ws.val_arena)
            if t0 + n < T:      # the next chunk's workspace may overlap these
                init = {s: f.copy() for s, f in finals.items()}
            chunks.append((t0, n, part, off, again))
            off += size
        self.last = (chunks, stash, B)
        return outs, finals

    def backward(self, grad_outputs: dict | None, grad_finals: dict | None, into=None):
        """As Executor.backward, over the chunks of the last forward, last chunk first."""
        ex, be, cell = self.ex, self.ex.backend, self.ex.cell
        chunks, stash, B = self.last
        T, dtype = chunks[-1][0] + chunks[-1][1], stash.dtype
        gins, acc = _buffers(self.bufs, "gx", dtype, {n: (T, B, f) for n, f in cell.inputs.items()}, into), None
        for i in reversed(range(len(chunks))):
            t0, n, part, off, again = chunks[i]
            ws = ex.ws = ex.workspace(n, B, dtype)
            ex.lengths = part
            if i < len(chunks) - 1 and again:       # the last chunk's values are still in place
                ex._forward(*again, part)
            elif i < len(chunks) - 1:
                be.copy(ws.val_arena, stash[off:off + ws.val_arena.size])
            gy = {o: None if g is None else g[t0:t0 + n] for o, g in (grad_outputs or {}).items()}
            gi, g0, gp = ex._backward(gy, grad_finals)
            for name, g in gi.items():
                be.copy(gins[name][t0:t0 + n], g)
            if acc is None:
                self.grad_flat, views = carve(self.bufs, "gp", dtype, [g.shape for g in gp.values()])
                acc = dict(zip(gp, views))
                for p, g in gp.items():
                    be.copy(acc[p], g)
            else:
                for p, g in gp.items():
                    acc[p] += g
            grad_finals = {s: g.copy() for s, g in g0.items()}   # the next chunk's workspace may overlap these
        return gins, grad_finals, acc


def _buffers(bufs, kind: str, dtype, shapes: dict, into: dict | None) -> dict:
    """name -> the array a chunked call writes: the caller's (`into`), else carved from this object's buffers."""
    given = {k: v for k, v in (into or {}).items() if k in shapes and tuple(v.shape) == shapes[k]}
    rest = [k for k in shapes if k not in given]
    _, carved = carve(bufs, kind, dtype, [shapes[k] for k in rest])
    return {k: given[k] if k in given else carved[rest.index(k)] for k in shapes}
