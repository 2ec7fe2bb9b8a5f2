"""Shape buckets for graph mode: a call of any (T, B) runs padded to a (T', B') from a small ladder, so
that a few recorded CUDA graphs (and workspaces) serve every length and batch size.

The ladder is m·2^k with m in 4..7: each size is at most 25% above the one asked for, and there are four
sizes per octave (T in [5, 400) needs 24, T in [1, 2000] 33). T is padded to at least 8 frames; B ≤ 8 runs as it is (the
per-frame GEMV kernels are specialised on it). Padding is exact, not approximate: the padded frames sit
after every sequence's end and the padded sequences have length 0, which the layers already handle
(a padded frame never feeds a real one; each sequence's final state is read at its own last frame;
outputs and incoming gradients at padded frames are zeroed).
"""
from __future__ import annotations

import numpy as np

MANTISSAS = (4, 5, 6, 7)
EXACT_SHAPES = 8   # automatic policy: the first 8 distinct shapes run exactly (a fixed-length run never pads)
MIN_T = 8          # shorter calls run 8 frames
EXACT_B = 8        # batches up to 8 run unpadded


def bucket(n: int, floor: int = 1) -> int:
    """The smallest m·2^k ≥ n (m in 4..7), where n > 8; n itself (at least `floor`) where n ≤ 8.

    >>> [bucket(n) for n in (1, 8, 9, 11, 17, 100, 400)]
    [1, 8, 10, 12, 20, 112, 448]
    """
    if n <= 8:
        return max(n, floor)
    k = n.bit_length() - 3
    while True:
        for m in MANTISSAS:
            if m << k >= n:
                return m << k
        k += 1


class Policy:
    """Whether a call of (T, B) is padded: always (True), never (False), or automatically (None): the
    first EXACT_SHAPES distinct shapes run as they are, later new ones padded, so a run of one length
    records exactly what it did before and a run of many lengths records a bounded set."""

    def __init__(self, buckets: bool | None):
        self.buckets, self.exact = buckets, set()

    def pads(self, T: int, B: int) -> bool:
        if self.buckets is not None:
            return self.buckets
        if (T, B) in self.exact or len(self.exact) < EXACT_SHAPES:
            self.exact.add((T, B))
            return False
        return True


class Padding:
    """One call's padding from (T, B) to (Tp, Bp): x and y are [T, B, F]; states have B on axis -2."""

    def __init__(self, xp, T: int, B: int):
        self.xp, self.T, self.B = xp, T, B
        self.Tp, self.Bp = bucket(T, MIN_T), (B if B <= EXACT_B else bucket(B))

    def __bool__(self) -> bool:
        return (self.Tp, self.Bp) != (self.T, self.B)

    def lengths(self, lengths):
        """Host lengths [Bp]: the real ones (T for every sequence when None), zeros for added sequences."""
        real = np.full(self.B, self.T, np.int64) if lengths is None else lengths
        return np.concatenate([real, np.zeros(self.Bp - self.B, np.int64)])

    def frames(self, a):
        """a [T, B, F] -> [Tp, Bp, F], zeros around it."""
        out = self.xp.zeros((self.Tp, self.Bp) + a.shape[2:], a.dtype)
        out[:self.T, :self.B] = a
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
        """a [Tp, Bp, F] -> its real [T, B, F] (a copy, contiguous)."""
        return self.xp.ascontiguousarray(a[:self.T, :self.B])

    def unstates(self, states: dict) -> dict:
        return {s: self.xp.ascontiguousarray(a[..., :self.B, :]) for s, a in states.items()}
