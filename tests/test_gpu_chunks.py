"""Graph mode in chunks on the GPU (run/chunks.py): replays of K-frame recordings, each chunk reading its place
in the call from the cursor, equal staged mode in float64 for T = 1, K-1, K, K+1, 3K+2 and ragged batches,
forward and backward, every built-in cell and a cell reading 3 frames back; the number of recordings stops
growing with T; a sweep of shapes records and allocates nothing after warm-up; the default chunk length."""
import numpy as np
import pytest

from rnngraph import CELLS
from rnngraph.nn import Recurrent
from test_gpu_buckets import rel, step
from test_history import skip_cell

pytestmark = pytest.mark.gpu
TOL = 1e-10     # float64
K = 8


@pytest.mark.parametrize("cell", list(CELLS) + [skip_cell])
def test_chunked_replays_equal_staged(cell):
    import cupy
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=2, buckets=False)
    graph = Recurrent(cell, 3, 6, backend="cupy", mode="graph", **kw)
    staged = Recurrent(cell, 3, 6, backend="cupy", mode="staged", **kw)
    graph.backend.chunk_frames = K
    rng = np.random.default_rng(0)
    for T in (1, K - 1, K, K + 1, 3 * K + 2):
        for lengths in (None, np.array([T, max(T - K - 1, 0), int(rng.integers(0, T + 1))])):
            x = cupy.asarray(rng.standard_normal((T, 3, 3)))
            for a, b in zip(step(graph, x, lengths), step(staged, x, lengths), strict=True):
                assert rel(a, b) <= TOL, (T, lengths)
            assert graph._stack.runs[0][0].ex.chunked == (T > K)


def test_recordings_do_not_grow_with_t():
    import cupy
    layer = Recurrent("lstm", 4, 8, backend="cupy", mode="graph", dtype="float32", buckets=False)
    layer.backend.chunk_frames = K
    x = cupy.ones((5 * K, 2, 4), np.float32)
    counts = []
    for T in (2 * K, 3 * K, 5 * K, 4 * K):           # every chunk K frames: one recording per body and direction
        y, _ = layer(x[:T])
        layer.backward(cupy.ones_like(y))
        counts.append(layer.backend.cache_info()["graphs"])
    assert counts == [counts[0]] * 4


def test_a_sweep_of_shapes_records_and_allocates_nothing_after_warm_up():
    """Bounded shapes (buckets=True): once calls covering every ladder step the sweep's lengths use (T = 80 and
    T = 300, the longest: chunks of 16, 64 and 256 frames, or of 64 and 256 where a loop walks a chunk's frames)
    ran at every B bucket, a sweep of random (T, B) records no graph, grows no arena and takes no more memory from
    the device (the pool's bytes); a sample agrees with staged mode (float32)."""
    import cupy
    kw = dict(backend="cupy", dtype="float32", seed=1)
    layer = Recurrent("lstm", 8, 16, mode="graph", buckets=True, **kw)
    staged = Recurrent("lstm", 8, 16, mode="staged", buckets=False, **kw)
    pool, rng = cupy.get_default_memory_pool(), np.random.default_rng(3)
    x = cupy.asarray(rng.standard_normal((300, 16, 8)).astype(np.float32))

    def go(T, B, lay=layer):
        y, _ = lay(x[:T, :B])
        gx, _, grads = lay.backward(cupy.ones_like(y))
        return [y, gx, *grads.values()]
    for B in (16, 12, 8, 4, 16):        # every B step, the largest first (the arenas grow once) and last (a call
        go(80, B)                       # allocates while the last one's arrays live)
        go(300, B)
    cupy.cuda.get_current_stream().synchronize()
    ex = layer._stack.runs[0][0].ex
    graphs, held, generation = layer.backend.cache_info()["graphs"], pool.total_bytes(), ex.arenas.generation
    shapes = [(int(T), int(B)) for T, B in zip(rng.integers(1, 301, 40), rng.integers(1, 17, 40))]
    for k, (T, B) in enumerate(shapes):
        del go(T, B)[:]
        cupy.cuda.get_current_stream().synchronize()
        assert (layer.backend.cache_info()["graphs"], pool.total_bytes(), ex.arenas.generation) == \
            (graphs, held, generation), (k, T, B)
    for T, B in shapes[::8]:
        for a, b in zip(go(T, B), go(T, B, staged), strict=True):
            assert rel(a, b) <= 1e-4, (T, B)


