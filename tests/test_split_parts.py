"""Per-frame d-operand products in parts (run/backends/cuda/split.py): a product dh@t-1 += g · W at frame t may
run as S float32 parts over slices of W's rows, which its reader at frame t - 1 (plan.backward.next_frame_readers)
adds in order. On the CPU: which products have a reader, the executor's hand-over (a numpy backend that makes parts
and whose fused kernels cannot add them, so the executor adds them first) against the plain backend in float64, the
rule choosing S, and the generated sources: a fused backward kernel adding its parts, and the kernel adding parts
for any other reader, compiled with NVRTC for sm_90."""
import numpy as np
import pytest

from nvrtc import nvrtc_compile
from rnngraph import CELLS, build_schedule, load_cell
from rnngraph.plan.backward import next_frame_readers
from rnngraph.plan.items import FusedGrad, GemmGrad
from rnngraph.run.backends.cuda.fused import KernelSpec
from rnngraph.run.backends.cuda.rows import group_kernel
from rnngraph.run.backends.cuda.split import ADD_PARTS, parts_for, with_parts
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.run.executor import Executor


class PartsBackend(NumpyBackend):
    """The numpy reference, but every per-frame product with a reader runs in S parts (its reader adds them)."""

    S = 4

    def __init__(self):
        super().__init__("staged")
        self.made, self.buffers = 0, set()

    def product_parts(self, g, w, cell, reader, node, parts=None):      # g [B, M], w [M, K]
        S, L = self.S, g.shape[1] // self.S
        parts = np.full((S, g.shape[0], w.shape[1]), np.nan) if parts is None else parts
        self.made += 1
        self.buffers.add(id(parts))

        def run(grid, block, args):
            for s in range(S):
                parts[s] = g[:, s * L:(s + 1) * L] @ w[s * L:(s + 1) * L]
        return ((run, None, None, None),), parts


def loop_cells():
    """The built-in cells whose backward loop has a per-frame product of a delay-1 operand (a GEMM core)."""
    return [c for c in sorted(CELLS) if next_frame_readers(build_schedule(load_cell(c, 8, 16), loop="stages"))]


def test_each_product_of_a_state_read_one_frame_back_has_its_group_as_reader():
    sched = build_schedule(load_cell("lstm", 8, 16), loop="stages")
    (step, reader), = next_frame_readers(sched).items()
    assert isinstance(step, GemmGrad) and isinstance(reader, FusedGrad)
    assert step.item.operand == "h" and step.item.delay == 1 and "h" in reader.item.nodes
    assert set(loop_cells()) >= {"lstm", "gru", "mgu", "peephole_lstm", "rnn_tanh"}
    # the elementwise loops have no per-frame product
    assert not next_frame_readers(build_schedule(load_cell("min_gru", 8, 16), loop="elementwise"))


