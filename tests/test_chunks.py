"""Time in chunks (rnngraph/run/chunks.py): a call longer than K frames runs as chunks of at most K
frames, each in the workspace of its own length and reading its place in the call from the call's cursor,
its values set aside for the backward; calls of many lengths run in chunks from a ladder of lengths. On the
numpy backend in float64, chunked calls give what whole calls give (outputs, final states, every gradient)
for every built-in cell in every loop strategy it admits and a cell reading 3 frames back, whole and ragged
batches, in K chunks and in the ladder, and the buffers stop growing after the longest call."""
import numpy as np
import pytest

from rnngraph import build_schedule
from rnngraph.ir.cells import CELLS
from rnngraph.nn import Recurrent
from rnngraph.run.backends import get_backend
from rnngraph.run.chunk_plan import LADDER_TOP, ladder, most_aside, most_chunks, spans
from rnngraph.run.executor import Executor
from rnngraph.ir.loading import load_cell
from test_buckets import close, run
from test_classify import LINEAR_FORMS, one_state
from test_history import skip_cell

K = 4
LENGTHS = [1, K - 1, K, K + 1, 3 * K + 2]


def pair(cell, **kw):
    """(a layer running whole calls, one running chunks of K frames), with the same weights."""
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=3, buckets=False, **kw)
    whole, chunked = Recurrent(cell, 3, 5, **kw), Recurrent(cell, 3, 5, **kw)
    chunked.backend.chunk_frames = K
    return whole, chunked


def call(layer, x, lengths, rng):
    y, fin = layer(x, None, lengths)
    fins = fin if isinstance(fin, tuple) else (fin,)
    state = tuple(rng.standard_normal(f.shape) for f in fins)
    gstate = tuple(rng.standard_normal(f.shape) for f in fins)
    return (state if len(state) > 1 else state[0]), rng.standard_normal(y.shape), (gstate if len(gstate) > 1 else gstate[0])


@pytest.mark.parametrize("cell", list(CELLS) + [skip_cell])
@pytest.mark.parametrize("ragged", [False, True])
def test_chunked_calls_equal_whole_calls(cell, ragged):
    whole, chunked = pair(cell)
    for T in LENGTHS:
        rng = np.random.default_rng(T)
        x = rng.standard_normal((T, 3, 3))
        lengths = np.array([T, rng.integers(0, T + 1), max(T - K - 1, 0)]) if ragged else None
        state, gy, gstate = call(whole, x, lengths, rng)
        got = run(chunked, x, state, lengths, gy, gstate)
        for a, b in zip(got, run(whole, x, state, lengths, gy, gstate), strict=True):
            close(a, b)
        assert chunked._stack.runs[0][0].ex.chunked == (T > K)


OTHER_STRATEGIES = [(c, s) for c in CELLS for s in build_schedule(load_cell(c, 3, 5)).loop_strategies
                    if s != build_schedule(load_cell(c, 3, 5)).loop_strategy]


@pytest.mark.parametrize("cell, loop", OTHER_STRATEGIES)
def test_chunked_calls_equal_whole_calls_in_every_strategy(cell, loop):
    """Each cell's other loop strategies (the one 'auto' picks is above): a scan cell's elementwise and stages
    loops, a persistent cell's stages, ragged, at every length around K."""
    whole, chunked = pair(cell, loop=loop)
    assert {r.ex.sched.loop_strategy for run_ in chunked._stack.runs for r in run_} == {loop}
    for T in LENGTHS:
        rng = np.random.default_rng(T)
        x = rng.standard_normal((T, 3, 3))
        lengths = np.array([T, rng.integers(0, T + 1), max(T - K - 1, 0)])
        state, gy, gstate = call(whole, x, lengths, rng)
        for a, b in zip(run(chunked, x, state, lengths, gy, gstate), run(whole, x, state, lengths, gy, gstate),
                        strict=True):
            close(a, b)


