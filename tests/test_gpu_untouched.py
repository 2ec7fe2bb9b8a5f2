"""The gradients a GPU backward never needs zeroed (Workspace.note_untouched, through CupyBackend.backward_spec):
NaN written into them (and into the frames of the outputs' gradients, which the caller's are copied over) after
the first backward changes no result, bit for bit, for every loop strategy's kernels
(the persistent loop's in float, half and on tensor cores, per head, stages' per-frame kernels, the scan and the
elementwise loop beside hoisted groups), ragged lengths, stacked and bidirectional layers, staged and graph mode;
and they are most of an LSTM's arena."""
import numpy as np
import pytest

from rnngraph.nn.recurrent import Recurrent
from rnngraph.run.workspace import PADDED, UNTOUCHED

pytestmark = pytest.mark.gpu

# (cell, loop, dtype, B, H, options)
CASES = [("lstm", "persistent", "float32", 8, 64, {}), ("lstm", "persistent", "bfloat16", 64, 128, {}),
         ("lstm", "persistent", "float16", 16, 256, {}), ("lstm", "stages", "float32", 8, 64, {}),
         ("lstm", "stages", "bfloat16", 256, 64, {}), ("gru", "persistent", "bfloat16", 64, 128, {}),
         ("mgu", "persistent", "float32", 3, 64, {}), ("peephole_lstm", "persistent", "float64", 5, 32, {}),
         ("layernorm_lstm", "auto", "float32", 4, 32, {}), ("slstm", "persistent", "bfloat16", 8, 128, {"heads": 4}),
         ("mh_lstm", "persistent", "float32", 4, 64, {"heads": 4}), ("min_gru", "scan", "float32", 1, 64, {}),
         ("min_gru", "elementwise", "float64", 2, 32, {}), ("qrnn", "scan", "float32", 3, 48, {}),
         ("sru", "elementwise", "float32", 2, 32, {})]


def step(layer, x, gy, lengths):
    """Outputs, finals and every gradient of one forward and backward, as numpy arrays."""
    y, fin = layer(x, None, lengths)
    gx, g0, grads = layer.backward(gy)
    flat = lambda a: [v for b in a for v in flat(b)] if isinstance(a, tuple) else [a]
    return [a.get() for a in (y, *flat(fin), gx, *flat(g0), *(grads[n] for n in sorted(grads)))]


def poison(layer) -> float:
    """NaN into every span of every executor's gradient arena that its backward does not zero, and into the
    frames of its outputs' gradients, which the caller's gradients are copied over; the share of the arenas'
    elements the spans hold."""
    spans, total = 0, 0
    for run in layer._stack.runs:
        for r in run:
            ws = r.ex.ws
            for a, b in ws.memo[UNTOUCHED]:
                ws.grad_arena[a:b] = np.nan
                spans += b - a
            for o in r.ex.cell.outputs:
                ws.frames(ws.grads[o])[...] = np.nan
            total += ws.grad_arena.size
    return spans / total


@pytest.mark.parametrize("mode", ["graph", "staged"])
@pytest.mark.parametrize("cell, loop, dtype, B, H, options", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-B{c[3]}" for c in CASES])
def test_nan_in_the_unzeroed_gradients_changes_nothing(cell, loop, dtype, B, H, options, mode):
    import cupy
    T, D = 9, 16
    layer = Recurrent(cell, D, H, backend="cupy", mode=mode, dtype=dtype, loop=loop, seed=1, num_layers=2,
                      bidirectional=True, **options)
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((T, B, D))).astype(dtype)
    gy = cupy.asarray(rng.standard_normal((T, B, 2 * H))).astype(dtype)
    lengths = cupy.asarray(rng.integers(1, T + 1, B)).astype("int64") if B > 1 else None
    first = step(layer, x, gy, lengths)
    share = poison(layer)
    second = step(layer, x, gy, lengths)
    for k, (a, b) in enumerate(zip(first, second, strict=True)):
        assert np.array_equal(a, b), f"array {k}: {np.isnan(b.astype(np.float64)).sum()} NaN"
    if cell == "lstm" and loop == "persistent" and layer.loop_strategy == "persistent":
        assert share > 0.3, f"only {share:.0%} of an LSTM's gradient arenas left unzeroed"


@pytest.mark.parametrize("cell, loop", [("lstm", "persistent"), ("min_gru", "elementwise"), ("min_gru", "scan"),
                                        ("lstm", "stages")])
@pytest.mark.parametrize("mode", ["graph", "staged"])
def test_nan_in_the_unzeroed_gradients_of_chunks_changes_nothing(cell, loop, mode):
    """Calls in the ladder's chunks (64, 16): T = 130 runs one chunk of 16 walking 2 frames, whose loop kernels then
    store whole only the rows before 2 (Workspace.zero_grads, walked: the persistent loop and the scan store some
    gradients whole, so their padded chunks zero those from row 2 on), and two of 64. NaN into every span a full
    chunk leaves unzeroed, in every chunk's workspace, changes nothing in the next call, bit for bit, ragged too."""
    import cupy
    layer = Recurrent(cell, 3, 16, backend="cupy", mode=mode, dtype="float32", loop=loop, seed=1, buckets=True)
    layer.backend.chunk_frames = 64
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((130, 4, 3))).astype("float32")
    gy = cupy.asarray(rng.standard_normal((130, 4, 16))).astype("float32")
    for lengths in (None, cupy.asarray([130, 65, 2, 1])):
        first = step(layer, x, gy, lengths)
        ex = layer._stack.runs[0][0].ex
        assert ex.chunked and ex.chunks.K == 64
        chunk_ws = [ws for (_, _, _, chunk), ws in ex._ws.items() if chunk and UNTOUCHED in ws.memo]
        assert {ws.T for ws in chunk_ws} == {64, 16}
        if loop in ("persistent", "scan") and layer.loop_strategy == loop:     # kernels that walk and store
            assert all(ws.memo[PADDED] for ws in chunk_ws), "no gradient zeroed only past the frames walked"
        for ws in chunk_ws:
            for a, b in ws.memo[UNTOUCHED]:
                ws.grad_arena[a:b] = np.nan
        second = step(layer, x, gy, lengths)
        for k, (a, b) in enumerate(zip(first, second, strict=True)):
            assert np.array_equal(a, b), f"array {k}: {np.isnan(b.astype(np.float64)).sum()} NaN"
