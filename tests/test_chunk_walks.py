"""Loops that walk only a chunk's n frames (Workspace.running): the ladder pads a rest short of a step by less
than the next step into that step (chunks.spans, walks=True), and a persistent kernel, run on the CPU by the
emulator, walks the running chunk's n frames read from the cursor, with results equal to numpy's whole calls,
ragged too. On the GPU: tests/test_gpu_chunks.py."""
import numpy as np
import pytest

from cuda_on_cpu import Emulated, needs_cxx
from rnngraph import load_cell
from rnngraph.run.backends import get_backend
from rnngraph.run.chunks import ladder, spans
from rnngraph.run.executor import Executor
from test_persistent_heads import assert_agree, problem_arrays


@pytest.mark.parametrize("K", [8, 64, 512])
def test_walking_spans_pad_a_rest_within_a_step_of_the_next(K):
    """Consecutive chunks from the ladder, shortest first, every one but the first full; the first short of its
    step by less than the step below it (or than the smallest step); never more chunks than without padding."""
    steps = ladder(K)
    for T in range(1, 2 * K + 70):
        sp, plain = spans(T, K, True, walks=True), spans(T, K, True)
        assert [t0 for t0, _, _ in sp] == [int(v) for v in np.cumsum([0] + [n for _, _, n in sp[:-1]])]
        assert sum(n for _, _, n in sp) == T and {L for _, L, _ in sp} <= set(steps)
        assert all(n == L for _, L, n in sp[1:]) and [L for _, L, _ in sp] == sorted(L for _, L, _ in sp)
        t0, L, n = sp[0]
        below = steps[steps.index(L) + 1] if L != steps[-1] else steps[-1]
        assert 0 <= L - n < below and len(sp) <= len(plain)
    assert spans(1000, 512, True, walks=True) == [(0, 512, 488), (488, 512, 512)] and len(spans(1000, 512, True)) == 8
    assert spans(1000, 512, walks=True) == spans(1000, 512)         # exact chunks: the rest in its own length


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
