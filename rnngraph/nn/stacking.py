"""How a recurrent layer runs: one Executor per (layer, direction), length-aware time reversal,
padding masks and dropout between layers, forward and backward of the whole stack.

Everything here is time-major: x [T, B, D], y [T, B, dirs·F], states [L·dirs, B, S], with slice
k = l·dirs + d holding layer l, direction d (0 forward, 1 reverse), as PyTorch orders h_n. A state
the cell reads D ≥ 2 frames back carries its last D frames: [D, L·dirs, B, S], oldest first.
"""
from __future__ import annotations

import functools

import numpy as np

from ..arrays import dropout_mask
from ..run.executor import Executor


class Frames:
    """Which frames of a [T, B] batch are real (t < lengths[b]) and the per-sequence time reversal.

    The reversal index is an involution: rev[t, b] = lengths[b]-1-t for real frames and t for padded
    ones, so the same gather reverses a sequence and puts it back, and padded frames stay at the end.
    """

    def __init__(self, xp, T: int, B: int, lengths=None, masked: bool = True):
        """masked: False where the only sequences shorter than T are those a call is padded with (buckets.Padding),
        whose inputs and gradients are zeros and whose outputs are dropped, and which never feed a real sequence:
        masking them would copy every input, output and gradient for nothing (mask() returns its array)."""
        self.xp, self.T, self.B = xp, T, B
        self.lengths = lengths          # host ints [B], or None when every sequence has T frames
        self.lengths_dev = self.padded = None
        if lengths is not None:
            t, n = np.arange(T)[:, None], lengths[None, :]
            self.padded = xp.asarray((t >= n)[..., None]) if masked else None      # [T, B, 1]
            self.lengths_dev = xp.asarray(lengths)

    @functools.cached_property
    def _reversal(self) -> tuple:
        """(rev [T, B], the batch index [1, B]) of reverse(), made at its first use: a layer of one direction
        never reverses."""
        t, n = np.arange(self.T)[:, None], self.lengths[None, :]
        return self.xp.asarray(np.where(t < n, n - 1 - t, t)), self.xp.arange(self.B)[None, :]

    def reverse(self, a):
        """a [T, B, F] with each sequence's real frames in reverse order (a view when no lengths)."""
        return a[::-1] if self.lengths is None else a[self._reversal]

    def mask(self, a):
        """a [T, B, F] with padded frames set to zero (NaN-safe; `a` itself when no lengths or none masked)."""
        if self.padded is None:
            return a
        out = a.copy()          # not where(valid, a, 0): with some numpy and ml_dtypes versions it widens bfloat16
        self.xp.copyto(out, self.xp.zeros((), a.dtype), where=self.padded)
        return out


class Direction:
    """One (layer, direction): a cell and its own Executor, so its workspace is never shared."""

    def __init__(self, cell, backend, reverse: bool, loop: str = "auto", recompute: bool | None = None):
        self.cell, self.reverse = cell, reverse
        self.ex = Executor(cell, backend, loop=loop, recompute=recompute)
        self.x_name, self.y_name = next(iter(cell.inputs)), cell.outputs[0]
        self.in_size = cell.inputs[self.x_name]
        self.out_size = cell.op(self.y_name).size

    def forward(self, params: dict, x, init: dict, frames: Frames, out, ladder: bool = False):
        """x: [T, B, D] in time order; init: state -> [B, S] or None. Writes y [T, B, F] into `out`
        and returns state -> final [B, S], views into the workspace: consume them before the next call.
        ladder: the executor's (calls of many lengths)."""
        if self.reverse:
            x = frames.reverse(x)
        into = None if self.reverse else {self.y_name: out}     # a call in chunks writes y there itself
        outs, finals = self.ex.forward(params, {self.x_name: x}, init, frames.lengths_dev, into, ladder)
        y = outs[self.y_name]
        if y is not out:
            self.ex.backend.copy(out, frames.reverse(y) if self.reverse else y)
        return finals

    def backward(self, gy, gfinals: dict, frames: Frames, gx_out=None):
        """gy: [T, B, F] in time order. Returns (gx [T, B, D], state -> g0 [B, S], cell param -> grad);
        all three are views into the workspace: consume them before the next call; gx_out [T, B, D]: where
        a call in chunks (forward direction) writes gx instead (then gx is gx_out)."""
        if self.reverse:
            gy = frames.reverse(gy)
        into = None if self.reverse or gx_out is None else {self.x_name: gx_out}
        gi, g0, gp = self.ex.backward({self.y_name: gy}, gfinals, into)
        gx = gi[self.x_name]
        return (frames.reverse(gx) if self.reverse else gx), g0, gp


