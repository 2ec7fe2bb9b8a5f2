"""The GPU's scan kernels (rnngraph/run/backends/cuda/scan.py) run on the CPU: their CUDA source compiled as C++
with the emulator's prelude (cuda_on_cpu.py), every CUDA thread a std::thread, the blocks one after another (a
block's __shared__ arrays static ones). A backend running the scan loops by them, everything else as numpy does,
gives what numpy's whole calls give: whole calls, chunks of K frames and the ladder, where a chunk walks only its
n frames (the kernels read n from the call's cursor, and leave the frames past it unwritten), ragged, with states
read 1 to 3 frames back, in float64 (1e-10) and float32 (1e-4)."""
import ctypes
import re

import numpy as np
import pytest

from cuda_on_cpu import PRELUDE_2D, compiled, needs_cxx
from rnngraph import load_cell
from rnngraph.plan.loops.scan import ScanLoop, sole_gradient
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cuda import scan as cuda_scan
from rnngraph.run.backends.cuda.backend import CupyBackend
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.run.chunk_plan import spans
from rnngraph.run.executor import Executor
from test_classify import LINEAR_FORMS, one_state
from test_persistent_heads import assert_agree, problem_arrays

pytestmark = needs_cxx

LAUNCH = r"""
extern "C" void rg_launch_NAME(const unsigned long long* a, int gx, int gy, int bx, int by) {
    for (int y = 0; y < gy; ++y)
        for (int x = 0; x < gx; ++x) {
            std::barrier<> bar(bx * by);
            std::vector<std::thread> threads;
            for (int ty = 0; ty < by; ++ty)
                for (int tx = 0; tx < bx; ++tx)
                    threads.emplace_back([=, &bar]() {
                        threadIdx.x = tx; threadIdx.y = ty; blockIdx.x = x; blockIdx.y = y;
                        blockDim.x = bx; blockDim.y = by; rg_block_barrier = &bar;
                        NAME(ARGS);
                    });
            for (auto& t : threads) t.join();
        }
}
"""


def _library(src: str):
    """The kernels of `src` compiled for the CPU, each with a launcher rg_launch_<name>(arguments as 8-byte
    words, grid x, y, block x, y)."""
    text = PRELUDE_2D + src.replace('extern "C" __global__ void', "static void").replace("__shared__", "static")
    for name, params in re.findall(r'extern "C" __global__ void (\w+)\((.*?)\)\s*\{', src, re.S):
        types = [" ".join(p.split()[:-1]).replace("__restrict__", "") for p in params.split(",")]
        args = ", ".join(f"({t})a[{k}]" if "*" in t else f"({t})(long long)a[{k}]" for k, t in enumerate(types))
        text += LAUNCH.replace("NAME", name).replace("ARGS", args)
    return compiled(text)


class _Kernel:
    """A compiled kernel called as cupy calls a RawKernel: kernel(grid, block, args); a part or out kernel given
    a chunk's cursor records the frames it walks there (the running chunk's n) in be.walked."""

    def __init__(self, be, name, fn):
        self.be, self.name, self.fn = be, name, fn

    def __call__(self, grid, block, args):
        grid, block = (tuple(v) + (1,) * (2 - len(v)) for v in (np.atleast_1d(grid), np.atleast_1d(block)))
        words = [a.ctypes.data if isinstance(a, np.ndarray) else int(a) % 2 ** 64 for a in args]
        cur = next((k for k, a in enumerate(args) if a is self.be.cursor), None)
        if cur is not None and "_carry_" not in self.name:
            c, tab = args[cur], int(args[cur + 1])
            self.be.walked.append(int(c[tab + 3 * c[0] + 1]))
        self.fn((ctypes.c_ulonglong * len(words))(*words), *map(int, grid), *map(int, block))