def test_the_spans_and_a_shorter_call_reusing_the_buffers():
    cell = load_cell("lstm", 3, 5)
    ex = Executor(cell, get_backend("numpy"), chunk=K)
    assert spans(3 * K + 2, K) == [(0, 2, 2), (2, K, K), (K + 2, K, K), (2 * K + 2, K, K)]     # the longest last
    assert spans(K, K) == [(0, K, K)]
    params = {n: np.random.default_rng(0).standard_normal(s) for n, s in cell.params.items()}
    held = []
    for T in (4 * K + 3, 2 * K + 1, 3 * K, 4 * K + 3):
        x = np.ones((T, 2, 3))
        ex.forward(params, {"x": x}, {})
        ex.backward({"h": np.ones((T, 2, 5))})
        held.append((ex.chunks.bufs.nbytes, ex.arenas.nbytes))
    assert held[1:] == held[:1] * 3           # the longest call first: no buffer grows after it
    assert sorted(T for T, _, _, chunk in ex._ws if chunk) == [1, 3, K]    # workspaces of K frames and the remainders


def test_a_ladder_covers_every_length_with_few_chunk_lengths():
    """Ladder spans: consecutive, shortest first, every chunk but the first full, lengths from the ladder, the
    first padded by fewer frames than the smallest step."""
    assert ladder(512) == [512, 128, 32, 8] and ladder(LADDER_TOP) == [4096, 1024, 256, 64, 16] and ladder(4) == [4]
    for k in (4, 64, 100, 512):
        steps = ladder(k)
        for T in range(1, 2 * k + 70):
            sp = spans(T, k, True)
            assert [t0 for t0, _, _ in sp] == [int(v) for v in np.cumsum([0] + [n for _, _, n in sp[:-1]])]
            assert sum(n for _, _, n in sp) == T and {L for _, L, _ in sp} <= set(steps)
            assert all(n == L for _, L, n in sp[1:]) and 0 <= sp[0][1] - sp[0][2] < steps[-1]
            assert [L for _, L, _ in sp] == sorted(L for _, L, _ in sp)


LADDER_LENGTHS = [1, 15, 16, 17, 75, 280]   # the numpy backend's ladder (K = LADDER_TOP): 75 = 64 + 11 padded to 16,
                                            # 280 = 256 + 16 + 8 padded to 16


@pytest.mark.parametrize("cell", list(CELLS) + [skip_cell])
def test_ladder_calls_equal_whole_calls(cell):
    """buckets=True: any T in chunks from the ladder (the last padded, its frames past the call's end masked),
    B = 3 padded to 4, ragged, against whole calls."""
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=3)
    whole, bounded = Recurrent(cell, 3, 5, buckets=False, **kw), Recurrent(cell, 3, 5, buckets=True, **kw)
    for T in LADDER_LENGTHS:
        rng = np.random.default_rng(T)
        x = rng.standard_normal((T, 3, 3))
        for lengths in (None, np.array([T, rng.integers(0, T + 1), max(T - 9, 0)])):
            state, gy, gstate = call(whole, x, lengths, rng)
            for a, b in zip(run(bounded, x, state, lengths, gy, gstate), run(whole, x, state, lengths, gy, gstate),
                            strict=True):
                close(a, b)
            ex = bounded._stack.runs[0][0].ex
            assert ex.chunked and {L for L, B, _, chunk in ex._ws} <= {16, 64, 256} and ex.ws.B == 4


def test_recomputed_ladder_calls_equal_whole_calls():
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=3)
    whole = Recurrent("gru", 3, 5, buckets=False, recompute=False, **kw)
    again = Recurrent("gru", 3, 5, buckets=True, recompute=True, **kw)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((75, 2, 3))
    lengths = np.array([75, 40])
    state, gy, gstate = call(whole, x, lengths, rng)
    for a, b in zip(run(again, x, state, lengths, gy, gstate), run(whole, x, state, lengths, gy, gstate), strict=True):
        close(a, b)
    assert again.recomputed


def test_a_ladder_makes_one_workspace_a_step_and_writes_the_cursor_once_a_call(monkeypatch):
    """Over many lengths, the chunk workspaces (and so, in graph mode, the recordings) are the ladder's steps;
    the host writes each call's cursor once forward and once backward, whatever the number of chunks."""
    layer = Recurrent("lstm", 3, 5, dtype="float64", buckets=True)
    be, ex = layer.backend, layer._stack.runs[0][0].ex
    uploads = []
    real = be.upload
    monkeypatch.setattr(be, "upload", lambda dst, host: (uploads.append(len(host)), real(dst, host)))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((700, 2, 3))
    for T in rng.integers(1, 700, 12):
        del uploads[:]
        y, _ = layer(x[:T])
        assert len(ex.chunks.last[0]) == len(spans(int(T), LADDER_TOP, True)) > 0
        layer.backward(np.ones_like(y))
        assert len(uploads) == 3
    assert {L for L, _, _, _ in ex._ws} <= set(ladder(LADDER_TOP)) and all(chunk for *_, chunk in ex._ws)


