"""The persistent loop of head-wise cells without a GPU: where every GEMM of the loop is head-wise, a block owns
whole heads and its source has no grid barrier (full-matrix cells keep theirs); the sources compile with NVRTC
in every element type; and run on the CPU (cuda_on_cpu.py, g++), blocks one after another, they compute what
numpy's frame-by-frame loop computes, as do the kernels that split heads over more blocks with barriers."""
import numpy as np
import pytest

from cuda_on_cpu import Emulated, needs_cxx
from nvrtc import nvrtc_compile
from rnngraph import Cell, build_schedule, load_cell
from rnngraph.arrays import float_dtype
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cuda.persistent.kernels import persistent_kernel
from rnngraph.run.backends.cuda.persistent.phases import block_counts, problem
from rnngraph.run.backends.cuda.source import CTYPES
from rnngraph.run.executor import Executor
from test_loops import run_executor

UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def loops(cell):
    """(forward, backward) PersistentLoop items of a cell's plan."""
    s = build_schedule(cell, loop="persistent")
    return s.forward[1].items[0], next(sec for sec in s.backward if sec.name == "loop").items[0]


def two_gemm_cell(D=4, H=16, bias=True, heads=4):
    """An MGU with head-wise recurrent weights: two GEMM stages a frame, the second on f ⊙ h (its own fused
    group first), a lone gemm phase each (no pair)."""
    c = Cell("heads_mgu")
    x, h = c.input("x", D), c.state("h", H)
    f = c.sigmoid(c.linear(x, "W_f", H, bias="b_f") + c.linear(h, "U_f", H, heads=heads), name="f")
    n = c.tanh(c.linear(x, "W_n", H, bias="b_n") + c.linear(f * h, "U_n", H, heads=heads), name="n")
    c.output(c.bind(h, (1 - f) * h + f * n, name="h"))
    return c.build()


def delay_cell(D=4, H=8, bias=True, heads=2):
    """A head-wise GEMM on h two frames back and one on h one frame back, with different heads (4 and 2)."""
    c = Cell("heads_delay")
    x, h = c.input("x", D), c.state("h", H)
    a = c.linear(x, "W", H, bias="b") + c.linear(h.ago(2), "R2", H, heads=4) + c.linear(h, "R1", H, heads=heads)
    c.output(c.bind(h, c.tanh(a), name="h"))
    return c.build()


HEAD_CELLS = {"slstm": lambda: load_cell("slstm", 8, 16), "mh_lstm": lambda: load_cell("mh_lstm", 8, 16),
              "mh_lstm 8 heads": lambda: load_cell("mh_lstm", 8, 64, heads=8), "two gemms": two_gemm_cell,
              "delays": delay_cell}


@pytest.mark.parametrize("name", HEAD_CELLS)
def test_per_head_kernels_have_no_grid_barrier(name):
    cell = HEAD_CELLS[name]()
    for lp in loops(cell):
        per_head, *more = block_counts(cell, lp, 132)
        k = persistent_kernel(cell, lp, "float", 2, per_head)
        assert "grid_barrier(" not in k.source and "exchange" not in k.source and not k.cooperative
        for G in more:                  # the heads split over more blocks: barriers, a cooperative launch
            k = persistent_kernel(cell, lp, "float", 2, G)
            assert "grid_barrier(count," in k.source and k.cooperative


def test_full_matrix_cells_keep_their_grid_barriers():
    cell = load_cell("lstm", 8, 64)
    for lp in loops(cell):
        assert block_counts(cell, lp, 132) == [64]
        k = persistent_kernel(cell, lp, "double", 1, 64)
        assert "grid_barrier(count," in k.source and k.cooperative
    for heads in (1, 2):
        cell = load_cell("mh_lstm", 8, 64, heads=heads)
        assert ("grid_barrier(" in persistent_kernel(cell, loops(cell)[0], "double", 1, 2).source) == (heads == 1)


def test_block_counts_take_whole_heads_first():
    cell = load_cell("slstm", 8, 768, heads=12)
    assert block_counts(cell, loops(cell)[0], 132) == [12, 132]
    assert block_counts(cell, loops(cell)[0], 8) == [6, 8]          # fewer SMs than heads: 2 heads a block
    assert block_counts(delay_cell(), loops(delay_cell())[0], 132) == [2, 8]     # gcd of 4 and 2 heads