def test_products_in_parts_across_chunks_equal_a_whole_call():
    """In chunks of 4 frames each chunk's first frame adds its product into the history row the next chunk carries."""
    c = load_cell("lstm", 8, 16)
    rng = np.random.default_rng(1)
    params = {n: rng.standard_normal(s) * 0.3 for n, s in c.params.items()}
    x, gy = rng.standard_normal((10, 2, 8)), rng.standard_normal((10, 2, 16))
    results = []
    for be, chunk in ((NumpyBackend("staged"), 0), (PartsBackend(), 4)):
        ex = Executor(c, be, loop="stages", chunk=chunk)
        ys, _ = ex.forward(params, {"x": x}, {})
        gin, ginit, gp = ex.backward({"h": gy})
        results.append([*(np.array(a) for a in ys.values()), *(np.array(a) for a in gin.values()),
                        *(np.array(a) for a in ginit.values()), *(np.array(gp[n]) for n in sorted(gp))])
    assert ex.chunked and be.made == 3 + 1      # decided once a workspace: 4 frames (two chunks), 2 frames (one)
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cell", loop_cells())
def test_products_left_to_their_reader_equal_the_products_added_in_place(cell):
    """float64: the parts, added by the executor before the reader's reference, change only the summation order."""
    c = load_cell(cell, 8, 16)
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(s) * 0.3 for n, s in c.params.items()}
    x = rng.standard_normal((6, 3, 8))
    gy = {o: rng.standard_normal((6, 3, c.op(o).size)) for o in c.outputs}
    results = []
    for be in (NumpyBackend("staged"), PartsBackend()):
        ex = Executor(c, be, loop="stages")
        ys, _ = ex.forward(params, {"x": x}, {}, lengths=np.array([6, 4, 1]))
        gin, ginit, gp = ex.backward(gy)
        results.append([*ys.values(), *gin.values(), *ginit.values(), *(gp[n] for n in sorted(gp))])
    assert be.made == 5 * len(next_frame_readers(ex.sched))     # frames 5 .. 1; frame 0 adds into the history row
    assert len(be.buffers) == len(next_frame_readers(ex.sched))     # one buffer of parts serves every frame
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_the_parts_rule():
    assert parts_for(64, 4096, "bfloat16") == 8 and parts_for(256, 4096, "float16") == 4
    assert parts_for(128, 2048, "bfloat16") == 4 and parts_for(256, 3072, "bfloat16") == 3
    assert parts_for(64, 4096, "float32") == 0 and parts_for(64, 1024, "bfloat16") == 0
    for B in (1, 16, 64, 100, 128, 256):
        for M in range(2048, 8193, 8):
            S = parts_for(B, M, "bfloat16")
            assert S == 0 or (2 <= S <= 8 and M % S == 0 and (M // S) % 8 == 0)


def _lstm_backward():
    c = load_cell("lstm", 8, 16)
    sched = build_schedule(c, loop="stages")
    (_, reader), = next_frame_readers(sched).items()
    return c, reader, group_kernel(c, reader.item.nodes, "bwd")


def test_a_fused_backward_kernel_adds_its_parts_in_order_and_compiles():
    c, reader, spec = _lstm_backward()
    made = with_parts(spec, {"h": 3})
    (nm, S), = made.parts
    assert S == 3 and made.args("rg_bf16").endswith(f"const float* __restrict__ pp_{nm}, ")
    name, src = made.source("rg_bf16")
    body = src[src.index(f"{nm} = "):]
    assert [body.index(f"{nm} += pp_{nm}[({s} * rows + r) * F + f];") for s in range(3)] == \
        sorted(body.index(f"{nm} += pp_{nm}[({s} * rows + r) * F + f];") for s in range(3))
    assert made.source("rg_bf16") != spec.source("rg_bf16") and spec.parts == ()
    nvrtc_compile(src, name)
    assert with_parts(spec, {"not_a_member": 3}) is None


def test_a_row_kernel_leaves_its_parts_to_the_executor():
    c = load_cell("layernorm_lstm", 8, 16)
    readers = next_frame_readers(build_schedule(c, loop="stages"))
    specs = [group_kernel(c, r.item.nodes, "bwd") for r in readers.values()]
    assert specs and all(type(s) is not KernelSpec for s in specs)
    assert all(with_parts(s, {n: 2}) is None for s, r in zip(specs, readers.values()) for n in r.item.nodes[:1])


@pytest.mark.parametrize("ctype", ["rg_bf16", "rg_f16", "float"])
def test_the_kernel_adding_parts_for_other_readers_compiles(ctype):
    from rnngraph.run.backends.cuda.source import math_type
    src = ADD_PARTS.format(TY=ctype, MT=math_type(ctype))
    nvrtc_compile(src, f"rg_add_parts_{ctype}")


def test_schedule_says_where_the_backward_runs_its_products_in_parts():
    """`rnngraph schedule --batch --dtype` (lab/gpu_loop.py): stages' backward products in parts, by the same rule."""
    from rnngraph.lab.gpu_loop import gpu_loop
    stages = build_schedule(load_cell("lstm", 32, 1024), loop="stages")
    assert gpu_loop(stages, 64, "bfloat16", auto=False) == "stages; backward products dh@t-1 in 8 float32 parts"
    assert gpu_loop(stages, 256, "float16", auto=False) == "stages; backward products dh@t-1 in 4 float32 parts"
    assert gpu_loop(stages, 64, "float32", auto=False) == "stages"
    auto = build_schedule(load_cell("lstm", 32, 1024))             # persistent, run as stages beyond 16 rows
    assert "stages: at B=64 > 16 rows" in gpu_loop(auto, 64, "bfloat16", auto=True)
    assert "; backward products dh@t-1 in 8 float32 parts, on " in gpu_loop(auto, 64, "bfloat16", auto=True)
    assert "parts" not in gpu_loop(auto, 16, "bfloat16", auto=True)     # the persistent kernel runs
    norm = build_schedule(load_cell("layernorm_lstm", 32, 1024), loop="stages")
    assert gpu_loop(norm, 64, "bfloat16", auto=False) == "stages"      # its reader is a row kernel