def test_chunking_is_off_by_default_on_numpy_and_can_be_asked_for():
    assert get_backend("numpy").chunk_frames == 0
    whole, chunked = pair("lstm")
    x = np.ones((2 * K + 1, 2, 3))
    whole(x)
    chunked(x)
    assert not whole._stack.runs[0][0].ex.chunked and chunked._stack.runs[0][0].ex.chunked


def test_the_chunk_setting_and_its_error(monkeypatch):
    from rnngraph.errors import RnnGraphError
    from rnngraph.run.backends.cuda.recordings import chunk_frames_setting
    monkeypatch.delenv("RNNGRAPH_CHUNK_FRAMES", raising=False)
    assert chunk_frames_setting(None) is None and chunk_frames_setting(0) == 0      # None: each strategy's
    monkeypatch.setenv("RNNGRAPH_CHUNK_FRAMES", "64")
    assert chunk_frames_setting(None) == 64 and chunk_frames_setting(32) == 32
    monkeypatch.setenv("RNNGRAPH_CHUNK_FRAMES", "many")
    with pytest.raises(RnnGraphError, match="must be a whole number of frames >= 0 .0: no chunks., got 'many'"):
        chunk_frames_setting(None)


def test_graph_modes_chunk_is_each_strategys_measured_one(monkeypatch):
    """Where the backend leaves the chunk to the strategy (None: graph mode without a setting), an
    executor takes the loop strategy's, as measured: whole calls for the scan, 512 frames for the rest."""
    from rnngraph.plan.loops import STRATEGIES
    backend = get_backend("numpy")
    monkeypatch.setattr(backend, "chunk_frames", None)
    for cell, loop, K in (("lstm", "stages", 1024), ("min_gru", "scan", 0), ("sru", "elementwise", 1024)):
        ex = Executor(load_cell(cell, 3, 4), backend, loop=loop)
        assert ex.chunk_frames == STRATEGIES[loop].chunk_frames == K
        assert Executor(load_cell(cell, 3, 4), backend, loop=loop, chunk=7).chunk_frames == 7


@pytest.mark.parametrize("recompute", [False, True])
def test_a_second_backward_of_a_call_in_chunks_is_a_clear_error(recompute):
    """The chunks' stored values share one buffer, which the backward spends (restoring or recomputing each
    chunk's over the others'): a second backward says so instead of differentiating what is left there, and
    the call's arrays are not held after the first."""
    from rnngraph.errors import RnnGraphError
    cell = load_cell("gru", 3, 5)
    ex = Executor(cell, get_backend("numpy"), chunk=K, recompute=recompute)
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(s) for n, s in cell.params.items()}
    x, gy = rng.standard_normal((3 * K + 2, 2, 3)), rng.standard_normal((3 * K + 2, 2, 5))
    ex.forward(params, {"x": x}, {})
    ex.backward({"h": gy})
    assert ex.recomputed == recompute and ex.chunks.cur.arrays == [None] * 4     # x, h, their gradients
    with pytest.raises(RnnGraphError, match="backward.. runs once after a call in chunks"):
        ex.backward({"h": gy})
    ex.forward(params, {"x": x}, {})
    ex.backward({"h": gy})


@pytest.mark.parametrize("delay", [1, 2, 3])
@pytest.mark.parametrize("loop", ["scan", "elementwise", "stages"])
def test_cells_reading_up_to_three_frames_back_in_chunks_and_in_the_ladder(delay, loop):
    """A state read `delay` frames back carries its last `delay` frames across chunk boundaries (the scan's
    chains starting from them), in K chunks and in the ladder, ragged, against whole calls."""
    def cell(D, H, bias=True):
        return one_state(LINEAR_FORMS["a*h + b"], delay=delay, D=D, H=H)
    kw = dict(num_layers=2, bidirectional=True, dtype="float64", seed=5, loop=loop)
    whole, chunked, bounded = (Recurrent(cell, 3, 5, buckets=b, **kw) for b in (False, False, True))
    chunked.backend.chunk_frames = K
    for T in (K + 1, 3 * K + 2, 75):
        rng = np.random.default_rng(T)
        x = rng.standard_normal((T, 3, 3))
        lengths = np.array([T, int(rng.integers(0, T + 1)), max(T - K - 1, 0)])
        state, gy, gstate = call(whole, x, lengths, rng)
        want = run(whole, x, state, lengths, gy, gstate)
        for layer in (chunked, bounded):
            for a, b in zip(run(layer, x, state, lengths, gy, gstate), want, strict=True):
                close(a, b)
            assert layer._stack.runs[0][0].ex.chunked and layer.loop_strategy == loop