class ScanKernels(NumpyBackend):
    """numpy, with the scan loops run by the GPU's scan kernels compiled for the CPU; `walked` lists the frames
    each part or out kernel of a chunk walked."""
    name = "scan-kernels"
    kernel_loops = walking_loops = frozenset({"scan"})
    RUNNERS = {ScanLoop: cuda_scan}
    frame_args = CupyBackend.frame_args

    def __init__(self):
        super().__init__("staged")
        self.walked, self.cursor = [], None

    def running_args(self, running):
        self.cursor = running[0] if running else None
        return CupyBackend.running_args(self, running)

    def raw(self, name, src):
        return _Kernel(self, name, getattr(_library(src), f"rg_launch_{name}"))


def delayed(delay):
    """A cell of one state s = a ⊙ s@t-delay + b (test_classify.one_state)."""
    return lambda D, H, bias=True: one_state(LINEAR_FORMS["a*h + b"], delay=delay, D=D, H=H)


def launches(chunks, B, cell) -> list:
    """The frames each part and out kernel walks over a call's chunks, forward then backward: a chunk's n, once
    for out and once more for part where a chain has more than one chunk of frames (scan_chunks)."""
    (_, m, _, _, d), = scan_chains(cell)
    per = [1 + (cuda_scan.scan_chunks(L, d, B * cell.op(m).size)[0] > 1) for _, L, _ in chunks]
    fwd = [n for (_, _, n), k in zip(chunks, per) for _ in range(k)]
    bwd = [n for (_, _, n), k in zip(reversed(chunks), reversed(per)) for _ in range(k)]
    return fwd + bwd


def scan_chains(cell) -> tuple:
    """The forward scan's chains (p, m, a, b, d) as the scheduler plans them."""
    return Executor(cell, get_backend("numpy"), loop="scan").sched.forward[1].items[0].chains


def results(ex, cell, x, params, init, lengths, gy, gf, ladder=False):
    """Outputs (up to each sequence's length), final states and every gradient of one forward and backward."""
    T = x.shape[0]
    inside = (np.arange(T)[:, None] < (np.full(x.shape[1], T) if lengths is None else lengths)[None, :])[..., None]
    outs, fins = ex.forward(params, {"x": x}, init, lengths, ladder=ladder)
    out = [outs[cell.outputs[0]] * inside, *(fins[s].copy() for s in sorted(fins))]
    gx, g0, gp = ex.backward({cell.outputs[0]: gy * inside}, gf)
    return out + [gx["x"].copy(), *(g0[s].copy() for s in sorted(g0)), *(gp[n].copy() for n in sorted(gp))]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", ["min_gru", "min_lstm", "qrnn", "delay 2", "delay 3"])
