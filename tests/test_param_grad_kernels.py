"""The CUDA kernels summing a vector parameter's gradient over all rows (run/backends/cuda/param_grad.py), run on
the CPU: their source compiled as C++ with the emulator's prelude (cuda_on_cpu.py), every CUDA thread a std::thread,
the blocks one after another (so a block's __shared__ array is a static one), against numpy in float64. Few rows
run one kernel into out; many run in chunks of rows into a buffer of partial sums, which the second kernel adds."""
import ctypes

import numpy as np
import pytest

from cuda_on_cpu import PRELUDE_2D, compiled, needs_cxx
from rnngraph import load_cell
from rnngraph.run.backends.cuda.param_grad import LANES, chunks, param_grad_kernel, sum_source

LAUNCH = r"""
extern "C" void rg_launch(void** p, long long* ld, int N, int F, int L, void* part, void* out, int R, int gx, int gy,
                          int bx, int by, int sum) {
    for (int y = 0; y < gy; ++y)
        for (int x = 0; x < gx; ++x) {
            std::barrier<> bar(bx * by);
            std::vector<std::thread> threads;
            for (int ty = 0; ty < by; ++ty)
                for (int tx = 0; tx < bx; ++tx)
                    threads.emplace_back([=, &bar]() {
                        threadIdx.x = tx; threadIdx.y = ty; blockIdx.x = x; blockIdx.y = y;
                        blockDim.x = bx; blockDim.y = by; rg_block_barrier = &bar;
                        if (sum) SUM_CALL; else KERNEL_CALL;
                    });
            for (auto& t : threads) t.join();
        }
}
"""


def built(name: str, source: str, operands: int):
    """The launcher of pgrad kernel `name` (operands: its G, A…, Y arrays) and of the chunks' sum, in double."""
    call = ", ".join(f"(const double*)p[{k}], ld[{k}]" for k in range(operands))
    text = PRELUDE_2D + \
        (source + sum_source("double")).replace('extern "C" __global__ void', "static void").replace(
            "__shared__", "static") + \
        LAUNCH.replace("KERNEL_CALL", f"{name}({call}, (double*)out, N, F, L, (double*)part)").replace(
            "SUM_CALL", "rg_pgrad_sum_double((const double*)part, R, F, (double*)out)")
    lib = compiled(text)
    lib.rg_launch.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong)] + \
        [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 6
    return lib


def run(cell, n, slot, arrays, out):
    """out [F] += the term's sum over the rows of arrays (G, each operand, Y: [N, F], or a parameter [F]), launched
    as the cupy backend launches it: one kernel where chunks() gives one chunk, else the chunks and their sum."""
    name, source = param_grad_kernel(cell, n, slot, "double")
    lib = built(name, source, len(arrays))
    N, F = arrays[0].shape[0], out.shape[0]
    R, L = chunks(N, F)
    part = np.full((R, F), np.nan) if R > 1 else None
    p = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    ld = (ctypes.c_longlong * len(arrays))(*[0 if a.ndim == 1 else a.strides[0] // 8 for a in arrays])
    args = (p, ld, N, F, L, None if part is None else part.ctypes.data, out.ctypes.data, R)
    lib.rg_launch(*args, (F + 31) // 32, R, 32, LANES, 0)
    if part is not None:
        lib.rg_launch(*args, (F + 255) // 256, 1, 256, 1, 1)
    return R


@needs_cxx
@pytest.mark.parametrize("N, F", [(7, 5), (300, 40), (6400, 40), (1000, 33)])
def test_a_bias_gradient_sums_its_rows(N, F):
    """The LSTM's b_hi: out += Σ_n G[n]; N = 6400 in 26 chunks of 247 rows (one block each per 32 features)."""
    cell = load_cell("lstm", 3, F)
    n = next(n for n in cell.graph if "b_hi" in [u for u, _ in cell.reads(n)])
    slot = [u for u, _ in cell.reads(n)].index("b_hi")
    rng = np.random.default_rng(N)
    g = rng.standard_normal((N, F))
    operands = [rng.standard_normal((N, F)) if u != "b_hi" else rng.standard_normal(F) for u, _ in cell.reads(n)]
    out = rng.standard_normal(F)
    want = out + g.sum(axis=0)
    R = run(cell, n, slot, [g, *operands, rng.standard_normal((N, F))], out)
    assert R == chunks(N, F)[0] and (R > 1) == (N > 256)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@needs_cxx
def test_a_diagonal_weight_gradient_reads_its_other_operand():
    """The peephole LSTM's p_i ⊙ c: out += Σ_n G[n] ⊙ c[n], over 3000 rows in chunks."""
    cell = load_cell("peephole_lstm", 3, 24)
    n, slot = next((n, [u for u, _ in cell.reads(n)].index(p)) for n in cell.graph for p in cell.params
                   if cell.params[p] == (24,) and p in [u for u, _ in cell.reads(n)] and cell.op(n).kind.value == "mul")
    rng = np.random.default_rng(0)
    reads = [u for u, _ in cell.reads(n)]
    g = rng.standard_normal((3000, 24))
    operands = [rng.standard_normal(24) if u in cell.params else rng.standard_normal((3000, 24)) for u in reads]
    other = operands[1 - slot]
    out = np.zeros(24)
    assert run(cell, n, slot, [g, *operands, rng.standard_normal((3000, 24))], out) > 1
    np.testing.assert_allclose(out, (g * other).sum(axis=0), rtol=1e-12, atol=1e-12)
