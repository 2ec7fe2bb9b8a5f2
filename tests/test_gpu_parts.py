"""Per-frame products in parts on the GPU (run/backends/cuda/split.py): in half storage, stages' d-operand product
over a long reduction (M = 3H or 4H ≥ 2048) runs as float32 parts that the next frame's fused backward kernel adds,
or, for a row kernel, the kernel adding parts. Against the CPU half-precision reference (the bounds of
test_gpu_half.py: the parts add in float32 before the one rounding, which only moves a rounding), staged and graph
mode, ragged and chunked calls, B a multiple of 16 or not; two runs give bit-identical results. A reader that
cannot add parts (a row kernel: layernorm_lstm) gets none."""
import numpy as np
import pytest

from rnngraph.arrays import float_dtype
from rnngraph.plan.items import GemmGrad
from test_gpu_half import agree, half_pair
from test_gpu_loops import calls

pytestmark = pytest.mark.gpu


def parts_made(layer) -> int:
    """The frames whose product ran in parts, over the layer's executors' workspaces."""
    return sum(bool(v) for run in layer._stack.runs for r in run for w in r.ex._ws.values()
               for k, v in w.memo.items() if isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], tuple)
               and k[0][0] == "parts" and isinstance(k[0][1], GemmGrad) and isinstance(k[1], int))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", ["staged", "graph"])
@pytest.mark.parametrize("cell, hidden", [("lstm", 512), ("gru", 768), ("peephole_lstm", 512)])
@pytest.mark.parametrize("B", [16, 100])
def test_products_in_parts_match_the_cpu_half_reference(cell, hidden, mode, dtype, B):
    ref, gpu = half_pair(cell, dtype, mode, hidden=hidden, size=32, loop="stages")
    x = np.random.default_rng(B).standard_normal((9, B, 32))
    lengths = np.maximum(1, np.arange(B) % 10)
    agree(ref, gpu, [x], lengths, dtype, f"{cell}/{mode}/B={B} ragged")
    agree(ref, gpu, [x[:4], x[4:]], None, dtype, f"{cell}/{mode}/B={B} chunked")
    assert parts_made(gpu) > 0


def test_products_in_parts_are_bit_identical_run_to_run():
    _, gpu = half_pair("lstm", "bfloat16", "graph", hidden=512, size=32, loop="stages")
    import cupy
    x = np.random.default_rng(0).standard_normal((12, 64, 32))
    dt = float_dtype("bfloat16", half=True)
    first, second = (calls(gpu, [x], None, cupy, dt) for _ in range(2))
    assert parts_made(gpu) > 0
    for a, b in zip(first, second, strict=True):
        assert np.array_equal(a, b)


def test_a_row_kernel_reader_gets_no_parts():
    _, gpu = half_pair("layernorm_lstm", "bfloat16", "graph", hidden=512, size=32, loop="stages")
    import cupy
    calls(gpu, [np.random.default_rng(0).standard_normal((5, 16, 32))], None, cupy, float_dtype("bfloat16", half=True))
    assert parts_made(gpu) == 0
