"""Long sequences within memory: with recomputation the backward runs each chunk's forward again from the
states at the chunk's start instead of storing every value. In float64 it gives what storing everything
gives (outputs, states, every gradient; up to the order of the parameter gradients' sums) for every
built-in cell and loop strategy, ragged batches and a cell reading 3 frames back; RNNGRAPH_STORE_BYTES
decides when it is on by itself, and what it keeps is bounded by the chunk, not by T."""
import tracemalloc

import numpy as np
import pytest

from rnngraph import RnnGraphError, build_schedule, load_cell
from rnngraph.ir.cells import CELLS
from rnngraph.nn import Recurrent
from rnngraph.run.backends import get_backend
from rnngraph.run.executor import Executor
from rnngraph.run.settings import store_limit
from rnngraph.run.workspace import stored_bytes
from test_buckets import close, run
from test_chunks import LENGTHS, K, call
from test_history import skip_cell

STRATEGIES = [(c, loop) for c in list(CELLS) + [skip_cell]
              for loop in build_schedule(load_cell(c, 3, 5) if isinstance(c, str) else c(3, 5)).loop_strategies]


def pair(cell, loop, **kw):
    """(a layer storing every value of whole calls, one recomputing chunks of K frames), same weights."""
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=3, buckets=False, loop=loop, **kw)
    stored, again = Recurrent(cell, 3, 5, recompute=False, **kw), Recurrent(cell, 3, 5, recompute=True, **kw)
    again.backend.chunk_frames = K
    return stored, again


@pytest.mark.parametrize("cell,loop", STRATEGIES, ids=[f"{getattr(c, '__name__', c)}-{lp}" for c, lp in STRATEGIES])
@pytest.mark.parametrize("ragged", [False, True])
def test_recomputed_chunks_equal_storing_everything(cell, loop, ragged):
    stored, again = pair(cell, loop)
    for T in LENGTHS[2:]:           # K, K + 1, 3K + 2: a chunk boundary inside every call but the first
        rng = np.random.default_rng(T)
        x = rng.standard_normal((T, 3, 3))
        lengths = np.array([T, rng.integers(0, T + 1), max(T - K - 1, 0)]) if ragged else None
        state, gy, gstate = call(stored, x, lengths, rng)
        got = run(again, x, state, lengths, gy, gstate)
        for a, b in zip(got, run(stored, x, state, lengths, gy, gstate), strict=True):
            close(a, b)
        assert again.recomputed == (T > K) and not stored.recomputed


def test_the_default_store_limit_is_a_share_of_the_device_memory(monkeypatch):
    """Without RNNGRAPH_STORE_BYTES: a sixteenth of the backend's device memory, and never below 2 GiB."""
    monkeypatch.delenv("RNNGRAPH_STORE_BYTES", raising=False)
    be = get_backend("numpy")
    assert be.memory_bytes > 2 ** 30            # this machine's RAM
    for memory, limit in ((141 * 2 ** 30, 141 * 2 ** 26), (16 * 2 ** 30, 2 ** 31)):
        monkeypatch.setattr(be, "memory_bytes", memory)      # an H200's and a small device's memory
        assert store_limit(be) == limit


def test_a_strategys_chunk_stays_within_the_store_limit(monkeypatch):
    """Graph mode's chunks come from the loop strategy (chunk_frames None): K is cut to the longest power of two
    of frames whose values fit the limit (never below 8); a K the user sets is kept."""
    from rnngraph.plan.loops import STRATEGIES
    cell = load_cell("lstm", 3, 8)
    sched = build_schedule(cell, loop="stages")
    fixed = stored_bytes(sched, 0, 2, "float64")
    per_frame = stored_bytes(sched, 1, 2, "float64") - fixed
    be = get_backend("numpy")
    be.chunk_frames = None                  # as graph mode's: the strategy's own K
    params = {n: np.full(s, 0.1) for n, s in cell.params.items()}
    for frames, K in ((100, 64), (20, 16), (3, 8), (10 ** 6, STRATEGIES["stages"].chunk_frames)):
        monkeypatch.setenv("RNNGRAPH_STORE_BYTES", str(fixed + frames * per_frame))
        ex = Executor(cell, be, loop="stages", recompute=False)
        ex.forward(params, {"x": np.ones((2000, 2, 3))}, {})
        assert ex.chunked and ex.chunks.K == K, (frames, ex.chunks.K)
    ex = Executor(cell, be, loop="stages", recompute=False, chunk=512)
    ex.forward(params, {"x": np.ones((2000, 2, 3))}, {})
    assert ex.chunks.K == 512


def test_the_store_limit_picks_recomputation(monkeypatch):
    """Over RNNGRAPH_STORE_BYTES the executor recomputes, in chunks whose values take a quarter of it."""
    cell = load_cell("lstm", 3, 8)
    sched = build_schedule(cell)
    per_frame = stored_bytes(sched, 1, 2, "float64") - stored_bytes(sched, 0, 2, "float64")
    be = get_backend("numpy")
    monkeypatch.setenv("RNNGRAPH_STORE_BYTES", str(40 * per_frame))
    assert store_limit(be) == 40 * per_frame
    ex = Executor(cell, be)
    params = {n: np.full(s, 0.1) for n, s in cell.params.items()}
    for T, recomputed in ((30, False), (100, True)):
        ex.forward(params, {"x": np.ones((T, 2, 3))}, {})
        assert ex.recomputed == recomputed and ex.chunked == recomputed
    assert ex.chunks.K == 10 and stored_bytes(sched, 10, 2, "float64") <= store_limit(be) / 4 + stored_bytes(sched, 0, 2, "float64")
    ex.backward({"h": np.ones((100, 2, 8))})
    assert ex.chunks.bufs.nbytes < stored_bytes(sched, 100, 2, "float64") / 8    # no values set aside: outputs, gradients
    monkeypatch.setenv("RNNGRAPH_STORE_BYTES", "plenty")
    with pytest.raises(RnnGraphError, match="RNNGRAPH_STORE_BYTES must be a byte count such as 2G"):
        ex.forward(params, {"x": np.ones((3, 2, 3))}, {})


def test_recomputation_bounds_the_memory_of_a_long_sequence(monkeypatch):
    """T = 3,000 frames of an LSTM (H = 64): storing everything peaks at ~T times a frame's values;
    recomputing stays near the inputs', outputs' and their gradients' size."""
    T, H = 3_000, 64
    x, gy = np.ones((T, 1, H), np.float32), np.ones((T, 1, H), np.float32)
    peaks = {}
    for recompute in (False, True):
        monkeypatch.setenv("RNNGRAPH_STORE_BYTES", "4M")
        layer = Recurrent("lstm", H, H, recompute=recompute)
        tracemalloc.start()
        layer(x)
        layer.backward(gy)
        peaks[recompute] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert layer.recomputed == recompute
    io = 4 * x.nbytes            # x, y, their gradients
    assert peaks[True] < 3 * io < peaks[False] / 10, peaks     # x, y, gy, gx + a chunk and the layer's own copies


def test_recompute_must_be_a_choice():
    with pytest.raises(RnnGraphError, match=r"recompute must be True, False or None .*, got 'yes'"):
        Recurrent("lstm", 3, 4, recompute="yes")
