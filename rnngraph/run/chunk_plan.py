"""How a call of T frames runs in chunks (run/chunks.py runs them).

The chunks of a call (spans): chunks of K frames and the rest as one chunk of its own length (exact), or,
where calls come in many lengths (ladder), chunks taken greedily from the ladder K, K/4, K/16, ... (≥ 8
frames). They run shortest first, so that the last chunk, whose values the backward (last chunk first) finds
in place rather than set aside, is the longest. A ladder's first chunk holds the n frames, fewer than its
smallest step, that the others leave, and runs padded to that step: its frames past n read zero inputs and
every sequence's length is clipped to n, as padded frames are, so they never feed a real one. For a loop that
walks only a chunk's frames a padded frame costs little, so its ladder pads where that saves chunks: a call
takes the fewest chunks and padded frames, one padded chunk at most (spans), and its steps stop at 64 frames
(K = 1024: 1024, 256 and 64), so that a few calls cover them all. A ladder records at most one chunk a step,
whatever the lengths.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

LADDER_BASE = 4              # a ladder's steps: K, K/4, K/16, ...
LADDER_MIN = 8               # ... down to no fewer frames than this
WALKING_MIN = 64             # ... or, for a loop walking only a chunk's frames, this (but two steps at least): a
                             # shorter step serves only a call's last few frames, in one call of nine (T in
                             # [1, 2000]), so a batch size's recording of it came late (an H200 load probe: after
                             # call 200), where a chunk of 64 holds them for 48 padded frames at most
LADDER_TOP = 4096            # the ladder's K where the loop strategy runs whole calls (chunk_frames 0)
CHUNK_COST = 64              # what a chunk costs a loop walking its frames, in padded frames (an LSTM at H = 256,
                             # B = 32, float32, on an H100: about 0.1 ms a chunk, 1.3-1.5 us a padded frame)


def ladder(K: int, walks: bool = False) -> list:
    """The chunk lengths of ladder mode, longest first; walks: for a loop walking only a chunk's frames.

    >>> ladder(512), ladder(4096), ladder(100), ladder(5)
    ([512, 128, 32, 8], [4096, 1024, 256, 64, 16], [100, 25], [5])
    >>> ladder(1024, walks=True), ladder(512, walks=True), ladder(64, walks=True)
    ([1024, 256, 64], [512, 128], [64, 16])
    """
    steps = [K]
    while steps[-1] // LADDER_BASE >= LADDER_MIN:
        steps.append(steps[-1] // LADDER_BASE)
    return [L for k, L in enumerate(steps) if k < 2 or L >= WALKING_MIN] if walks else steps


def spans(T: int, K: int, in_ladder: bool = False, walks: bool = False) -> list:
    """[(t0, L, n)]: the chunks of a call of T frames, each recorded at L frames and holding the n ≤ L
    frames t0 .. t0 + n - 1, shortest first (the longest last: its values stay in place for the backward);
    the rest as one chunk then chunks of K frames, or, in_ladder, greedily from the ladder, the rest padded up
    to its smallest step. walks: the loop walks only a chunk's n frames (a padded frame costs its share of the
    chunk's parallel work, not a frame of the loop), so in the ladder chunks of K while 2K frames or more are
    left, then the plan of the rest from ladder(K, walks) that costs least, a chunk weighing CHUNK_COST padded
    frames (T = 100 with K = 1024: 2 chunks of 64 frames, one holding 36, not 4 chunks of 16, 16, 16 and 64).

    >>> spans(10, 4), spans(20, 16, True), len(spans(60, 64, True)), spans(60, 64, True, walks=True)
    ([(0, 2, 2), (2, 4, 4), (6, 4, 4)], [(0, 16, 4), (4, 16, 16)], 4, [(0, 64, 60)])
    >>> spans(100, 1024, True, walks=True), len(spans(100, 1024, True))
    ([(0, 64, 36), (36, 64, 64)], 4)
    """
    return list(_spans(T, K, in_ladder, walks))


@functools.lru_cache(maxsize=4096)
def _spans(T: int, K: int, in_ladder: bool, walks: bool) -> tuple:
    """spans(), once a call's (T, K, in_ladder, walks)."""
    plan = _plan(T, K, in_ladder, walks)[::-1]
    starts = itertools.accumulate((n for _, n in plan), initial=0)
    return tuple((t0, L, n) for t0, (L, n) in zip(starts, plan))