def test_per_head_shared_memory_holds_one_heads_weights():
    """sLSTM H = 768 in 12 heads of 64 at B = 16 ... here B = 8: a block's 4 gates × 64 × 64 weights in bfloat16, each
    row padded to 66 (33 words: a warp's rows in distinct banks), its head's 64 columns of x, 256 sums and their
    partials (float32); a thread whole sums, no shuffle tree."""
    cell = load_cell("slstm", 8, 768, heads=12)
    k = persistent_kernel(cell, loops(cell)[0], "rg_bf16", 8, 12)
    assert k.smem == 2 * 4 * 64 * 66 + 4 * (8 * 64 + 2 * 4 * 64 * 8)
    assert "a thread R = 4 sums" in k.source and "__shfl_xor_sync" not in k.source
    from rnngraph.run.backends.cuda.persistent.heads import row_stride
    assert [row_stride(64, n) for n in (2, 4, 8)] == [66, 65, 65] and row_stride(6, 2) == 6 and row_stride(3, 4) == 3


def test_what_the_kernel_cannot_run_is_said():
    c = Cell("mixed")
    x, h = c.input("x", 4), c.state("h", 8)
    c.output(c.bind(h, c.tanh(c.linear(h, "R", 8, heads=2) + c.linear(h, "U", 8) + c.linear(x, "W", 8)), name="h"))
    assert "head-wise and full GEMMs" in problem(c.build(), loops(c.build())[0])
    c = Cell("unequal")                     # R·h and Q·h: one head-wise GEMM of sizes 8 and 4
    x, h = c.input("x", 4), c.state("h", 8)
    a, b = c.linear(h, "R", 8, heads=2), c.linear(h, "Q", 4, heads=2)
    c.output(c.bind(h, c.tanh(a + c.linear(x, "W", 8)) * c.sigmoid(c.linear(c.tanh(b), "V", 8, heads=2)), name="h"))
    assert "merges linear ops of sizes [8, 4]" in problem(c.build(), loops(c.build())[0])


@pytest.mark.parametrize("name", HEAD_CELLS)
def test_head_wise_kernels_compile(name):
    cell = HEAD_CELLS[name]()
    for lp in loops(cell):
        for G in block_counts(cell, lp, 132):
            for ctype in CTYPES.values():
                k = persistent_kernel(cell, lp, ctype, 8 if ctype == "double" else 1, G)
                nvrtc_compile(k.source, k.name)


# -- run on the CPU ----------------------------------------------------------------------------------
def problem_arrays(cell, T, B, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dt = float_dtype(dtype, half=True)
    params = {n: rng.uniform(-0.5, 0.5, s).astype(dt) for n, s in cell.params.items()}
    x = rng.standard_normal((T, B, cell.inputs["x"])).astype(dt)
    init = {s: rng.standard_normal((cell.depths[s], B, n) if cell.depths[s] > 1 else (B, n)).astype(dt)
            for s, (_, n) in cell.states.items()}
    gy = rng.standard_normal((T, B, cell.op(cell.outputs[0]).size)).astype(dt)
    gf = {s: rng.standard_normal(a.shape).astype(dt) for s, a in init.items()}
    return params, x, init, gy, gf


def emulated_against_numpy(cell, G=None, in_turn=True, T=6, B=2, dtype="float64", lengths=None, chunk=None,
                           tensor_cores=None):
    """(every array of a forward and backward run by the emulated kernels, the same by numpy 'stages', the backend)."""
    be = Emulated(G, in_turn, tensor_cores=tensor_cores)
    ex, ref = Executor(cell, be, loop="persistent", chunk=chunk), Executor(cell, get_backend("numpy"), loop="stages")
    args = problem_arrays(cell, T, B, dtype)
    got, want = run_executor(ex, *args, lengths), run_executor(ref, *args, lengths)
    return got, want, be


def assert_agree(got, want, dtype):
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        a, b = a.astype(np.float64), b.astype(np.float64)
        err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)
        bound = {"float64": 1e-10, "float32": 1e-4}.get(dtype) or UNIT[dtype]     # half: at most a rounding flip
        assert err <= bound, f"array {k}: relative error {err:.2e} > {bound:.0e}"


@needs_cxx
@pytest.mark.parametrize("name", HEAD_CELLS)
def test_per_head_kernels_compute_the_reference_with_each_block_on_its_own(name):
    """Blocks run one after another: a block that read another's values would read zeros."""
    cell = HEAD_CELLS[name]()
    got, want, be = emulated_against_numpy(cell)
    assert_agree(got, want, "float64")
    assert [k.cooperative for k in be.ran] == [False, False]


