"""Bounded shapes (rnngraph.nn.buckets): a call with B padded to a step of the ladder and T run in the executors'
ladder of chunks gives exactly what the plain call gives, outputs, final states and every gradient, on the
numpy backend in float64."""
import numpy as np
import pytest

from rnngraph import RnnGraphError
from rnngraph.nn import Recurrent
from rnngraph.nn.buckets import Padding, Policy, bucket
from rnngraph.run.backends.numpy_backend import NumpyBackend
from test_history import skip_cell

TOL = 1e-12      # float64: padded frames never feed real ones; the GEMMs over more rows may sum in another order


def close(a, b):
    assert a.shape == b.shape
    scale = max(float(np.abs(b).max()), 1e-300)
    assert float(np.abs(a - b).max()) <= TOL * scale, float(np.abs(a - b).max()) / scale


def test_the_ladder():
    assert [bucket(b) for b in range(1, 65)] == [4] * 4 + [8] * 4 + [12] * 4 + [16] * 4 + [24] * 8 + [32] * 8 + \
        [48] * 16 + [64] * 16
    assert len({bucket(b) for b in range(1, 65)}) == 8         # at most 8 steps up to 64
    assert [bucket(b) for b in (65, 96, 97, 128, 129, 192, 193)] == [96, 96, 128, 128, 192, 192, 256]
    assert not Padding(np, 17, 4, 4) and Padding(np, 16, 3, 4) and Padding(np, 5, 9, 16)     # T is never padded


def run(layer, x, state, lengths, gy, gstate):
    y, fin = layer(x, state, lengths)
    gx, g0, grads = layer.backward(gy, gstate)
    return [y, *(fin if isinstance(fin, tuple) else (fin,)), gx, *(g0 if isinstance(g0, tuple) else (g0,)),
            *grads.values()]


CASES = [("lstm", 1, 1), ("lstm", 9, 3), ("lstm", 17, 12), ("gru", 33, 9), ("gru", 8, 2), (skip_cell, 11, 10)]


@pytest.mark.parametrize("cell,T,B", CASES)
@pytest.mark.parametrize("ragged", [False, True])
def test_padded_call_equals_the_exact_call(cell, T, B, ragged):
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=3)
    exact, padded = Recurrent(cell, 3, 5, buckets=False, **kw), Recurrent(cell, 3, 5, buckets=True, **kw)
    rng = np.random.default_rng(T * B)
    x = rng.standard_normal((T, B, 3))
    lengths = rng.integers(0, T + 1, B) if ragged else None
    y, fin = exact(x, None, lengths)
    fins = fin if isinstance(fin, tuple) else (fin,)
    state = tuple(rng.standard_normal(f.shape) for f in fins)
    state = state if len(state) > 1 else state[0]
    gy = rng.standard_normal(y.shape)
    gstate = tuple(rng.standard_normal(f.shape) for f in fins)
    gstate = gstate if len(gstate) > 1 else gstate[0]
    for a, b in zip(run(padded, x, state, lengths, gy, gstate), run(exact, x, state, lengths, gy, gstate), strict=True):
        close(a, b)


def test_a_call_padded_with_sequences_alone_masks_nothing(monkeypatch):
    """The sequences a call is padded with (length 0, zero inputs and gradients, outputs dropped, never feeding a
    real one) need no masks: a padded call of full-length sequences copies no input, output or gradient to mask
    it (Frames.mask returns its array), a ragged one masks every one; both equal exact calls
    (test_padded_call_equals_the_exact_call)."""
    from rnngraph.nn.stacking import Frames
    copies, mask = [], Frames.mask

    def counted(self, a):
        out = mask(self, a)
        copies.append(out is not a)
        return out
    monkeypatch.setattr(Frames, "mask", counted)
    layer = Recurrent("lstm", 3, 4, num_layers=2, dtype="float64", buckets=True)
    x = np.random.default_rng(0).standard_normal((7, 5, 3))         # B = 5 runs as 8
    for lengths, masked in ((None, False), (np.array([7, 3, 7, 0, 2]), True)):
        copies.clear()
        y, _ = layer(x, None, lengths)
        layer.backward(np.ones_like(y))
        assert layer._last[3].Bp == 8 and len(copies) == 6 and set(copies) == {masked}


def test_batch_first_and_no_gradient_for_the_output():
    kw = dict(batch_first=True, dtype="float64")
    exact, padded = Recurrent("lstm", 3, 4, buckets=False, **kw), Recurrent("lstm", 3, 4, buckets=True, **kw)
    x = np.random.default_rng(0).standard_normal((10, 13, 3))          # B = 10 -> 10, T = 13 -> 14
    for layer in (exact, padded):
        layer(x)
    (h, c) = padded(x)[1]
    assert h.shape == (1, 10, 4)
    g = np.ones_like(h)
    for a, b in zip(padded.backward(None, (g, None))[0:1], exact.backward(None, (g, None))[0:1]):
        close(a, b)


def test_the_automatic_policy_pads_only_after_four_shapes():
    auto = Policy(None)
    assert [auto.pads(T, 2) for T in range(10, 14)] == [False] * 4
    assert auto.pads(10, 2) is False and auto.pads(18, 2) is True and auto.pads(13, 2) is True     # bounded from then on
    assert Policy(True).pads(16, 4) and not Policy(False).pads(17, 9)
    assert Recurrent("gru", 2, 3).buckets is False and Recurrent("gru", 2, 3, buckets=True).buckets
    with pytest.raises(RnnGraphError, match="buckets must be True, False or None"):
        Recurrent("gru", 2, 3, buckets="yes")


