"""Shapes for graph mode: a layer fed calls of many (T, B) records a bounded set of CUDA graphs.

T needs no padding: such a call runs in chunks from its executor's ladder of chunk lengths (run/chunk_plan.py),
each chunk reading its place in the call on the device, so a few recordings serve every length. B is padded
to a step of a ladder, 4, 8, 12, 16, 24, 32, 48, 64, 96, ... (eight steps up to 64; bucket): the added
sequences have length 0, which the layers already handle (their frames never feed a real one, their outputs
and gradients are dropped), so padding is exact, not approximate.
"""
from __future__ import annotations

import numpy as np

EXACT_SHAPES = 4   # automatic policy: the first 4 distinct shapes run unbounded (a fixed-shape run records its own)
LADDER_FLOOR = 4   # the B ladder's smallest step


def bucket(n: int) -> int:
    """The smallest step of the ladder ≥ n: a padded batch's size. The ladder is 4, 8, then each power of two
    from 16 on and the step halfway to the next (12, 16, 24, 32, 48, 64, 96, ...): eight steps up to 64, each
    splitting into the persistent loop's row groups. Steps of 1 and 2 would each add a recording a chunk length
    and come rarely where B varies (a layer fed one B keeps it exact: Policy.rows); padded to 4, a call of 1 to
    3 sequences costs about its own time in half storage and, in float32, 1.35x for the LSTM at H = 256 (an
    H200, T = 1000, training step: B = 1 5.34 ms, B = 4 7.23; bfloat16 H = 512, T = 100: 0.985 / 1.005) and up
    to 1.7x at H = 512; a minGRU, whose scan or elementwise loop grows with B at any B, 2-3x (an H100, H = 512,
    T = 1000, B = 1 whole against the ladder's call, B padded to 4 in one chunk of 1024 frames: the LSTM 6.06 /
    10.5 ms, minGRU elementwise 0.77 / 1.57, scan 0.26 / 0.72).

    >>> [bucket(n) for n in (1, 5, 9, 13, 17, 25, 33, 49, 64, 65)]
    [4, 8, 12, 16, 24, 32, 48, 64, 64, 96]
    """
    if n <= LADDER_FLOOR:
        return LADDER_FLOOR
    p = 1 << (n - 1).bit_length()
    return p * 3 // 4 if p >= 16 and n <= p * 3 // 4 else p


class Policy:
    """Whether a call of (T, B) runs bounded (B padded, T in ladder chunks): always (True), never (False), or
    automatically (None): calls run as they are while they come in at most EXACT_SHAPES distinct shapes, and
    every call is bounded from the first call of another shape on, so a run of a few shapes records exactly what
    it did before and a run of many shapes records a bounded set. Automatically, B stays exact while every call
    has the same B (one B records one set whatever T: a single stream stays a single stream)."""

    def __init__(self, buckets: bool | None):
        self.buckets, self.exact, self.bounded, self.batches = buckets, set(), False, set()

    def pads(self, T: int, B: int) -> bool:
        self.batches.add(B)
        if self.buckets is not None:
            return self.buckets
        if not self.bounded and ((T, B) in self.exact or len(self.exact) < EXACT_SHAPES):
            self.exact.add((T, B))
            return False
        self.bounded = True         # from then on every call, the first shapes too: nothing more is recorded
        return True

    def rows(self, B: int) -> int:
        """The rows a bounded call of B sequences runs: its bucket, or, automatically, B while no other B came."""
        return B if self.buckets is None and self.batches == {B} else bucket(B)


class Padding:
    """One call's padding from B to Bp sequences: x and y are [T, B, F]; states have B on axis -2."""

    def __init__(self, xp, T: int, B: int, Bp: int):
        self.xp, self.T, self.B, self.Bp = xp, T, B, Bp

    def __bool__(self) -> bool:
        return self.Bp != self.B

    def lengths(self, lengths):
        """Host lengths [Bp]: the real ones (T for every sequence when None), zeros for added sequences."""
        real = np.full(self.B, self.T, np.int64) if lengths is None else lengths
        return np.concatenate([real, np.zeros(self.Bp - self.B, np.int64)])

    def frames(self, a):
        """a [T, B, F] -> [T, Bp, F], zeros for added sequences."""
        out = self.xp.zeros((self.T, self.Bp) + a.shape[2:], a.dtype)
        out[:, :self.B] = a
        return out

    def states(self, states: dict) -> dict:
        """name -> [..., B, S] or None  ->  name -> [..., Bp, S] (zeros for added sequences) or None."""
        out = {}
        for s, a in states.items():
            if a is not None and self.Bp != self.B:
                p = self.xp.zeros(a.shape[:-2] + (self.Bp, a.shape[-1]), a.dtype)
                p[..., :self.B, :] = a
                a = p
            out[s] = a
        return out

    def unframes(self, a):
        """a [T, Bp, F] -> its real [T, B, F] (a copy, contiguous)."""
        return self.xp.ascontiguousarray(a[:, :self.B])

    def unstates(self, states: dict) -> dict:
        return {s: self.xp.ascontiguousarray(a[..., :self.B, :]) for s, a in states.items()}