@needs_cxx
@pytest.mark.parametrize("name, G", [("slstm", 3), ("mh_lstm", 6), ("delays", 3)])
def test_heads_split_over_more_blocks_compute_the_reference(name, G):
    """G not dividing the heads: a block's rows span heads, x staged whole, grid barriers (blocks at once)."""
    cell = HEAD_CELLS[name]()
    got, want, be = emulated_against_numpy(cell, G, in_turn=False)
    assert_agree(got, want, "float64")
    assert [(k.blocks, k.cooperative) for k in be.ran] == [(G, True), (G, True)]


@needs_cxx
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", ["slstm", "mh_lstm"])
def test_per_head_kernels_in_float32_and_half(name, dtype):
    """Half storage: the GEMM sums read as stored, each linear op's part of the operand gradient added (and
    rounded) in turn, as the CPU half reference does."""
    got, want, _ = emulated_against_numpy(HEAD_CELLS[name](), dtype=dtype)
    assert_agree(got, want, dtype)


@needs_cxx
@pytest.mark.parametrize("B", [1, 3, 8])
def test_per_head_kernels_ragged_and_chunked(B):
    cell = HEAD_CELLS["slstm"]()
    lengths = np.array([9, 4, 1, 7, 2, 9, 5, 3][:B])
    got, want, _ = emulated_against_numpy(cell, T=9, B=B, lengths=lengths)
    assert_agree(got, want, "float64")
    got, want, be = emulated_against_numpy(cell, T=9, B=B, chunk=4)       # chunks of 1, 4 and 4 frames
    assert_agree(got, want, "float64")
    assert len(be.ran) == 6


# -- on tensor cores: half storage beyond MAX_ROWS rows, one head a block ---------------------------------
@needs_cxx
@pytest.mark.parametrize("name, B, dtype", [("slstm", 16, "bfloat16"), ("mh_lstm", 20, "float16"),
                                            ("mh_lstm 8 heads", 24, "bfloat16")])
def test_head_wise_kernels_on_tensor_cores_compute_the_reference(name, B, dtype):
    """mma.sync emulated (cuda_on_cpu.py); blocks one after another, so no block reads another's head; B not a
    multiple of 16: the padded rows are read but never stored."""
    cell = HEAD_CELLS[name]()
    got, want, be = emulated_against_numpy(cell, B=B, T=5, dtype=dtype)
    assert_agree(got, want, dtype)
    assert [("mma.sync" in k.source, k.cooperative) for k in be.ran] == [(True, False), (True, False)]


@needs_cxx
def test_head_wise_tensor_cores_ragged_and_chunked():
    cell = HEAD_CELLS["slstm"]()
    lengths = np.array([9, 4, 1, 7, 2, 9, 5, 3, 0, 8, 6, 9, 1, 2, 3, 4])
    got, want, _ = emulated_against_numpy(cell, T=9, B=16, lengths=lengths, dtype="bfloat16")
    assert_agree(got, want, "bfloat16")
    be = Emulated(None, True)           # chunks of 1, 4 and 4 frames, against numpy's chunks: in half storage a
    args = problem_arrays(cell, 9, 16, "bfloat16")    # chunk's parameter gradients are rounded before they add up
    got = run_executor(Executor(cell, be, loop="persistent", chunk=4), *args)
    assert_agree(got, run_executor(Executor(cell, get_backend("numpy"), loop="stages", chunk=4), *args), "bfloat16")
    assert len(be.ran) == 6