def _plan(T: int, K: int, in_ladder: bool, walks: bool) -> list:
    """[(L, n)]: the chunks of spans(), longest first: taken greedily, or, for a loop walking the ladder, chunks of
    K while 2K frames or more are left, then the cheapest plan of the rest (_cheapest)."""
    if in_ladder and walks:
        q, take = max(0, T // K - 1), _cheapest(K)
        out, left = [(K, K)] * q, T - q * K
        while left:
            L = int(take[left])
            out.append((L, L) if L > 0 else (-L, left))
            left = left - L if L > 0 else 0
        return sorted(out, reverse=True)
    steps, out, left = (ladder(K) if in_ladder else [K]), [], T
    for L in steps:
        out += [(L, L)] * (left // L)
        left %= L
    if left:
        out.append((steps[-1] if in_ladder else left, left))
    return out


@functools.lru_cache(maxsize=16)
def _cheapest(K: int) -> np.ndarray:
    """[2K] the step of the first chunk of the cheapest plan of t frames from the ladder (CHUNK_COST a chunk, 1 a
    padded frame; full chunks, then at most one padded one holding what they leave), negative where that chunk
    is the padded one. Worked out a smallest step of t at a time: each reads the plans of t - L, done already."""
    steps, n = np.array(ladder(K, walks=True)), 2 * K
    cost, take = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for a in range(1, n, steps[-1]):
        t = np.arange(a, min(a + steps[-1], n))
        options = np.stack([np.where(t >= L, cost[np.maximum(t - L, 0)], L - t) for L in steps])
        k = options.argmin(axis=0)
        cost[t] = CHUNK_COST + options[k, np.arange(len(t))]
        take[t] = np.where(t >= steps[k], steps[k], -steps[k])
    return take


def within(room: int, per_frame: int) -> int:
    """The most frames, a power of two and at least LADDER_MIN, whose values take at most `room` bytes."""
    frames = max(LADDER_MIN, room // per_frame)
    return 1 << (frames.bit_length() - 1)


def most_chunks(T: int, K: int, in_ladder: bool = False) -> int:
    """The most chunks spans() makes of any call of at most T frames: in the ladder a shorter call may run in more
    (T = 300 with K = 1024: 4 chunks, T = 255: 7). A walking loop's calls run in no more (spans).

    >>> most_chunks(300, 1024, True), max(len(spans(t, 1024, True)) for t in range(1, 301))
    (7, 7)
    """
    return most_aside(T, K, in_ladder) + 1 if T >= 1 else 0


def most_aside(T: int, K: int, in_ladder: bool = False, walks: bool = False, weight=None) -> int:
    """The most that the weights (chunk length L -> a number, growing with L; None: 1 a chunk) of all the chunks
    but the last, the longest, of any call of at most T frames add up to (spans(t, K, in_ladder, walks), t ≤ T):
    buffers sized by it serve every shorter call. A call of 2K frames or more runs as one of K frames fewer, but
    for one more chunk of K frames: its weight.

    >>> most_aside(2000, 1024, True, True, lambda L: L), most_aside(2000, 1024, True, False, lambda L: L)
    (1024, 976)
    """
    weight = weight or (lambda L: 1)
    if T < 1:
        return 0
    q, R = divmod(T, K)
    if not in_ladder:           # the rest, then q chunks of K: T itself sets aside the most
        return (q - 1) * weight(K) + (weight(R) if R else 0) if q else 0
    most, top = _most_aside(K, walks, tuple(weight(L) for L in ladder(K, walks)))
    if T < 2 * K:
        return most[T]
    return max(most[2 * K - 1] + (q - 2) * weight(K), top[R] + (q - 1) * weight(K))


@functools.lru_cache(maxsize=64)
def _most_aside(K: int, walks: bool, weights: tuple) -> tuple:
    """([2K] the most set aside by a call of at most t frames, [K] the most by one of K to K + r frames), the
    ladder's steps weighing `weights`."""
    by_length = dict(zip(ladder(K, walks), weights))
    aside = [sum(by_length[L] for L, _ in _plan(t, K, True, walks)[1:]) for t in range(2 * K)]    # longest first
    return list(itertools.accumulate(aside, max)), list(itertools.accumulate(aside[K:], max))
