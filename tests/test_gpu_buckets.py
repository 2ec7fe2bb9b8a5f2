"""Graph mode with bounded shapes on the GPU (B padded to a power of two, T in the ladder of chunks): replays
equal staged mode in float64 for lengths at and around the ladder's steps and for ragged batches, every
built-in cell; the recordings stay within the backend's byte limit; a smaller batch reuses the layer's arenas."""
import numpy as np
import pytest

from rnngraph import CELLS
from rnngraph.nn import Recurrent
from test_history import skip_cell

pytestmark = pytest.mark.gpu
TOL = 1e-10     # float64


def rel(a, b) -> float:
    import cupy
    return float(cupy.abs(a - b).max() / max(float(cupy.abs(b).max()), 1e-300))


def both(cell, **kw):
    """(graph mode padding every call, staged mode never padding), the same weights."""
    graph = Recurrent(cell, 3, 6, backend="cupy", mode="graph", dtype="float64", seed=2, buckets=True, **kw)
    staged = Recurrent(cell, 3, 6, backend="cupy", mode="staged", dtype="float64", seed=2, buckets=False, **kw)
    return graph, staged


def step(layer, x, lengths):
    import cupy
    y, fin = layer(x, None, lengths)
    fins = fin if isinstance(fin, tuple) else (fin,)
    gx, g0, grads = layer.backward(cupy.ones_like(y) * 0.5, tuple(cupy.ones_like(f) for f in fins) if len(fins) > 1
                                   else cupy.ones_like(fins[0]))
    return [y, *fins, gx, *(g0 if isinstance(g0, tuple) else (g0,)), *grads.values()]


@pytest.mark.parametrize("cell", list(CELLS) + [skip_cell])
def test_padded_replays_equal_staged(cell):
    import cupy
    graph, staged = both(cell, num_layers=2, bidirectional=True)
    rng = np.random.default_rng(0)
    for T, B, ragged in ((1, 2, False), (7, 3, False), (16, 3, False), (9, 9, False), (17, 12, True), (9, 3, True)):
        x = cupy.asarray(rng.standard_normal((T, B, 3)))
        lengths = rng.integers(0, T + 1, B) if ragged else None
        for k in range(2):          # the second call replays
            for a, b in zip(step(graph, x * (k + 1), lengths), step(staged, x * (k + 1), lengths), strict=True):
                assert rel(a, b) <= TOL, (T, B, ragged, k, rel(a, b))


def test_recordings_stay_within_the_limits():
    """The byte limit holds for the bytes measured at recording (the driver's free memory moves in pages,
    so a small graph may measure 0); the count limit holds exactly; evicted shapes record again."""
    import cupy

    from rnngraph.run.backends.cuda.backend import CupyBackend
    ref = Recurrent("gru", 3, 6, backend="cupy", mode="staged", dtype="float64")
    rng = np.random.default_rng(1)
    for limits in ({"max_graph_bytes": 1}, {"max_graphs": 1}):
        be = CupyBackend("graph", **limits)
        layer = Recurrent("gru", 3, 6, backend=be, mode="graph", dtype="float64", buckets=True)
        layer.load_state_dict(ref.state_dict())
        for T in (5, 20, 40, 5):
            x = cupy.asarray(rng.standard_normal((T, 2, 3)))
            assert rel(layer(x)[0], ref(x)[0]) <= TOL
            info = be.cache_info()
            assert info["graphs"] == 1 or (info["graph_bytes"] <= 1 and "max_graph_bytes" in limits)
    roomy = CupyBackend("graph", max_graph_bytes=2 ** 40)
    layer = Recurrent("gru", 3, 6, backend=roomy, mode="graph", dtype="float64", buckets=True)
    for T in (16, 9, 5):            # longest first: the arenas never grow, so nothing is retired
        y = layer(cupy.asarray(rng.standard_normal((T, 2, 3))))[0]
        layer.backward(cupy.ones_like(y))
    assert roomy.cache_info()["graphs"] == 2        # every call one chunk of the ladder's smallest step, its
    # frames padded to it: one forward and one backward
    layer(cupy.asarray(rng.standard_normal((200, 2, 3))))   # a longer call: its buffers grow and retire them
    ex = layer._stack.runs[0][0].ex
    assert roomy.cache_info()["graphs"] == len({L for _, L, _ in ex.chunks.last[0]})    # its forward's chunks


def test_a_smaller_batch_reuses_the_arenas():
    import cupy
    layer, _ = both("lstm")
    ex = layer._stack.runs[0][0].ex
    rng = np.random.default_rng(2)
    for B in (12, 10, 3, 12):
        y = layer(cupy.asarray(rng.standard_normal((30, B, 3))))[0]
        layer.backward(cupy.ones_like(y))
        if B == 12:
            held = (ex.arenas.nbytes, ex.arenas.generation)
        assert (ex.arenas.nbytes, ex.arenas.generation) == held
