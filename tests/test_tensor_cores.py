"""The persistent kernel on tensor cores, without a GPU: half storage at 8 < B <= 256 (4 <= B where asked) generates mma.sync
GEMMs (deterministic source, compiled by NVRTC for sm_90 in bfloat16 and float16), its shared memory fits
an H200 block at the sizes people train with, and what a GPU would run at a batch size and dtype is said."""
import json

import numpy as np
import pytest

from rnngraph import load_cell
from rnngraph.run.backends.cuda.persistent import mma
from rnngraph.run.backends.cuda.persistent.mma import MMA_ROWS
from rnngraph.run.backends.cuda.persistent.phases import phases
from rnngraph.run.backends.cuda.persistent.kernels import persistent_kernel
from rnngraph.run.backends.cuda.persistent.runner import chosen, fit, gpu_loop
from cuda_on_cpu import needs_cxx
from nvrtc import nvrtc_compile
from test_persistent import GEMM_CORES, loops
from test_persistent_heads import assert_agree, emulated_against_numpy

H200 = dict(sms=132, smem=227 * 1024)


@pytest.mark.parametrize("B", [9, 64, 256])
@pytest.mark.parametrize("cell", GEMM_CORES)
def test_tensor_core_kernels_compile(cell, B):
    """On the blocks a GPU would run them (head-wise GEMMs: one head a block, 16 rows a block from 32 rows on; B = 9
    on CUDA cores, 1 row a block; full matrices beyond 16 rows in row groups of 8 on 128 blocks)."""
    import ml_dtypes
    c = load_cell(cell, 24, 64)
    heads = cell in ("slstm", "mh_lstm")
    if heads and B < 32:
        assert not chosen(c, loops(c)[0], B, ml_dtypes.bfloat16, **H200).tensor_cores
        return
    for lp in loops(c):
        k = chosen(c, lp, B, ml_dtypes.bfloat16, **H200)
        assert k.blocks == (4 * B // 16 if heads else 64 if B <= 16 else 128) and k.tensor_cores
        assert k.row_groups == (B // 16 if heads else B // 8 if B > 16 else 1)
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in k.source and "acc[NB]" not in k.source
        nvrtc_compile(k.source, k.name)


def test_float16_and_padded_sizes_compile_and_the_source_is_deterministic():
    c = load_cell("lstm", 30, 1000)         # K = 30 and 1000: padded to 32 and 1008
    for lp in loops(c):
        k = persistent_kernel(c, lp, "rg_f16", 100, 132)
        assert ".f32.f16.f16.f32" in k.source and k == persistent_kernel(load_cell("lstm", 30, 1000), lp, "rg_f16", 100, 132)
        nvrtc_compile(k.source, k.name)


def test_tensor_cores_beyond_eight_rows_or_where_asked_and_the_gpu_takes_them_from_four():
    import ml_dtypes
    c = load_cell("lstm", 24, 64)
    fwd, _ = loops(c)
    assert "mma.sync" not in persistent_kernel(c, fwd, "rg_bf16", 8, 64).source
    assert "mma.sync" in persistent_kernel(c, fwd, "rg_bf16", 9, 64).source
    assert "mma.sync" in persistent_kernel(c, fwd, "rg_bf16", 4, 64, tensor_cores=True).source
    assert [chosen(c, fwd, B, ml_dtypes.bfloat16, **H200).tensor_cores for B in (1, 3, 4, 8)] == [False, False, True, True]


@pytest.mark.parametrize("H,B", [(512, 256), (768, 64), (1024, 64), (1024, 256)])
def test_the_weights_and_rows_fit_an_h200_block(H, B):
    c = load_cell("lstm", H, H)
    for lp in loops(c):
        assert fit(c, lp, B, "bfloat16", **H200) is None


def test_what_the_gpu_runs_is_said_by_batch_and_dtype(monkeypatch):
    import ml_dtypes
    c = load_cell("lstm", 32, 512)
    fwd, _ = loops(c)
    assert gpu_loop(c, fwd, 1, np.float32, **H200) == "persistent (CUDA cores)"
    assert gpu_loop(c, fwd, 4, ml_dtypes.bfloat16, **H200) == "persistent (tensor cores, weights in registers)"
    # from 8 rows in groups of at least 4 (runner.GROUP_FEWEST), at least 4 groups where B allows
    assert gpu_loop(c, fwd, 8, ml_dtypes.bfloat16, **H200) == \
        "persistent (tensor cores, weights in registers, 2 groups of 4 rows)"
    assert gpu_loop(c, fwd, 16, ml_dtypes.bfloat16, **H200) == \
        "persistent (tensor cores, weights in registers, 4 groups of 4 rows)"
    assert gpu_loop(c, fwd, 64, ml_dtypes.bfloat16, **H200, auto=False) == \
        "persistent (tensor cores, weights in registers, 4 groups of 16 rows)"
    assert gpu_loop(c, fwd, 64, ml_dtypes.bfloat16, **H200) == \
        "persistent (tensor cores, weights in registers, 4 groups of 16 rows)"
    # 128 rows a block in groups of 16: 128 registers a thread would hold their weights, so shared memory does
    assert gpu_loop(c, fwd, 128, ml_dtypes.bfloat16, **H200) == "persistent (tensor cores, 8 groups of 16 rows)"
    assert gpu_loop(c, fwd, 256, ml_dtypes.bfloat16, **H200).startswith(
        "stages: at B=256 > 128 rows the tensor-core persistent kernel of width 512 measured no faster")
    wide = load_cell("lstm", 32, 1024)             # 'auto' by width (runner.AUTO_TENSOR_CORE_ROWS)
    # H = 1024: on 64 blocks the weights would take 64 registers a thread, on 128 they take 32 (runner.GROUP_ROWS)
    assert gpu_loop(wide, loops(wide)[0], 16, ml_dtypes.bfloat16, **H200) == \
        "persistent (tensor cores, weights in registers)"
    assert chosen(wide, loops(wide)[0], 16, ml_dtypes.bfloat16, **H200).blocks == 128
    w768 = load_cell("lstm", 32, 768)              # 2 groups of 16 rows on 64 blocks each hold theirs in registers
    assert gpu_loop(w768, loops(w768)[0], 32, ml_dtypes.bfloat16, **H200) == \
        "persistent (tensor cores, weights in registers, 2 groups of 16 rows)"
    assert gpu_loop(wide, loops(wide)[0], 32, ml_dtypes.bfloat16, **H200).startswith("stages: at B=32 > 16 rows")
    mid = load_cell("lstm", 32, 600)
    assert gpu_loop(mid, loops(mid)[0], 32, ml_dtypes.bfloat16, **H200).startswith("persistent (tensor cores")
    assert gpu_loop(mid, loops(mid)[0], 48, ml_dtypes.bfloat16, **H200).startswith("stages: at B=48 > 32 rows")
    assert gpu_loop(w768, loops(w768)[0], 64, ml_dtypes.bfloat16, **H200).startswith("stages: at B=64 > 32 rows")
    # float32 beyond 8 rows: row groups of 8 on CUDA cores, where their blocks' weights fit; from runner.SPLIT_FROM's
    # rows on tensor cores in 3xTF32, up to AUTO_SPLIT_ROWS'
    assert gpu_loop(c, fwd, 16, np.float32, **H200) == "persistent (CUDA cores, 2 groups of 8 rows)"
    assert gpu_loop(c, fwd, 32, np.float32, **H200) == \
        "persistent (tensor cores in 3xTF32, weights in registers, 2 groups of 16 rows)"
    assert gpu_loop(c, fwd, 64, np.float32, **H200) == "persistent (tensor cores in 3xTF32, 4 groups of 16 rows)"
    assert gpu_loop(c, fwd, 128, np.float32, **H200).startswith(
        "stages: at B=128 > 64 rows the tensor-core persistent kernel in 3xTF32 of width 512 measured no faster")
    assert gpu_loop(w768, loops(w768)[0], 16, np.float32, **H200) == \
        "persistent (tensor cores in 3xTF32, weights in registers)"
    assert gpu_loop(w768, loops(w768)[0], 8, np.float32, **H200) == "persistent (CUDA cores)"
    small = load_cell("lstm", 32, 128)
    assert gpu_loop(small, loops(small)[0], 128, np.float32, **H200).startswith("stages: at B=128 > 64 rows")

    monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", "0")        # float32 on CUDA cores at any B
    assert gpu_loop(small, loops(small)[0], 64, np.float32, **H200).startswith("stages: at B=64 > 32 rows the persistent")
    assert gpu_loop(c, fwd, 64, np.float32, **H200) == ("stages: its weights and rows need 280 KiB of shared memory per "
                                                        "block at B=64, more than the 227 KiB the GPU has")
    assert gpu_loop(c, fwd, 137, np.float32, **H200) == ("stages: B=137 rows: on CUDA cores a persistent kernel's blocks "
                                                         "take at most 8 rows, and B splits into no such row groups on "
                                                         "132 SMs")
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_TENSOR_CORES")
    assert gpu_loop(c, fwd, MMA_ROWS + 1, np.float16, **H200).startswith(f"stages: B={MMA_ROWS + 1} rows")
    huge = load_cell("lstm", 32, 4096)
    assert "KiB of shared memory" in gpu_loop(huge, loops(huge)[0], 64, np.float16, **H200)


def test_a_gpu_without_tensor_core_mma_runs_cuda_cores_or_stages_and_says_why():
    """Compute capability below 8.0 (a T4, a V100): no mma.sync m16n8k16 in half, no cp.async."""
    import ml_dtypes
    from rnngraph.run.backends.cuda.persistent.runner import gpu_facts
    old = dict(sms=40, smem=64 * 1024, mma=False)
    assert gpu_facts({"MultiProcessorCount": 40, "MaxSharedMemoryPerBlockOptin": 65536, "ComputeCapability": 75}) == \
        (40, 65536, False)
    assert gpu_facts({"MultiProcessorCount": 132, "MaxSharedMemoryPerBlockOptin": 1, "ComputeCapability": 90})[2]
    c = load_cell("lstm", 32, 128)
    fwd, _ = loops(c)
    assert gpu_loop(c, fwd, 8, np.float16, **old) == "persistent (CUDA cores)"
    assert not chosen(c, fwd, 8, np.float16, **old).tensor_cores
    assert gpu_loop(c, fwd, 16, np.float16, **old, auto=False) == "persistent (CUDA cores, 2 groups of 8 rows)"
    assert gpu_loop(c, fwd, 131, np.float16, **old).endswith("on 40 SMs on this GPU (tensor cores need compute "
                                                             "capability 8.0)")
    heads = load_cell("slstm", 64, 64, heads=4)
    hf, _ = loops(heads)
    assert not chosen(heads, hf, 64, ml_dtypes.bfloat16, **old).tensor_cores       # rows split over blocks instead
    assert chosen(heads, hf, 64, ml_dtypes.bfloat16, **H200).tensor_cores


def test_schedule_says_which_loop_the_gpu_runs(capsys):
    from rnngraph.lab.cli import main
    assert main(["schedule", "lstm", "--batch", "256", "--dtype", "bfloat16"]) == 0
    assert "on the GPU at B=256 in bfloat16: stages: at B=256 > 128 rows" in capsys.readouterr().out
    assert main(["schedule", "lstm", "--batch", "64", "--tf32"]) == 0
    assert ("in float32 with TF32 allowed: persistent (tensor cores in TF32, weights in registers, 8 groups of 8 "
            "rows)") in capsys.readouterr().out
    assert main(["schedule", "lstm", "--batch", "16", "--dtype", "bfloat16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_loop"].startswith(
        "persistent (tensor cores, weights in registers, 4 groups of 4 rows), on ")
    assert main(["schedule", "lstm", "--batch", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_loop"].startswith(
        "persistent (tensor cores in 3xTF32, weights in registers, 8 groups of 8 rows), on ")
    assert main(["schedule", "lstm", "--batch", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_loop"].startswith("persistent (CUDA cores)")
    assert main(["schedule", "min_gru", "--batch", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_loop"] == "scan"


@needs_cxx
@pytest.mark.parametrize("words", [mma.RESIDENT_WORDS, 0], ids=["registers", "shared"])
@pytest.mark.parametrize("cell, B, dtype, tc, H, G", [
    ("lstm", 16, "bfloat16", None, 16, 4), ("gru", 20, "float16", None, 16, 4), ("lstm", 33, "bfloat16", None, 16, 4),
    ("lstm", 1, "bfloat16", True, 16, 4), ("gru", 5, "float16", True, 16, 4), ("lstm", 8, "bfloat16", True, 16, 4),
    ("lstm", 16, "bfloat16", None, 96, 4),      # shared: 12 tiles a block, 6 k-steps a warp; registers: k-groups
    ("lstm", 9, "float16", None, 160, 10),      # shared: 8 tiles, 2 warps a tile: 5 k-steps each
    ("gru", 12, "bfloat16", None, 40, 3)])      # uneven units (13, 13, 14 a block), K = 40 padded to 48
def test_tensor_core_kernels_compute_the_reference_on_the_cpu(cell, B, dtype, tc, H, G, words, monkeypatch):
    """mma.sync emulated (cuda_on_cpu.py), the grid barriers of G blocks at once, against numpy's loop; B ≤ 8 on
    tensor cores where asked (rows past B in the tile read, never stored); the weights' fragments in registers
    (resident.py: m-groups and k-groups of warps, the k-groups' sums added in shared memory), and, with no
    registers to spare, in shared memory (several k-steps a warp, warps sharing a tile's k-steps)."""
    pytest.importorskip("ml_dtypes")
    monkeypatch.setattr(mma, "RESIDENT_WORDS", words)
    got, want, be = emulated_against_numpy(load_cell(cell, 8, H), G=G, in_turn=False, B=B, T=5, dtype=dtype,
                                           tensor_cores=tc)
    assert_agree(got, want, dtype)
    assert ["mma.sync" in k.source for k in be.ran] == [True, True]
    assert ["weights in registers" in k.source for k in be.ran] == [bool(words)] * 2


@needs_cxx
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_resident_weights_with_x_staged_in_slices_compute_the_reference(dtype, monkeypatch):
    """x's rows wider than the staging budget: staged in equal slices, each warp's k-steps in every slice."""
    pytest.importorskip("ml_dtypes")
    monkeypatch.setattr(mma, "XS_RESIDENT_BYTES", 7000)      # the backward's 16 rows of 384 columns: 2 slices
    monkeypatch.setattr(mma, "XS_BYTES", 7000)
    got, want, be = emulated_against_numpy(load_cell("lstm", 8, 96), G=4, in_turn=False, B=16, T=5, dtype=dtype)
    assert_agree(got, want, dtype)
    assert ["weights in registers" in k.source for k in be.ran] == [True, True]
    assert "sl < 2;" in be.ran[1].source and "sl < 1;" in be.ran[0].source


def test_resident_weights_split_over_warps_by_the_words_they_move():
    """The split of a block's m-tiles and k-steps over its 16 warps (mma.resident): within the registers, the one
    moving the fewest words through shared memory a frame; k-groups take whole k-steps; no registers, no split."""
    c = load_cell("lstm", 768, 768)
    fwd, bwd = (next(p for g in phases(c, lp) for p in g if p.kind in ("pair", "dgemm")) for lp in loops(c))
    r = mma.resident(fwd, 16, 64, 16, 48, 2, "wf0")        # 48 rows (3 m-tiles) x 48 k-steps, x in 2 n-tiles
    assert (r.wm, r.wk, r.mtw, r.kpw, r.nti, r.words) == (3, 4, 1, 12, 2, 48)
    assert r.partials == 4 * 3 * 1 * 2 * mma.SUMS
    r = mma.resident(bwd, 16, 64, 16, 48, 2, "wf0")        # 12 units (one m-tile) x 192 k-steps
    assert (r.wm, r.wk, r.kpw) == (1, 16, 12)
    assert mma.resident(bwd, 16, 64, 16, 47, 2, "wf0") is None
    r = mma.resident(bwd, 32, 64, 16, 48, 2, "wf0")        # 32 rows of 3072 columns: x in 2 slices of 1536
    assert (r.slices, r.wk, r.kpw, r.nti) == (2, 16, 12, 4)
    assert mma.resident(bwd, 256, 64, 16, 48, 2, "wf0") is None     # 4 slices of 768 columns still too wide
    odd = load_cell("lstm", 24, 24)                        # K = 24 padded to 32: 2 k-steps
    p = next(p for g in phases(odd, loops(odd)[0]) for p in g if p.kind == "pair")
    r = mma.resident(p, 8, 4, 16, 48, 2, "wf0")            # 24 rows (2 m-tiles), one n-tile
    assert r.wk in (1, 2) and r.wm * r.mtw >= 2 and r.nti == 1 and r.words <= 48
    lay = mma.layout([fwd], 16, 64, 512)
    assert lay.weights == 0 and set(lay.resident) == {id(fwd)} and lay.partials == 4 * 3 * 2 * mma.SUMS
    both = mma.layout([fwd, bwd], 16, 64, 512)             # the registers taken by the first: the second's in shared
    assert set(both.resident) == {id(fwd)} and both.weights == 16 * (3072 + 8)


def test_registers_where_they_fit_else_shared_memory_and_both_compile():
    """The LSTM's weights in registers at H = 768, B = 16 on 64 blocks; at H = 1024 they need 64 registers a thread,
    more than RESIDENT_WORDS, so they sit in shared memory; both sources compile for sm_90."""
    for H, where in ((768, "weights in registers"), (1024, "tensor cores: the block's nq weight rows")):
        c = load_cell("lstm", H, H)
        for lp in loops(c):
            k = persistent_kernel(c, lp, "rg_bf16", 16, 64, tensor_cores=True)
            assert where in k.source
            nvrtc_compile(k.source, k.name)


def test_full_matrices_take_tensor_cores_from_a_measured_batch_or_where_asked(monkeypatch):
    import ml_dtypes
    from rnngraph.errors import RnnGraphError
    from rnngraph.run.backends.cuda.persistent.runner import TENSOR_CORES_FROM, full_tensor_cores
    c = load_cell("lstm", 32, 512)
    fwd, _ = loops(c)
    bf16 = ml_dtypes.bfloat16
    assert [full_tensor_cores(B, bf16) for B in (TENSOR_CORES_FROM - 1, TENSOR_CORES_FROM, 9)] == [False, True, True]
    assert not full_tensor_cores(9, np.float32)         # float32 in 3xTF32 from SPLIT_FROM's rows, by width
    assert [full_tensor_cores(B, np.float32, units=u) for B, u in ((31, 512), (32, 512), (15, 768), (16, 768))] == \
        [False, True, False, True]
    assert [full_tensor_cores(B, np.float32, units=256) for B in (3, 4)] == [False, True]
    assert not full_tensor_cores(9, np.float64)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", "1")
    assert full_tensor_cores(1, bf16) and full_tensor_cores(1, np.float32) and not full_tensor_cores(1, np.float64)
    assert chosen(c, fwd, 4, bf16, **H200).tensor_cores and chosen(c, fwd, 4, np.float32, **H200).split
    assert not chosen(c, fwd, 4, np.float32, **H200, tf32=True).split      # TF32 where allowed
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", "0")
    assert not full_tensor_cores(8, bf16) and full_tensor_cores(9, bf16)
    assert not full_tensor_cores(64, np.float32) and full_tensor_cores(64, np.float32, tf32=True)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", "yes")
    with pytest.raises(RnnGraphError, match="must be 1 or 0, got 'yes'"):
        full_tensor_cores(4, bf16)


def test_half_storage_forwards_hand_x_on_in_tagged_words_after_two_frames():
    """On tensor cores in half storage a forward's GEMM operand travels in 32-bit words above a 16-bit frame tag
    (kernels.py): no grid barrier from the launch's third frame on, the staging loading four words at once, as many
    loads in flight as the registers beside the weights' fragments allow (mma.TAGGED_WORDS); the backward, float32 in
    TF32 and head-wise kernels keep their barriers."""
    c = load_cell("lstm", 768, 768)
    fwd, bwd = loops(c)
    body = lambda k: k.source.split("__global__")[1]
    k = persistent_kernel(c, fwd, "rg_bf16", 16, 64)
    assert "if (t - 1 < 2) grid_barrier(count, ++barriers * G);" in body(k)
    assert body(k).count("grid_barrier(count") == 1 and "exchange_half<ST>(&XAT(" in body(k)
    assert "uint4 w[3];" in body(k) and ("unsigned int*", "xh") == (k.source.split("bar, ")[1][:13], k.args[0][0])
    assert "uint4 w[4];" in body(persistent_kernel(load_cell("lstm", 512, 512), loops(load_cell("lstm", 512, 512))[0],
                                                   "rg_f16", 16, 64))
    assert "rg_tagged4" not in body(persistent_kernel(c, bwd, "rg_bf16", 16, 64))
    assert "exchange_half" not in body(persistent_kernel(c, fwd, "float", 16, 64, tensor_cores=True))
    heads = load_cell("slstm", 64, 64, heads=4)
    assert "exchange_half" not in body(persistent_kernel(heads, loops(heads)[0], "rg_bf16", 32, 4))


@needs_cxx
@pytest.mark.parametrize("cell, B, rows, dtype", [("lstm", 16, 16, "bfloat16"), ("mgu", 32, 16, "float16"),
                                                  ("gru", 24, 8, "bfloat16")])
def test_tagged_words_compute_what_barriers_do_across_launches(cell, B, rows, dtype, monkeypatch):
    """Chunks of 4 frames (launches of 1, 4 and 4) and a second call with other inputs, ragged lengths: each launch
    finds the words of the one before in the buffer (tags from 0 again) and reads none of them; row groups index
    the words by their rows; MGU's second GEMM reads its operand in the same frame (tagged at lag 0). Every array
    is bit for bit the one the kernels with a barrier every frame compute (the same sums in the same order), and
    LSTM's and GRU's agree with numpy's loop within a rounding of the storage type."""
    pytest.importorskip("ml_dtypes")
    from test_loops import run_executor
    from test_persistent_heads import problem_arrays
    from rnngraph.run.backends import get_backend
    from rnngraph.run.backends.cuda.persistent import kernels
    from rnngraph.run.executor import Executor
    from cuda_on_cpu import Emulated
    c, made = load_cell(cell, 8, 16), {}
    every = kernels.exchanges
    for way in ("tagged", "barriers"):
        if way == "barriers":
            monkeypatch.setattr(kernels, "exchanges", lambda *a: {} if a[-1] else every(*a))
        be = Emulated(4, "groups", rows, tensor_cores=True)
        ex = Executor(c, be, loop="persistent", chunk=4)
        made[way] = [run_executor(ex, *problem_arrays(c, 9, B, dtype, seed=seed), np.arange(B) * 5 % 10)
                     for seed in (0, 1)]
        assert sum("rg_tagged4(&XAT" in k.source for k in be.ran) == (6 if way == "tagged" else 0)     # forwards
        assert be.walked[:3] == [1, 4, 4] and {k.row_groups for k in be.ran} == {B // rows}
    for tagged, barriers in zip(made["tagged"], made["barriers"]):
        for a, b in zip(tagged, barriers, strict=True):
            assert np.array_equal(a, b)
    if cell != "mgu":           # its half-precision gradients differ from numpy's by more than a rounding at T = 9
        ref = Executor(c, get_backend("numpy"), loop="stages", chunk=4)
        assert_agree(made["tagged"][1], run_executor(ref, *problem_arrays(c, 9, B, dtype, seed=1),
                                                     np.arange(B) * 5 % 10), dtype)


def test_aligned_rows_stage_in_bulk_copies_where_columns_lie_as_read():
    """staging.py: a full-matrix phase whose K needs no pad columns stages each row of its slice in one bulk copy (TMA),
    the block's mbarrier made once before the first __syncthreads; a phase with pad columns (the forward at H = 24,
    K = 24 padded to 32) keeps 16-byte copies (its backward, K = 96, copies in bulk), as do head-wise phases (a head's
    columns) and kernels on CUDA cores."""
    def body(name, H, B, ctype, G, way, **kw):     # the forward (way 0) or backward's kernel
        c = load_cell(name, H, H, **kw)
        return persistent_kernel(c, loops(c)[way], ctype, B, G, 1, ctype != "double").source.split("__global__")[1]
    c = load_cell("lstm", 64, 64)
    k = persistent_kernel(c, loops(c)[1], "rg_bf16", 16, 8, 1, True)
    assert k.static_smem == 16 and k.shared == k.smem + 16      # the mbarrier: static shared memory, fitted in too
    bulk = body("lstm", 64, 16, "rg_bf16", 8, 1)
    assert bulk.count("rg_bulk_init(&rg_bulk);") == 1 and bulk.index("rg_bulk_init") < bulk.index("__syncthreads")
    assert "rg_bulk_copy(&xh[b * 264], &AT(" in bulk and "kw * 2, &rg_bulk);" in bulk      # K = 256: XLD 256 + 8
    assert "rg_bulk_wait(&rg_bulk, rg_phase);" in bulk
    padded = body("lstm", 24, 16, "rg_bf16", 8, 0)
    assert "rg_bulk" not in padded and "rg_copy16(" in padded
    assert "rg_bulk_copy(&xh[b * 104], &AT(" in body("lstm", 24, 16, "rg_bf16", 8, 1)
    assert "rg_bulk" not in body("slstm", 64, 32, "rg_bf16", 4, 1, heads=4)
    assert "rg_bulk" not in body("lstm", 64, 8, "double", 8, 1)
    assert persistent_kernel(c, loops(c)[1], "double", 8, 8).static_smem == 0