def test_per_head_kernels_split_rows_over_blocks(monkeypatch):
    """A block owns whole heads, so the rows split over blocks too (runner.head_rows): on CUDA cores the fewest rows
    a block whose blocks fit on the SMs at once, tensor cores from 32 rows in half storage with one head a block
    (16 rows a block). At fewer rows in half storage, one head a block, the forward's GEMM warps run on tensor cores
    too (warp roles, roles.tensor_core_warps), not on a GPU without them nor with RNNGRAPH_PERSISTENT_TENSOR_CORES=0;
    the backward stays on CUDA cores."""
    import ml_dtypes
    from rnngraph.run.backends.cuda.persistent.runner import chosen, fit, gpu_loop
    cell, H200 = load_cell("slstm", 8, 768, heads=12), (132, 227 * 1024)
    fwd, bwd = loops(cell)
    shape = lambda B, dtype, sms=132, mma=True, lp=fwd: (lambda k: (k.blocks, k.cooperative, k.tensor_cores,
                                                                     "mma.sync" in k.source))(
        chosen(cell, lp, B, dtype, sms, H200[1], mma))
    assert shape(16, ml_dtypes.bfloat16) == (12 * 8, False, True, True)           # 2 rows a block, in warp roles
    assert shape(16, ml_dtypes.bfloat16, lp=bwd) == (12 * 8, False, False, False)
    assert shape(16, ml_dtypes.bfloat16, mma=False) == (12 * 8, False, False, False)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", "0")
    assert shape(16, ml_dtypes.bfloat16) == (12 * 8, False, False, False)
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_TENSOR_CORES")
    assert shape(64, ml_dtypes.bfloat16) == (12 * 4, False, True, True)           # 16 rows a block
    assert shape(40, ml_dtypes.bfloat16) == (12 * 4, False, True, True)           # 10 rows a block
    assert shape(5, np.float32) == (12 * 5, False, False, False)
    assert shape(64, ml_dtypes.bfloat16, 8) == (6 * 8, False, False, False)      # 2 heads a block: CUDA cores
    for B, dtype, ran in ((16, ml_dtypes.bfloat16, "tensor"), (64, ml_dtypes.bfloat16, "tensor"),
                          (64, np.float32, "CUDA")):
        assert fit(cell, bwd, B, dtype, *H200) is None
        assert gpu_loop(cell, fwd, B, dtype, *H200) == f"persistent ({ran} cores)"
    assert gpu_loop(cell, fwd, 128, ml_dtypes.bfloat16, *H200).startswith("stages: at B=128 > 64 rows the per-head")
    assert gpu_loop(cell, fwd, 128, ml_dtypes.bfloat16, *H200, auto=False) == "persistent (tensor cores)"
    assert fit(cell, fwd, 257, np.float32, *H200) == "B=257 rows: a persistent kernel takes at most 256"
    with pytest.raises(Exception, match="one head a block, not on 6 blocks"):
        persistent_kernel(cell, fwd, "rg_bf16", 16, 6)


@needs_cxx
@pytest.mark.parametrize("name, B, rows, dtype", [("slstm", 6, 2, "float64"), ("mh_lstm", 12, 3, "float32"),
                                                  ("slstm", 32, 16, "bfloat16"), ("delays", 5, 1, "float64")])