class Stack:
    """num_layers × num_directions Directions, with dropout between layers (not after the last)."""

    def __init__(self, cells: list, backend, num_directions: int, loop: str = "auto", recompute: bool | None = None):
        self.backend, self.nd = backend, num_directions
        self.runs = [[Direction(c, backend, d == 1, loop, recompute) for d in range(num_directions)] for c in cells]
        self.states = dict(cells[0].states)     # name -> (producer, features); the same in every layer
        self.depths = cells[0].depths           # name -> frames carried (1: PyTorch's [L·dirs, B, S])
        self.masks: list = []

    def grad_sources(self) -> list:
        """Per (layer, direction), in parameters() order: Executor.grad_source of its last backward."""
        return [run.ex.grad_source for layer in self.runs for run in layer]

    def batch_rows(self, B: int, dtype) -> int:
        """The rows a call of B sequences of dtype runs as: the most any layer's executor runs them as."""
        return max(run.ex.batch_rows(B, dtype) for layer in self.runs for run in layer)

    def shape(self, s: str, B: int) -> tuple:
        """The shape of state s: [L·dirs, B, S], or [D, L·dirs, B, S] when the cell reads D ≥ 2 frames back."""
        D, K = self.depths[s], len(self.runs) * self.nd
        return (K, B, self.states[s][1]) if D == 1 else (D, K, B, self.states[s][1])

    def forward(self, params, x, init: dict, frames: Frames, dropout: float, rng, window=None, ladder: bool = False):
        """params[l][d]: cell param -> array; x: [T, B, D]; init: state -> [L·dirs, B, S] (every
        earlier frame), [D, L·dirs, B, S] (the last D frames) or None; window: dropout_mask's; ladder: run in
        the executors' ladder of chunks (calls of many lengths). Returns (y [T, B, dirs·F], state -> final,
        shaped self.shape(s, B))."""
        xp, nd, K = self.backend.xp, self.nd, len(self.runs) * self.nd
        T, B = x.shape[:2]
        finals = None                   # made after the first run: its device work starts first
        self.masks = []
        inp = frames.mask(x)            # padded input frames read as zeros, whatever the caller put there
        for l, layer in enumerate(self.runs):
            F = layer[0].out_size
            out = xp.empty((T, B, nd * F), x.dtype)
            for d, run in enumerate(layer):
                k = l * nd + d
                st0 = {s: None if a is None else a[..., k, :, :] for s, a in init.items()}
                for s, f in run.forward(params[l][d], inp, st0, frames, _columns(out, d, F, nd), ladder).items():
                    if finals is None:  # every slice k is written
                        finals = {s: xp.empty(self.shape(s, B), x.dtype) for s in self.states}
                    self.backend.copy(_slot(finals[s], k, K), f)
            out = frames.mask(out)
            mask = None
            if dropout > 0 and l < len(self.runs) - 1:
                mask = dropout_mask(rng, out.shape, dropout, xp, x.dtype, window)   # keyed by the layer's own generator
            self.masks.append(mask)
            inp = out if mask is None else out * mask
        return out, finals or {}

    def backward(self, gy, gfinals: dict, frames: Frames):
        """gy: [T, B, dirs·F]; gfinals: state -> self.shape(s, B) or None. Returns (gx [T, B, D],
        state -> g0 shaped self.shape(s, B), grads[l][d]: cell param -> gradient)."""
        xp, nd, K = self.backend.xp, self.nd, len(self.runs) * self.nd
        T, B = gy.shape[:2]
        g = frames.mask(gy)             # gradients arriving at padded frames are ignored
        ginit = {s: xp.empty(self.shape(s, B), gy.dtype) for s in self.states}     # every slice k is written
        grads = [[None] * nd for _ in self.runs]
        for l in reversed(range(len(self.runs))):
            layer, F = self.runs[l], self.runs[l][0].out_size
            for d, run in enumerate(layer):
                k = l * nd + d
                gf = {s: None if a is None else a[..., k, :, :] for s, a in gfinals.items()}
                fresh = xp.empty((T, B, run.in_size), gy.dtype) if d == 0 else None
                gxd, g0, grads[l][d] = run.backward(_columns(g, d, F, nd), gf, frames, fresh)
                if d == 0:
                    gx = fresh              # a call in chunks wrote gx there; else gxd is a workspace view
                    if gxd is not fresh:
                        self.backend.copy(gx, gxd)
                else:
                    gx += gxd
                for s, v in g0.items():
                    self.backend.copy(_slot(ginit[s], k, K), v)
            if l > 0:
                mask = self.masks[l - 1]
                g = frames.mask(gx if mask is None else gx * mask)
        return frames.mask(gx), ginit, grads


def _columns(a, d: int, F: int, nd: int):
    """Direction d's F columns of a [T, B, nd·F]: a itself for one direction (a cupy view costs µs of host time)."""
    return a if nd == 1 else a[..., d * F:(d + 1) * F]


def _slot(a, k: int, K: int):
    """Slot k of a state's [K, B, S] (or [D, K, B, S]): a itself where it is [1, B, S], which a copy of [B, S]
    fills whole (backend.copy)."""
    return a if K == 1 and a.ndim == 3 else a[..., k, :, :]