def test_most_chunks_bounds_every_shorter_call_tightly():
    for K in (8, 64, 100, 1024):
        for in_ladder in (False, True):
            most = 0
            for T in range(1, 2 * K + 300):
                most = max(most, len(spans(T, K, in_ladder)))
                assert most_chunks(T, K, in_ladder) == most and len(spans(T, K, in_ladder, walks=True)) <= most
    assert most_chunks(0, 8) == 0


def test_the_set_aside_values_of_every_shorter_call_fit_tightly():
    """What a call sets aside is every chunk's values but the last's, the longest (a chunk's weight: its values,
    growing with L, with a part that does not); most_aside is the most any call of at most T frames sets aside,
    walking or not, in the ladder or not."""
    weight = lambda L: 1000 + 7 * L      # noqa: E731
    for K in (8, 64, 100, 1024):
        for in_ladder in (False, True):
            for walks in (False, True):
                most = 0
                for T in range(1, 3 * K + 300):
                    sp = spans(T, K, in_ladder, walks)
                    assert sp[-1][1] == max(L for _, L, _ in sp)
                    most = max(most, sum(weight(L) for _, L, _ in sp[:-1]))
                    assert most_aside(T, K, in_ladder, walks, weight) == most, (K, in_ladder, walks, T)
    assert most_aside(10 ** 6, 1024, True, True, weight) == most_aside(10 ** 6 - 1024, 1024, True, True, weight) + \
        weight(1024)


def test_after_the_longest_call_no_shorter_one_grows_a_buffer():
    """In the ladder, a shorter call may run in more chunks than the longest (T = 300 with K = 1024: 4 chunks,
    T = 255: 7); the cursor and the carried states have room for them, so nothing grows after the longest call
    and, in graph mode, no recording is retired."""
    cell = load_cell("lstm", 3, 5)
    ex = Executor(cell, get_backend("numpy"), chunk=1024)
    params = {n: np.random.default_rng(0).standard_normal(s) for n, s in cell.params.items()}
    x = np.ones((300, 2, 3))

    def go(T):
        ex.forward(params, {"x": x[:T]}, {}, ladder=True)
        ex.backward({"h": np.ones((T, 2, 5))})
        return ex.arenas.generation, ex.arenas.nbytes
    held = go(300)
    assert len(spans(300, 1024, True)) == 4 and len(spans(255, 1024, True)) == 7
    for T in (255, 1, 17, 143, 299, 300, 127):
        assert go(T) == held, T


def test_a_chunk_sets_aside_the_values_its_backward_reads_and_no_others():
    """stash_size, worked out without carving, is the workspace's: a leading span of its value arena that holds
    every value a backward reads (read_back) and, in an LSTM, not the gate sums and products only adds read."""
    from numpy.lib.array_utils import byte_bounds
    from rnngraph.plan.backward import read_back
    from rnngraph.run.workspace import Workspace, stash_size
    for cell in ("lstm", "min_gru", "layernorm_gru", skip_cell):
        sched = build_schedule(load_cell(cell, 3, 5) if isinstance(cell, str) else cell(3, 5))
        kept = read_back(sched.cell)
        for T, B, dtype in ((1, 1, "float64"), (16, 3, "float32"), (1024, 2, "float64")):
            ws = Workspace(sched, get_backend("numpy"), T, B, dtype)
            assert stash_size(sched, T, B, dtype) == ws.stash_size <= ws.val_arena.size
            end = byte_bounds(ws.val_arena[:ws.stash_size])[1]
            for n in sched.cell.graph:
                if n not in sched.cell.params:        # a node's values [P + T, B, F], in the arena
                    assert (byte_bounds(ws.vals[n])[1] <= end) == (n in kept), (cell, n)
    lstm = build_schedule(load_cell("lstm", 3, 5))
    ws = Workspace(lstm, get_backend("numpy"), 16, 3, "float64")
    assert {"i", "f", "g", "o", "c", "h", "x"} <= read_back(lstm.cell) and ws.stash_size < ws.val_arena.size / 3