def test_the_automatic_policy_keeps_one_batch_size_exact():
    """Automatically B pads only once calls come in more than one B (a single stream of many lengths stays one
    stream); buckets=True pads every B."""
    auto, always = Policy(None), Policy(True)
    assert [auto.pads(T, 3) for T in range(10, 16)] == [False] * 4 + [True] * 2
    assert auto.rows(3) == 3
    assert always.pads(10, 3) and always.rows(3) == bucket(3) > 3
    assert auto.pads(10, 5) and auto.rows(5) == bucket(5) > 5 and auto.rows(3) == bucket(3)


@pytest.mark.parametrize("cell", ["lstm", skip_cell])
def test_workspaces_share_one_arena_that_grows(cell):
    """Every (T, B) of a layer is carved from the same buffers: a short call after a long one reuses them
    (a state read up to 3 frames back
    finds its initial history there, as in a fresh one), a longer one grows them and retires the rest."""
    layer = Recurrent(cell, 3, 4, dtype="float64", buckets=False)
    ex = layer._stack.runs[0][0].ex
    rng = np.random.default_rng(0)
    long, short = rng.standard_normal((12, 3, 3)), rng.standard_normal((5, 2, 3))
    layer(long)
    layer.backward(np.ones((12, 3, 4)))
    held, generation = ex.arenas.nbytes, ex.arenas.generation
    y, _ = layer(short)
    g = layer.backward(np.ones_like(y))[0]
    fresh = Recurrent(cell, 3, 4, dtype="float64", buckets=False)
    y2, _ = fresh(short)
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(g, fresh.backward(np.ones_like(y2))[0])
    assert (ex.arenas.nbytes, ex.arenas.generation) == (held, generation) and len(ex._ws) == 2
    layer(rng.standard_normal((30, 3, 3)))
    assert ex.arenas.generation > generation and list(ex._ws) == [(30, 3, "float64", False)]
    np.testing.assert_array_equal(layer(short)[0], y2)


def test_graph_cache_limit_from_the_environment(monkeypatch):
    from rnngraph.run.backends.cuda.recordings import graph_bytes_limit
    for text, want in (("2G", 2 ** 31), ("500M", 500 * 2 ** 20), ("1.5k", 1536), ("12345", 12345)):
        monkeypatch.setenv("RNNGRAPH_GRAPH_CACHE_BYTES", text)
        assert graph_bytes_limit() == want
    monkeypatch.delenv("RNNGRAPH_GRAPH_CACHE_BYTES")
    assert graph_bytes_limit() == 2 ** 31
    monkeypatch.setenv("RNNGRAPH_GRAPH_CACHE_BYTES", "lots")
    with pytest.raises(RnnGraphError, match="must be a byte count such as 2G"):
        graph_bytes_limit()


class Roomy(NumpyBackend):
    """A backend whose loop kernel runs more rows faster: B + 3 (as a GPU's persistent loop runs B = 31 as 32)."""
    asked: list = []

    def loop_problem(self, cell, loop, B, dtype):
        return None             # "its kernel runs": the executor asks batch_rows (the reference still runs here)

    def batch_rows(self, cell, loop, B, dtype):
        self.asked.append(B)
        return B + 3


@pytest.mark.parametrize("cell", ["lstm", skip_cell])
def test_a_call_runs_the_rows_its_backend_runs_faster(cell):
    """Backend.batch_rows: the layer pads a call to the rows its executors ask for, the added sequences of length
    0, so its results equal the exact call's (float64; ragged lengths, initial states, a stacked bidirectional
    layer); one frame at a time (step) runs exactly B, and so does a layer whose dropout is part of a larger
    batch's (stream_window)."""
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=5, buckets=False)
    roomy, exact = Recurrent(cell, 3, 4, backend=Roomy(), **kw), Recurrent(cell, 3, 4, **kw)
    rng = np.random.default_rng(7)
    x, lengths = rng.standard_normal((6, 5, 3)), np.array([6, 0, 3, 6, 1])
    fins = exact(x, None, lengths)[1]
    fins = fins if isinstance(fins, tuple) else (fins,)
    state = tuple(rng.standard_normal(f.shape) for f in fins)
    gy, gstate = rng.standard_normal((6, 5, 8)), tuple(rng.standard_normal(f.shape) for f in fins)
    state, gstate = (state, gstate) if len(state) > 1 else (state[0], gstate[0])
    Roomy.asked.clear()
    for a, b in zip(run(roomy, x, state, lengths, gy, gstate), run(exact, x, state, lengths, gy, gstate), strict=True):
        close(a, b)
    assert set(Roomy.asked) == {5} and roomy._last[3].Bp == 8       # padded from 5 to 8 rows
    one = Recurrent(cell, 3, 4, backend=Roomy(), dtype="float64")
    one.step(x[0])
    assert one._last[3] is None
    one(x)
    assert one._last[3].Bp == 8
    one.stream_window = (0, 10)
    one(x)
    assert one._last[3] is None
