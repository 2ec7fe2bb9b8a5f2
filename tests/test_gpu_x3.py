"""Products over all frames in 3xTF32 on the GPU (rnngraph/run/backends/cuda/x3.py): cuBLAS's TF32 GEMMs on the
split operands within 3xTF32's bound of float64, in both forms, whole and in panels, and a product's two gradients
from one split of its output gradient; graph mode records them and its replays follow new values; a float32
training step in graph mode with them on agrees with them off to the bound of float32 on CUDA cores."""
import numpy as np
import pytest

from rnngraph.nn import Recurrent
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cuda import x3

pytestmark = pytest.mark.gpu

# (ta, tb), a, b, out: minGRU's three products at T = 4096, B = 1, H = D = 512
# (a weight gradient alone, tn, stays one float32 GEMM: x3.FORMS)
FORMS = [((False, True), (4096, 512), (1024, 512), (4096, 1024)),
         ((False, False), (4096, 1024), (1024, 512), (4096, 512))]


@pytest.mark.parametrize("form", FORMS, ids=["nt", "nn"])
@pytest.mark.parametrize("elements", [None, 1 << 20])
def test_3xtf32_products_on_cublas_are_within_their_bound(form, elements, monkeypatch):
    import cupy
    (ta, tb), sa, sb, so = form
    if elements:            # panels of 1024 or 2048 rows
        monkeypatch.setattr(x3, "SPLIT_ELEMENTS", elements)
    be = get_backend("cupy", "staged")
    rng = np.random.default_rng(0)
    a, b, out0 = (rng.standard_normal(s) for s in (sa, sb, so))
    a32, b32 = cupy.asarray(a, cupy.float32), cupy.asarray(b, cupy.float32)
    assert x3.applies(be, a32, b32, cupy.empty(so, cupy.float32), ta, tb)
    a64, b64 = a32.astype(cupy.float64), b32.astype(cupy.float64)
    op = lambda m, t: m.T if t else m
    size = cupy.abs(op(a64, ta)) @ cupy.abs(op(b64, tb)) + cupy.abs(cupy.asarray(out0))
    for accumulate in (False, True):
        out = cupy.asarray(out0, cupy.float32)
        be.gemm_frames(a32, b32, out, ta=ta, tb=tb, accumulate=accumulate)
        want = op(a64, ta) @ op(b64, tb) + (cupy.asarray(out0) if accumulate else 0)
        assert float((cupy.abs(out - want) / size).max()) <= 2.0 ** -18


@pytest.mark.parametrize("shape", [(4096, 1024, 512), (4096, 1536, 512)], ids=["min_gru", "min_lstm"])
@pytest.mark.parametrize("elements", [None, 1 << 20])
def test_both_gradients_share_the_output_gradients_parts(shape, elements, monkeypatch):
    """gx (+)= g · w and gw += gᵀ · x through x3.grads (g split once for both), whole and in panels (512 or 682
    rows), within 3xTF32's bound of float64."""
    import cupy
    N, M, K = shape
    if elements:
        monkeypatch.setattr(x3, "SPLIT_ELEMENTS", elements)
    shared, grads = [], x3.grads
    monkeypatch.setattr(x3, "grads", lambda *a: shared.append(grads(*a)) or shared[-1])
    be = get_backend("cupy", "staged")
    rng = np.random.default_rng(1)
    g, w, x = (cupy.asarray(rng.standard_normal(s), cupy.float32) for s in ((N, M), (M, K), (N, K)))
    gx0, gw0 = (cupy.asarray(rng.standard_normal(s), cupy.float32) for s in ((N, K), (M, K)))
    g64, w64, x64 = (a.astype(cupy.float64) for a in (g, w, x))
    for accumulate in (False, True):
        gx, gw = gx0.copy(), gw0.copy()
        be.gemm_grads_frames(g, w, x, gx, gw, accumulate=accumulate)
        for got, want, size in ((gx, g64 @ w64 + (gx0 if accumulate else 0), abs(g64) @ abs(w64) + abs(gx0)),
                                (gw, g64.T @ x64 + gw0, abs(g64.T) @ abs(x64) + abs(gw0))):
            assert float((cupy.abs(got - want) / size).max()) <= 2.0 ** -18
    assert shared == [True, True]


def test_graph_mode_records_them_and_its_replays_follow_new_values():
    """minGRU T = 4096, B = 1, H = 512 in graph mode (its input product and both gradients' in 3xTF32) against
    the same layer with them off (RNNGRAPH_GEMM_3XTF32=0: float32 on CUDA cores), two calls of new x."""
    import cupy

    def run():
        layer = Recurrent("min_gru", 512, 512, backend=get_backend("cupy", "graph"), dtype="float32", seed=1)
        outs = []
        for seed in (1, 2, 3):
            x = cupy.asarray(np.random.default_rng(seed).standard_normal((4096, 1, 512)), cupy.float32)
            y, _ = layer(x)
            gx, _, grads = layer.backward(cupy.ones_like(y))
            outs.append([y.copy(), gx.copy(), *(g.copy() for g in grads.values())])
        return outs, layer.backend.cache_info()["graphs"]

    on, graphs = run()
    assert graphs == 2
    mp = pytest.MonkeyPatch()
    mp.setenv("RNNGRAPH_GEMM_3XTF32", "0")
    try:
        off, _ = run()
    finally:
        mp.undo()
    for call_on, call_off in zip(on, off):
        for a, b in zip(call_on, call_off):
            assert float(cupy.abs(a - b).max() / cupy.abs(b).max()) <= 1e-5