def test_rows_split_over_blocks_compute_the_reference(name, B, rows, dtype):
    """Blocks one after another, each its heads' `rows` rows (ragged): no block reads another's rows."""
    cell = HEAD_CELLS[name]()
    be = Emulated(None, True, rows)
    args, lengths = problem_arrays(cell, 6, B, dtype), np.arange(B) % 7
    got = run_executor(Executor(cell, be, loop="persistent"), *args, lengths)
    assert_agree(got, run_executor(Executor(cell, get_backend("numpy"), loop="stages"), *args, lengths), dtype)
    assert [k.blocks for k in be.ran] == [block_counts(cell, loops(cell)[0], 132)[0] * B // rows] * 2


def test_the_rows_setting_and_its_error(monkeypatch):
    from rnngraph.errors import RnnGraphError
    from rnngraph.run.backends.cuda.persistent.runner import head_rows
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_ROWS", raising=False)       # the fewest rows whose blocks fit at once
    assert [head_rows(B, False, 12, 132) for B in (1, 8, 16, 20, 64, 7)] == [1, 1, 2, 2, 8, 1]
    assert (head_rows(32, True, 12, 132), head_rows(16, True, 12, 132), head_rows(40, True, 12, 132)) == (16, 2, 10)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_ROWS", "4")
    assert (head_rows(16, False, 12, 132), head_rows(6, False, 12, 132), head_rows(64, True, 12, 132)) == (4, 3, 4)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_ROWS", "16")
    assert (head_rows(64, True, 12, 132), head_rows(48, True, 12, 132), head_rows(64, False, 12, 132)) == (16, 16, 8)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_ROWS", "0")
    with pytest.raises(RnnGraphError, match="RNNGRAPH_PERSISTENT_ROWS must be a whole number of rows >= 1, got '0'"):
        head_rows(16, False, 12, 132)


@needs_cxx
@pytest.mark.parametrize("name, H, B, dtype, per", [("slstm", 128, 16, "bfloat16", 2),
                                                    ("mh_lstm", 128, 20, "float16", 3), ("slstm", 256, 5, "float64", 2)])
def test_threads_holding_several_elements_load_them_before_the_gemm(name, H, B, dtype, per):
    """A block owning a head of H/2 units holds more (b, f) elements than threads (sLSTM's 64 at B = 16: 1024 on
    512): each thread loads its `per` elements' inputs and states into register arrays before the head's GEMM and
    walks them unrolled (elements.prefetch), the last one short where B·units is not a multiple of the threads."""
    cell = load_cell(name, 8, H, heads=2)
    got, want, be = emulated_against_numpy(cell, B=B, T=5, dtype=dtype)
    assert_agree(got, want, dtype)
    assert all(f"for (int i = 0; i < {per}; ++i)" in k.source and f"[{per}] = {{}}" in k.source for k in be.ran)
    assert [k.cooperative for k in be.ran] == [False, False]


@needs_cxx
@pytest.mark.parametrize("name, B, rows, R, dtype, resident", [
    ("slstm", 4, 2, 2, "float64", False), ("slstm", 8, 8, 4, "bfloat16", False), ("mh_lstm", 8, 4, 4, "float32", False),
    ("slstm", 6, 3, 1, "float64", False), ("slstm", 4, 2, 2, "bfloat16", True), ("mh_lstm", 3, 1, 1, "float32", True),
    ("mh_lstm", 2, 2, 2, "float16", True)])
def test_a_thread_sums_several_rows_against_one_weight_row(name, B, rows, R, dtype, resident):
    """Blocks of `rows` rows, each owning a head of 64 units (four gates: 256 weight rows, and as many operand
    columns times 4 linear ops backward): each thread sums R rows against one weight row, loaded once
    (heads.rows_a_thread), the sums in the order of one row a thread; ragged, blocks one after another. Computing
    in float with at most two rows a thread, that row sits in the thread's registers for the whole sequence
    (heads.resident), forward and backward (each the kernel's only GEMM phase). On CUDA cores throughout
    (tensor_cores=False, as on a GPU without them: half storage's forward would run its GEMM warps on them)."""
    cell = load_cell(name, 8, 128, heads=2)
    be = Emulated(None, True, rows, tensor_cores=False)
    args, lengths = problem_arrays(cell, 5, B, dtype), np.arange(B) % 6
    got = run_executor(Executor(cell, be, loop="persistent"), *args, lengths)
    assert_agree(got, run_executor(Executor(cell, get_backend("numpy"), loop="stages"), *args, lengths), dtype)
    assert [f"a thread R = {R} sums" in k.source for k in be.ran] == [True, True]
    held = [("CT wr0[64];" in k.source, "const ST* w = sw" in k.source) for k in be.ran]
    assert held == [(resident, not resident)] * 2


def test_rows_a_thread_keeps_half_the_threads_busy():
    from rnngraph.run.backends.cuda.persistent.heads import rows_a_thread
    from rnngraph.run.backends.cuda.persistent.phases import phases
    cell = load_cell("slstm", 8, 768, heads=12)          # 12 blocks a row group, one head of 64 units each
    gemm = [p for g in phases(cell, loops(cell)[0]) for p in g if p.kind == "pair"][0]
    assert [rows_a_thread(gemm, 12, B) for B in (1, 2, 3, 4, 8, 16)] == [1, 2, 1, 4, 4, 4]
    assert rows_a_thread(gemm, 2, 4) == 4               # 6 heads a block: 1536 rows, 4 sums each still fill it


def test_a_heads_operand_stays_in_shared_memory_between_frames():
    """heads.handed_on: sLSTM's forward, its blocks owning whole heads, also writes h into the staged rows (on
    tensor cores as stored, on CUDA cores as the stored value in float) and stages it from memory only at a
    launch's first frame (the emulated runs above, chunked too, check the values); its backward stages every
    frame, and so does a forward whose heads split over blocks."""
    cell = HEAD_CELLS["slstm"]()
    fwd, bwd = loops(cell)
    G, *more = block_counts(cell, fwd, 132)
    tc = persistent_kernel(cell, fwd, "rg_bf16", 16, G).source
    assert "                if (s == 0) {" in tc and "((ST*)xs)[b * " in tc
    cores = persistent_kernel(cell, fwd, "double", 2, G).source
    assert "if (s == 0) for (int e = tid;" in cores and "xs[b * 4 + u] = v" in cores
    wide = load_cell("slstm", 8, 64, heads=2)           # in warp roles (heads of 32): staged before the loop
    roles = persistent_kernel(wide, loops(wide)[0], "rg_bf16", 1, 2).source
    assert "frame 0's operand, staged by every thread" in roles and "((ST*)xs)[b * XLD + u] = v" in roles  # as stored
    staged_each_frame = [persistent_kernel(cell, bwd, "rg_bf16", 16, G), persistent_kernel(cell, bwd, "float", 2, G)]
    staged_each_frame += [persistent_kernel(cell, fwd, "float", 2, g) for g in more]
    for k in staged_each_frame:
        assert "if (s == 0)" not in k.source and "xs[b * " not in k.source
