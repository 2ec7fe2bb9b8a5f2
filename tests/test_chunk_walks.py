"""Loops that walk only a chunk's n frames (Workspace.running): the ladder plans the rest of a call as the fewest
chunks and padded frames, a chunk weighing CHUNK_COST padded frames (chunk_plan.spans, walks=True), and a persistent
kernel, run on the CPU by the emulator, walks the running chunk's n frames read from the cursor, with results equal
to numpy's whole calls, ragged too. On the GPU: tests/test_gpu_chunks.py."""
import itertools

import numpy as np
import pytest

from cuda_on_cpu import Emulated, needs_cxx
from rnngraph import load_cell
from rnngraph.run.backends import get_backend
from rnngraph.run.chunk_plan import CHUNK_COST, ladder, spans
from rnngraph.run.executor import Executor
from test_persistent_heads import assert_agree, problem_arrays


def cost(sp) -> int:
    return CHUNK_COST * len(sp) + sum(L - n for _, L, n in sp)


def cheapest(T: int, steps: list) -> int:
    """The least cost of any plan of T frames from the steps, by brute force: full chunks of each step and at most
    one padded chunk (any step, holding what they leave)."""
    best = None
    for counts in itertools.product(*(range(T // L + 1) for L in steps)):
        left = T - sum(c * L for c, L in zip(counts, steps))
        if left < 0:
            continue
        plans = [0] if left == 0 else [L - left for L in steps if L > left]
        for pad in plans:
            c = CHUNK_COST * (sum(counts) + (left > 0)) + pad
            best = c if best is None else min(best, c)
    return best


@pytest.mark.parametrize("K", [8, 64, 512])
def test_walking_spans_are_the_cheapest_plan_of_the_ladder(K):
    """Consecutive chunks from the ladder, shortest first, every one but the first full; no plan of the ladder's
    steps (brute force) costs less in chunks and padded frames; never more chunks than without padding; and
    where the greedy ladder splits a rest into short chunks, fewer: T = 100 with K = 1024 runs as 2 chunks of 64,
    not 4 (of 16, 16, 16 and 64), a training step 1.22 against 1.42 ms measured on an H100 (LSTM H = 256, B = 32)."""
    steps = ladder(K, walks=True)
    for T in range(1, 2 * K + 70):
        sp, plain = spans(T, K, True, walks=True), spans(T, K, True)
        assert [t0 for t0, _, _ in sp] == [int(v) for v in np.cumsum([0] + [n for _, _, n in sp[:-1]])]
        assert sum(n for _, _, n in sp) == T and {L for _, L, _ in sp} <= set(steps)
        assert all(n == L for _, L, n in sp[1:]) and [L for _, L, _ in sp] == sorted(L for _, L, _ in sp)
        assert len(sp) <= len(plain) and (cost(sp) <= cost(plain) or not {L for _, L, _ in plain} <= set(steps))
        if (T <= 3 * K // 2 and K <= 64) or (T < 2 * K and T % 37 == 0):   # the brute force grows as T^steps
            assert cost(sp) == cheapest(T, steps), T
    assert spans(1000, 512, True, walks=True) == [(0, 512, 488), (488, 512, 512)] and len(spans(1000, 512, True)) == 8
    assert spans(1000, 512, walks=True) == spans(1000, 512)         # exact chunks: the rest in its own length
    assert [(L, n) for _, L, n in spans(100, 1024, True, walks=True)] == [(64, 36), (64, 64)]
    assert len(spans(100, 1024, True)) == 4


@pytest.mark.parametrize("K", [512, 1024, 4096])
def test_every_step_of_a_walking_ladder_serves_a_third_of_the_lengths(K):
    """A walking ladder stops at 64 frames, two steps at least: each step runs in at least a third of the calls of
    T in [1, 2K), so a batch size meets (and records) every step within its first few calls; a step of 16 would
    serve one call in nine (K = 1024), saving it at most 48 padded frames."""
    steps = ladder(K, walks=True)
    assert steps == [L for L in ladder(K) if L >= 64] and ladder(64, walks=True) == [64, 16]
    used = [{L for _, L, _ in spans(T, K, True, walks=True)} for T in range(1, 2 * K)]
    assert all(np.mean([L in u for u in used]) >= 1 / 3 for L in steps), K
    if K == 1024:       # against the cheapest plan with a step of 16 (brute force, every 97th T)
        assert all(cost(spans(T, K, True, walks=True)) - cheapest(T, ladder(K)) <= 48 for T in range(97, 2 * K, 97))


def test_a_numpy_executor_never_pads_for_walking():
    """numpy computes every frame of a chunk, so its ladder stays the greedy one."""
    ex = Executor(load_cell("lstm", 3, 4), get_backend("numpy"), loop="persistent", chunk=64)
    assert not ex._walks(2, np.float64)


@needs_cxx
@pytest.mark.parametrize("T", [5, 13])
def test_the_persistent_kernel_walks_the_running_chunks_frames(T):
    """A ladder of one step, 8 frames (the emulator takes a while a frame): T = 5 one chunk walking 5, 13 a
    chunk walking 5 and one walking 8; ragged (frames past a sequence's length: no output gradient, and
    outputs compared up to its length); against numpy's whole calls."""
    cell = load_cell("lstm", 3, 4)
    be = Emulated(None, False)         # blocks at once: the kernel has grid barriers
    ex = Executor(cell, be, loop="persistent", chunk=8)
    ref = Executor(cell, get_backend("numpy"), loop="stages")
    params, x, init, gy, gf = problem_arrays(cell, T, 3, "float64")
    lengths = np.array([T, T // 2, 1])
    inside = (np.arange(T)[:, None] < lengths[None, :])[..., None]        # [T, B, 1]
    got, want = [], []
    for ex_, out in ((ex, got), (ref, want)):
        outs, fins = ex_.forward(params, {"x": x}, init, lengths, ladder=ex_ is ex)
        out += [outs["h"] * inside, *(fins[s].copy() for s in sorted(fins))]
        gx, g0, gp = ex_.backward({"h": gy * inside}, gf)
        out += [gx["x"].copy(), *(g0[s].copy() for s in sorted(g0)), *(gp[n].copy() for n in sorted(gp))]
    assert_agree(got, want, "float64")
    chunks = spans(T, 8, True, walks=True)
    assert ex._walks(3, np.float64) and ex.chunks.K == 8 and chunks[0] == (0, 8, 5)
    assert be.walked == [n for _, _, n in chunks] + [n for _, _, n in reversed(chunks)]     # forward, then backward
