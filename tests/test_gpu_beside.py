"""The GEMM gradients after the persistent backward, on a side stream beside it (persistent/beside.py): against the
numpy float64 reference, against the same layer with nothing beside the loop (half: the same bits but for the
weights' gradients, summed in float32 over the spans), bit for bit the same on every run, in graph and staged mode."""
import numpy as np
import pytest

from rnngraph.run.workspace import BESIDE
from test_gpu_loops import agree, calls, pair

pytestmark = pytest.mark.gpu


def beside(layer) -> set:
    """The item kinds that ran beside a backward loop in any of the layer's executors."""
    return {type(it).__name__ for run in layer._stack.runs for r in run for it in r.ex.ws.memo.get(BESIDE, ())}


@pytest.mark.parametrize("mode", ["graph", "staged"])
@pytest.mark.parametrize("cell, B, H", [("lstm", 8, 64), ("gru", 16, 96), ("mgu", 4, 48), ("peephole_lstm", 3, 32)])
def test_the_reference_in_float32(cell, B, H, mode):
    ref, gpu = pair(cell, "persistent", 5, H, "float32", mode, num_layers=2, bidirectional=True)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((T, B, 5)) for T in (33, 1, 9)]
    agree(ref, gpu, xs, np.arange(B) % 33 + 1, "float32", f"{cell} {mode}")
    assert beside(gpu) == {"GemmGrad", "WeightGrad"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_beside_equals_after_and_repeats_its_bits(dtype, monkeypatch):
    """LSTM T = 200, B = 16, H = 256: every array as with the GEMMs after the loop (SPARE_SMS beyond the GPU's), up
    to the GEMMs' sums in another order (cuBLAS tiles a span's rows its own way; half: a rounding apart); and two
    calls give the same bits."""
    import cupy
    from rnngraph.nn.recurrent import Recurrent
    from rnngraph.run.backends.cuda.persistent import beside as module
    x = np.random.default_rng(0).standard_normal((200, 16, 32))

    def run(spare):
        monkeypatch.setattr(module, "SPARE_SMS", spare)
        layer = Recurrent("lstm", 32, 256, backend="cupy", mode="graph", dtype=dtype, loop="persistent", seed=2)
        return layer, [calls(layer, [x], None, cupy, dtype) for _ in range(2)]
    on, (a, a2) = run(16)
    off, (b, _) = run(10 ** 6)
    assert beside(on) == {"GemmGrad", "WeightGrad"} and not beside(off)
    bound = 1e-5 if dtype == "float32" else 1e-2
    for k, (u, u2, v) in enumerate(zip(a, a2, b, strict=True)):
        assert np.array_equal(u, u2), f"array {k} differs between two runs"
        err = np.linalg.norm(u - v) / max(np.linalg.norm(v), 1e-300)
        assert err <= bound, f"array {k}: relative difference {err:.1e} > {bound:.0e}"
