"""The generated kernels in half storage, without a GPU: elements load as float, compute in float registers
and round once when stored (the numpy reference's rule); every kind of kernel compiles with NVRTC for
bfloat16 and float16."""
import pytest

from rnngraph import build_schedule, load_cell
from rnngraph.plan.items import Fused
from rnngraph.run.backends.cuda.elementwise import elementwise_kernel, elementwise_nodes
from rnngraph.run.backends.cuda.fused import fused_backward_kernel, fused_forward_kernel
from rnngraph.run.backends.cuda.matmul import matmul_source
from rnngraph.run.backends.cuda.pair import gemv_fused_kernel
from rnngraph.run.backends.cuda.param_grad import chunks, param_grad_kernel, sum_source
from rnngraph.run.backends.cuda.persistent.kernels import persistent_kernel
from rnngraph.run.backends.cuda.source import CTYPES
from rnngraph.run.backends.cuda.rows import row_backward_kernel, row_forward_kernel
from rnngraph.run.backends.cuda.scan import scan_source
from rnngraph.run.backends.cuda.source import HALF_PRELUDE, complete, math_type, options
from nvrtc import nvrtc_compile
from test_persistent import GEMM_CORES, loops

HALF = ["rg_bf16", "rg_f16"]


def row_specs():
    """The LayerNorm-LSTM's row kernels (a block per row), forward and backward (atomic adds too)."""
    cell, fused = groups("layernorm_lstm")
    rows = [f.nodes for f in fused if any(cell.op(n).kind.name == "MEAN" for n in f.nodes)]
    return [row_forward_kernel(cell, rows[0])] + [row_backward_kernel(cell, nodes, set(cell.params), atomic)
                                                  for nodes in rows for atomic in (False, True)]


def groups(name):
    cell = load_cell(name, 8, 16)
    return cell, [it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused)]


@pytest.mark.parametrize("ctype", HALF)
def test_fused_kernels_store_half_and_compute_in_float(ctype):
    cell, fused = groups("lstm")
    spec = fused_forward_kernel(cell, fused[0].nodes)
    name, src = spec.source(ctype)
    assert f"const {ctype}* __restrict__ p_x0" in src and f"{ctype}* p_y0" in src
    assert "float x0 = p_x0" in src and f"{ctype} x0" not in src and "double" not in src
    nvrtc_compile(src, name)
    back = fused_backward_kernel(cell, fused[0].nodes, set(cell.params), atomic=True)
    nvrtc_compile(*reversed(back.source(ctype)))


@pytest.mark.parametrize("ctype", HALF)
def test_a_gemv_inside_a_fused_kernel_reads_its_outputs_rounded(ctype):
    """The fused body reads the GEMM's outputs as the stored (rounded) values the reference reads."""
    cell, fused = groups("gru")
    gemm_reader = next(f for f in fused if any(cell.op(u).kind.name == "LINEAR" for n in f.nodes
                                                for u, _ in cell.reads(n)))
    spec = fused_forward_kernel(cell, gemm_reader.nodes)
    linear = [u for n in gemm_reader.nodes for u, _ in cell.reads(n) if cell.op(u).kind.name == "LINEAR"]
    name, src = gemv_fused_kernel(spec, linear[:1], [0], ctype)
    assert f"rg_rounded<{ctype}>(g0)" in src
    nvrtc_compile(src, name)
    assert "rg_rounded" not in gemv_fused_kernel(spec, linear[:1], [0], "float")[1]


@pytest.mark.parametrize("ctype", HALF)
def test_matmul_row_param_and_scan_kernels_compile(ctype):
    for kind in ("gemv", "gemm"):
        nvrtc_compile(matmul_source(kind, ctype), f"rg_{kind}_{ctype}")
    for spec in row_specs():
        nvrtc_compile(*reversed(spec.source(ctype)))
    cell = load_cell("lstm", 8, 16)
    n = next(n for n in cell.graph if any(u == "b_hi" for u, _ in cell.reads(n)))
    nvrtc_compile(*reversed(param_grad_kernel(cell, n, [u for u, _ in cell.reads(n)].index("b_hi"), ctype)))
    for direction in ("fwd", "bwd"):
        src, names = scan_source(direction, ctype)
        assert "float* PC" in src and f"{ctype}* __restrict__ a" in src     # composites in float
        nvrtc_compile(src, names["part"])


