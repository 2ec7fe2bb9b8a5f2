"""Row kernels on the GPU (a fused group with a row reduction, one block per row: run/row_kernels.py)
against the numpy float64 reference: rows wider than a block (several features a thread), widths that
are no multiple of 32 (masked lanes), hoisted over all T·B rows and per frame, forward and backward."""
import numpy as np
import pytest

from rnngraph import Cell
from test_gpu_loops import agree, pair

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("hidden", [17, 300])         # gate rows 68 (96 threads, 28 masked) and 1200 (5 a thread)
@pytest.mark.parametrize("mode", ["staged", "graph"])
@pytest.mark.parametrize("cell", ["layernorm_lstm", "layernorm_gru"])
def test_norm_cells_at_row_widths_that_stress_the_block(cell, mode, hidden):
    ref, gpu = pair(cell, "stages", 6, hidden, "float64", mode, num_layers=2, bidirectional=True)
    x = np.random.default_rng(hidden).standard_normal((9, 3, 6))
    agree(ref, gpu, [x], np.array([9, 4, 1]), "float64", f"{cell} H={hidden} {mode} ragged")
    agree(ref, gpu, [x[:5], x[5:]], None, "float64", f"{cell} H={hidden} {mode} chunked")


def rms_sum_cell(D: int, H: int):
    """An RMS norm and a row sum of a parameter-scaled value inside the recurrence: one row group."""
    c = Cell("rms_sum")
    x, h = c.input("x", D), c.state("h", H)
    a = c.linear(x, "W", H) + c.linear(h, "U", H)
    n = c.rms_norm(a, "g")
    c.output(c.bind(h, c.tanh(n + c.sum(n * c.param("s", H)) * 0.01), name="h"))
    return c.build()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_user_cell_with_an_rms_norm_and_a_sum(dtype):
    ref, gpu = pair(rms_sum_cell(7, 333), "stages", 7, 333, dtype, "graph")
    x = np.random.default_rng(2).standard_normal((11, 5, 7))
    agree(ref, gpu, [x], None, dtype, "rms+sum")