def test_the_scan_kernels_compute_the_reference(name, dtype):
    """Whole calls and chunks of 8 frames (T = 21: two chunks of 8 and the rest, 5 frames, a chunk of its own
    length), ragged."""
    make = delayed(int(name[-1])) if name.startswith("delay") else None
    cell = make(3, 4) if make else load_cell(name, 3, 4)
    for chunk, T in ((None, 13), (8, 21)):
        be = ScanKernels()
        ex = Executor(cell, be, loop="scan", chunk=chunk)
        ref = Executor(cell, get_backend("numpy"), loop="scan")
        params, x, init, gy, gf = problem_arrays(cell, T, 3, dtype)
        lengths = np.array([T, T // 2, 1])
        assert_agree(results(ex, cell, x, params, init, lengths, gy, gf),
                     results(ref, cell, x, params, init, lengths, gy, gf), dtype)
        assert ex.sched.loop_strategy == "scan" and ex.chunked == (chunk is not None)
        assert be.walked == launches(spans(T, chunk), 3, cell) if chunk else not be.walked


@pytest.mark.parametrize("ctype", ["float", "double"])
def test_the_scan_kernels_compile_for_the_gpu(ctype):
    """Each direction's three kernels, compiled by NVRTC for sm_90 (half storage: test_half_kernels)."""
    from nvrtc import nvrtc_compile
    for direction in ("fwd", "bwd"):
        src, names = cuda_scan.scan_source(direction, ctype)
        for name in names.values():
            nvrtc_compile(src, name)


@pytest.mark.parametrize("T", [60, 130, 7])
def test_a_chunk_of_the_ladder_walks_only_its_frames(T):
    """A ladder of 64 and 16 frames: T = 60 is one chunk of 64 walking 60, T = 130 two of 64 and one of 16
    walking 2, T = 7 one of 16 walking 7; each part and out kernel reads its chunk's n, forward then backward;
    a call of one chunk leaves the frames past n unwritten (zeros in a new workspace), and the product a ⊙ s@t-d,
    which nothing else reads, unstored; results equal numpy's whole calls, ragged."""
    cell = load_cell("min_gru", 3, 4)
    be = ScanKernels()
    ex = Executor(cell, be, loop="scan", chunk=64)
    ref = Executor(cell, get_backend("numpy"), loop="scan")
    params, x, init, gy, gf = problem_arrays(cell, T, 3, "float64")
    lengths = np.array([T, T // 2, 1])
    got = results(ex, cell, x, params, init, lengths, gy, gf, ladder=True)
    assert_agree(got, results(ref, cell, x, params, init, lengths, gy, gf), "float64")
    chunks = spans(T, 64, True, walks=True)
    assert ex._walks(3, np.float64) and be.walked == launches(chunks, 3, cell)
    if len(chunks) > 1:             # chunks share their workspaces' memory: an earlier one's frames are there
        return
    _, L, n = chunks[0]
    ws = ex.workspace(L, 3, np.dtype("float64"), chunk=True)
    (p, m, _, _, _), = scan_chains(cell)                   # the state, written per frame; its product a ⊙ s@t-d
    assert np.all(ws.frames(ws.vals[p])[n:] == 0) and np.all(ws.frames(ws.vals[p])[:n, 0] != 0)
    assert cuda_scan.unstored(cell, ScanLoop(scan_chains(cell), False)) == {m} and not np.any(ws.vals[m])


@pytest.mark.parametrize("name", ["min_gru", "min_lstm", "qrnn"])
def test_the_coefficients_gradients_the_backward_scan_writes_whole_are_left_unzeroed(name):
    """The backward scan writes the gradient of a coefficient it alone reads (has_ga / has_gb 2) and never reads
    that of a product no other reader sends (gm_in 0): loop_stores names them, the zeroing leaves their buffers
    (and the caller's output frames, copied in whole) as they are, and a backward on an arena poisoned with NaN
    gives what numpy's whole calls give."""
    cell = load_cell(name, 3, 4)
    be = ScanKernels()
    ex = Executor(cell, be, loop="scan")
    ref = Executor(cell, get_backend("numpy"), loop="scan")
    params, x, init, gy, gf = problem_arrays(cell, 13, 3, "float64")
    results(ex, cell, x, params, init, None, gy, gf)           # the first backward notes what needs no zeroing
    loop = next(it for it in ex.sched.backward[1].items)
    stored = be.loop_stores(cell, loop)
    assert stored == {n for p, m, a, b, _ in loop.chains for n, r in ((a, m), (b, p), (m, p))
                      if sole_gradient(cell, n, r)}
    assert stored and stored <= set(cell.graph) - set(cell.outputs) - set(cell.params)
    ws = ex.workspace(13, 3, np.dtype("float64"))
    outputs = frozenset(cell.outputs)
    ws.grad_arena[...] = np.nan
    ws.zero_grads(be, outputs)
    poisoned = {n for n, g in ws.grads.items() if np.isnan(g).any()}
    assert poisoned == stored | outputs
    for o in cell.outputs:          # only the frames the caller's copy fills: any history rows are zeroed
        assert np.isnan(ws.frames(ws.grads[o])).all() and not np.isnan(ws.grads[o][:ws.P]).any()
    ex.forward(params, {"x": x}, init)
    ws.grad_arena[...] = np.nan
    got = results(ex, cell, x, params, init, None, gy, gf)
    assert_agree(got, results(ref, cell, x, params, init, None, gy, gf), "float64")