def test_no_half_store_adds_in_place():
    """A half value has no +=: every add onto a stored value loads it as float and stores the sum once."""
    for ctype in HALF:
        assert all("] +=" not in spec.source(ctype)[1].replace("[q] +=", "") for spec in row_specs())
        assert "] +=" not in scan_source("bwd", ctype)[0]


def test_the_elementwise_loop_leaves_half_to_the_frame_walk():
    """Its registers carry values a later frame reads, which the reference rounds: half walks the frames."""
    cell = load_cell("indrnn", 8, 16)
    loop = build_schedule(cell, loop="elementwise").forward[1].items[0]
    nodes = elementwise_nodes(loop)
    assert elementwise_kernel(cell, nodes, "fwd", "float") is not None
    assert all(elementwise_kernel(cell, nodes, "fwd", h) is None for h in HALF)


def test_sources_without_half_types_are_compiled_as_they_are():
    src = matmul_source("gemv", "float")
    assert complete(src) == src and complete(matmul_source("gemv", "rg_bf16")).startswith(HALF_PRELUDE)
    assert [math_type(t) for t in ("float", "double", *HALF)] == ["float", "double", "float", "float"]


def test_only_bfloat16_sources_compile_with_fast_math():
    """bfloat16's rounding unit (2^-8) is 8 times tanh.approx's error; float16's is not, and float32 and float64
    must keep every bit: their kernels compile exactly (no options)."""
    cell = load_cell("slstm", 8, 64, heads=2)
    fwd = loops(cell)[0]
    got = {t: options(persistent_kernel(cell, fwd, t, 1, 2).source) for t in ("float", "double", *HALF)}
    assert got == {"float": (), "double": (), "rg_bf16": ("--use_fast_math",), "rg_f16": ()}
    assert options(matmul_source("gemv", "rg_bf16")) == ("--use_fast_math",)
    assert options(matmul_source("gemv", "rg_bf16"), fast=False) == ()       # RNNGRAPH_FAST_MATH=0


def test_the_backend_compiles_with_the_options_in_effect(monkeypatch):
    """CupyBackend.raw hands RawKernel the source's options and keeps a kernel per options (a fake CuPy here: no
    GPU), so RNNGRAPH_FAST_MATH=0 set after a bfloat16 kernel was built builds it again, exactly."""
    from rnngraph.run.backends.cuda import backend as cuda_backend
    made = []

    class FakeCupy:
        @staticmethod
        def RawKernel(code, name, options=(), enable_cooperative_groups=False):
            made.append((name, options))
            return object()
    be = cuda_backend.CupyBackend.__new__(cuda_backend.CupyBackend)
    be.xp = FakeCupy
    monkeypatch.setattr(cuda_backend, "_KERNELS", {})
    name, src = "rg_test_bf16", matmul_source("gemv", "rg_bf16")
    monkeypatch.delenv("RNNGRAPH_FAST_MATH", raising=False)
    assert be.raw(name, src) is be.raw(name, src)
    monkeypatch.setenv("RNNGRAPH_FAST_MATH", "0")
    be.raw(name, src)
    be.raw("rg_test_f32", matmul_source("gemv", "float"))
    assert made == [(name, ("--use_fast_math",)), (name, ()), ("rg_test_f32", ())]


@pytest.mark.parametrize("text, want", [(None, None), ("1", True), ("0", False)])
def test_fast_math_is_switched_by_the_environment(monkeypatch, text, want):
    """RNNGRAPH_FAST_MATH: unset (the default, fast math in bfloat16), 1 or 0; anything else says what it takes."""
    from rnngraph.errors import RnnGraphError
    from rnngraph.run.settings import switch
    if text is None:
        monkeypatch.delenv("RNNGRAPH_FAST_MATH", raising=False)
    else:
        monkeypatch.setenv("RNNGRAPH_FAST_MATH", text)
    assert switch("RNNGRAPH_FAST_MATH") is want
    monkeypatch.setenv("RNNGRAPH_FAST_MATH", "yes")
    with pytest.raises(RnnGraphError, match="RNNGRAPH_FAST_MATH must be 1 or 0, got 'yes'"):
        switch("RNNGRAPH_FAST_MATH")