def test_graph_mode_chunks_by_default_and_staged_mode_does_not(monkeypatch):
    from rnngraph.run.backends import get_backend
    monkeypatch.delenv("RNNGRAPH_CHUNK_FRAMES", raising=False)
    assert get_backend("cupy", "graph").chunk_frames is None and get_backend("cupy").chunk_frames == 0    # None: the strategy's
    assert Recurrent("lstm", 4, 8, backend="cupy", mode="graph", loop="stages")._stack.runs[0][0].ex.chunk_frames == 1024
    assert Recurrent("min_gru", 4, 8, backend="cupy", mode="graph")._stack.runs[0][0].ex.chunk_frames == 0
    monkeypatch.setenv("RNNGRAPH_CHUNK_FRAMES", "64")
    assert get_backend("cupy", "graph").chunk_frames == 64


@pytest.mark.parametrize("cell,loop", [("lstm", "persistent"), ("lstm", "stages"), ("gru", "auto"),
                                       ("min_gru", "scan"), ("sru", "elementwise"), ("layernorm_lstm", "auto")])
def test_recomputed_chunks_equal_staged(cell, loop):
    """Graph mode recomputing each chunk in the backward, against staged mode storing every value."""
    import cupy
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=2, buckets=False, loop=loop)
    graph = Recurrent(cell, 3, 6, backend="cupy", mode="graph", recompute=True, **kw)
    staged = Recurrent(cell, 3, 6, backend="cupy", mode="staged", recompute=False, **kw)
    graph.backend.chunk_frames = K
    rng = np.random.default_rng(1)
    for T in (K + 1, 3 * K + 2):
        for lengths in (None, np.array([T, max(T - K - 1, 0), int(rng.integers(0, T + 1))])):
            x = cupy.asarray(rng.standard_normal((T, 3, 3)))
            for a, b in zip(step(graph, x, lengths), step(staged, x, lengths), strict=True):
                assert rel(a, b) <= TOL, (T, lengths)
            assert graph.recomputed and not staged.recomputed


def test_a_million_frames_within_device_memory():
    """LSTM H = 128, B = 1, T = 1,000,000, float32, a training step in graph mode: recomputation keeps the
    device memory near x, y and their gradients (4 × 512 MB; the layer keeps a copy of y and of the input
    gradient beside its chunks' buffers: ~3.1 GB measured), where storing every value needs ~40 GB."""
    import cupy
    T, H = 1_000_000, 128
    layer = Recurrent("lstm", H, H, backend="cupy", mode="graph")
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    x = cupy.ones((T, 1, H), np.float32) * 0.01
    y, _ = layer(x)
    gx, _, _ = layer.backward(cupy.ones_like(y))
    cupy.cuda.get_current_stream().synchronize()
    assert layer.recomputed and bool(cupy.isfinite(gx).all())
    assert pool.total_bytes() <= 3.5 * 2 ** 30, pool.total_bytes() / 2 ** 30   # x, y and their gradients: 2 GiB; the layer's copies


@pytest.mark.parametrize("cell,loop", [("lstm", "persistent"), ("min_gru", "elementwise"), ("min_gru", "scan"),
                                      ("lstm", "stages")])
def test_walking_kernels_in_padded_chunks_equal_staged(cell, loop):
    """A ladder of 64 and 16 frames: where the loop's kernel walks only a chunk's n frames (persistent,
    elementwise, scan) a rest within 16 frames of 64 runs padded in one chunk of 64 (T = 60: one chunk walking 60;
    T = 130: two of 64 and one of 16 walking 2), ragged, against staged mode; 'stages' walks every frame, so its
    ladder stays the greedy one."""
    import cupy

    from rnngraph.run.chunk_plan import spans
    kw = dict(dtype="float64", seed=2, loop=loop)
    graph = Recurrent(cell, 3, 6, backend="cupy", mode="graph", buckets=True, **kw)
    staged = Recurrent(cell, 3, 6, backend="cupy", mode="staged", buckets=False, **kw)
    graph.backend.chunk_frames = 64
    ex, rng = graph._stack.runs[0][0].ex, np.random.default_rng(3)
    for T in (60, 130, 63, 7):
        x = cupy.asarray(rng.standard_normal((T, 4, 3)))
        for lengths in (None, np.array([T, T // 2, 1, int(rng.integers(0, T + 1))])):
            for a, b in zip(step(graph, x, lengths), step(staged, x, lengths), strict=True):
                assert rel(a, b) <= TOL, (T, lengths, rel(a, b))
        y, _ = graph(x)                 # which chunks the call ran in
        assert ex.chunks.last[0] == spans(T, 64, True, walks=loop != "stages"), T
        graph.backward(cupy.ones_like(y))
    assert graph.loop_strategy == loop and ex._walks(4, np.float64) == (loop != "stages")