def test_a_layer_norms_row_kernels_compile_exactly_in_bfloat16():
    """Its division by σ follows x − μ's cancellation: approximate, it moved the LayerNorm-LSTM's gradients by 13 u
    on an H200 (6 u exactly)."""
    cell, fused = groups("layernorm_lstm")
    rows = [f.nodes for f in fused if any(cell.op(n).kind.name == "MEAN" for n in f.nodes)]
    for spec in (row_forward_kernel(cell, rows[0]), row_backward_kernel(cell, rows[0], set(cell.params))):
        assert options(spec.source("rg_bf16")[1]) == ()


def test_a_stored_element_picked_by_a_ternary_is_converted_to_float_first():
    """`c ? p[i] : 0` with p a half type converts p[i] to int (the literal's type): the scan's backward read
    its coefficients as 0 that way until each load was cast to float."""
    import re
    for ctype in HALF:
        for src in [scan_source(d, ctype)[0] for d in ("fwd", "bwd")] + [matmul_source("gemm", ctype)]:
            assert not re.search(r"\?\s*[A-Za-z_]\w*\[", src), src


@pytest.mark.parametrize("name", [c for c in GEMM_CORES if not c.startswith("layernorm")])
def test_persistent_kernels_in_half_compile_and_read_the_gemm_sums_as_stored(name):
    cell = load_cell(name, 8, 64)
    for ctype in HALF:
        for lp in loops(cell):
            k = persistent_kernel(cell, lp, ctype, 8, 132)
            assert f"#define ST {ctype}\n#define CT float\n" in k.source
            nvrtc_compile(k.source, k.name)
        fwd = persistent_kernel(cell, loops(cell)[0], ctype, 1, 132).source
        assert ("pair" not in fwd) or f"rg_rounded<{ctype}>(gs[" in fwd


def test_half_values_travel_in_tagged_words_as_stored():
    """The barrier-free forward passes h between blocks in tagged words: in half, the rounded value."""
    cell = load_cell("lstm", 8, 512)
    for ctype in ("float", *HALF):
        src = persistent_kernel(cell, loops(cell)[0], ctype, 1, 132).source
        assert "grid_barrier(bar" not in src.split("for (int s = 0")[1]
        assert (f"tags + t, rg_rounded<{ctype}>(v" in src) == (ctype != "float")


def test_half_weights_take_half_the_shared_memory():
    """The weights stay in their storage type on chip: a bfloat16 LSTM fits about twice float32's H."""
    cell = load_cell("lstm", 1024, 1024)
    fwd = loops(cell)[0]
    f32, b16 = (persistent_kernel(cell, fwd, ct, 1, 132).smem for ct in ("float", "rg_bf16"))
    weights = -(-1024 // 132) * 4 * 1024 * 4        # a block's features × 4 gates × K = H, float32 bytes
    assert f32 - b16 == pytest.approx(weights / 2, abs=16)


def test_parameter_gradients_sum_many_rows_in_chunks_and_the_chunks_in_order():
    """Few rows: one kernel, one chunk (as many frames as a B = 1 call has); many: chunks of at least 256 rows over
    about 528 blocks, then a kernel adding them in order (no atomics either way)."""
    assert chunks(100, 512) == (1, 100) and chunks(0, 512) == (1, 1)
    assert chunks(6400, 512) == (25, 256)               # B = 64, T = 100: 400 blocks, not 16
    assert chunks(6401, 512) == (26, 247) and chunks(1000, 32) == (4, 250)
    for ctype in CTYPES.values():
        source = sum_source(ctype)
        assert "atomic" not in source
        nvrtc_compile(source, f"rg_pgrad_sum_{ctype}")
