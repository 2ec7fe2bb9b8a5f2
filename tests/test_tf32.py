"""float32 persistent kernels on tensor cores in TF32, without a GPU: only where TF32 is allowed (the backend's cuBLAS
setting, as torch's allow_tf32), full matrices, mma.sync m16n8k8 with x and the weights rounded to TF32 (to
nearest, ties away: cvt.rna) and float32 sums. Run by the emulator (cuda_on_cpu.py) against numpy's float32 loop.

The bound: an MMA's inputs are each rounded within u = 2⁻¹¹ relative, so a product is within 2u + u² and a GEMM's
output within 2⁻¹⁰ of Σ|x·w| (the float32 sums add ~K·2⁻²⁴, far less); over the arrays of a step (the states
carry a frame's error into the next, the gates' sigmoids and tanh at most pass it on) the relative error of each
array stays within a few such units: TF32_BOUND = 4 · 2⁻¹⁰. float32 on CUDA cores stays within 1e-4, and TF32
is seen to round: its error is above float32's."""
import numpy as np
import pytest

from cuda_on_cpu import Emulated, emulated_mma, needs_cxx
from rnngraph import load_cell
from rnngraph.errors import RnnGraphError
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cuda.persistent import mma
from rnngraph.run.backends.cuda.persistent.kernels import persistent_kernel
from rnngraph.run.backends.cuda.persistent.runner import chosen, full_tensor_cores, gpu_loop
from rnngraph.run.executor import Executor
from test_loops import run_executor
from test_persistent import loops
from test_persistent_heads import HEAD_CELLS, problem_arrays

TF32_BOUND = 4 * 2.0 ** -10
H200 = dict(sms=132, smem=227 * 1024)


def relative_errors(got, want) -> list:
    return [np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-300)
            for a, b in zip(got, want, strict=True)]


def run_tf32(cell, B, rows, T=7, chunk=None, G=3):
    """(every array of a forward and backward by the emulated TF32 kernels, row groups of `rows` one after another,
    the same by numpy 'stages' in float32, the backend); lengths ragged."""
    be = Emulated(G, "groups", rows, tensor_cores=True)
    args, lengths = problem_arrays(cell, T, B, "float32"), np.arange(B) * 5 % (T + 1)
    got = run_executor(Executor(cell, be, loop="persistent", chunk=chunk), *args, lengths)
    ref = Executor(cell, get_backend("numpy"), loop="stages", chunk=chunk)
    return got, run_executor(ref, *args, lengths), be


@needs_cxx
@pytest.mark.parametrize("name, B, rows, chunk", [("lstm", 16, 16, None), ("gru", 20, 10, None),
                                                  ("peephole_lstm", 7, 7, None), ("mgu", 32, 16, 3)])
def test_tf32_kernels_compute_the_reference_within_tf32s_rounding(name, B, rows, chunk):
    """One group (B = 16; B = 7 a tile of 16 rows, 9 masked) and row groups (B = 20, 32), ragged, chunked."""
    cell = load_cell(name, 24, 40)          # K = 24 and 40: a k-step of 8 and a padded one
    got, want, be = run_tf32(cell, B, rows, chunk=chunk)
    errors = relative_errors(got, want)
    assert max(errors) <= TF32_BOUND, errors
    assert max(errors) > 1e-5, "no TF32 rounding seen"      # float32 on CUDA cores agrees to ~1e-7
    runs = 2 if chunk is None else 6
    assert [(k.row_groups, k.tensor_cores, k.resident) for k in be.ran] == [(B // rows, True, True)] * runs
    assert all("mma.sync" not in k.source or "m16n8k8" in k.source for k in be.ran)


def test_tf32_kernel_source(monkeypatch):
    """m16n8k8 on TF32, weights rounded once as they are loaded (into registers, or shared memory where no
    registers are spared), x as it enters the MMA, a bulk copy of each staged row's floats, rows padded by 4 floats (a
    warp's fragment loads in distinct banks)."""
    cell = load_cell("lstm", 64, 64)
    k = persistent_kernel(cell, loops(cell)[0], "float", 16, 8, 1, True)
    src = k.source
    assert k.tensor_cores and "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in src
    assert "v = rg_tf32(__float_as_uint(" in src and "rg_tf32((n * 8 + g < NB ? xw[(n * 8 + g) * 68 + kw]" in src
    monkeypatch.setattr(mma, "RESIDENT_WORDS", 0)
    k = persistent_kernel(cell, loops(cell)[0], "float", 16, 8, 1, True)
    src = k.source
    assert "cvt.rna.tf32.f32" in src and "= rg_tf32f(" in src
    assert "rg_mma(acc[i], rg_tf32(x0[h]), rg_tf32(x8[h]), rg_tf32(x0[h + 4]), rg_tf32(x8[h + 4]), w[h], w[h + 4]);" in src
    assert "c = (lane & 3) * 1;" in src and "h < kw / 1;" in src
    assert "q * 68 + k] = rg_tf32f(" in src                 # WLD = 64 + 4
    assert "rg_bulk_copy(&xh[b * 68], &AT(pp14, ld14, 1, k0), kw * 4, &rg_bulk);" in src
    half = persistent_kernel(cell, loops(cell)[0], "rg_bf16", 16, 8, 1, True).source
    assert "m16n8k16" in half and "rg_tf32" not in half and "q * 72 + k]" in half


def test_tf32_only_where_asked_and_for_full_matrices():
    cell = load_cell("lstm", 64, 64)
    with pytest.raises(RnnGraphError, match="internal"):     # float32 beyond 8 rows, tensor cores not asked for
        persistent_kernel(cell, loops(cell)[0], "float", 16, 8, 1, None)
    with pytest.raises(RnnGraphError, match="internal"):
        persistent_kernel(cell, loops(cell)[0], "double", 16, 8, 1, True)
    heads = HEAD_CELLS["mh_lstm"]()
    with pytest.raises(RnnGraphError, match="internal"):
        persistent_kernel(heads, loops(heads)[0], "float", 16, 12, 1, True)
    assert not full_tensor_cores(16, np.float32) and full_tensor_cores(16, np.float32, tf32=True)
    assert full_tensor_cores(4, np.float32, tf32=True) and not full_tensor_cores(2, np.float32, tf32=True)
    assert not full_tensor_cores(16, np.float64, tf32=True)


def test_which_kernel_a_gpu_runs_in_float32_with_tf32(monkeypatch):
    """TF32 lifts float32's groups of 8 rows on CUDA cores to the tensor cores' 16, so B = 64 at H = 512 fits (on
    CUDA cores its weights do not); without TF32 it runs there in 3xTF32 (test_3xtf32_kernels_...)."""
    for name in ("RNNGRAPH_PERSISTENT_ROWS", "RNNGRAPH_PERSISTENT_BLOCKS", "RNNGRAPH_PERSISTENT_TENSOR_CORES"):
        monkeypatch.delenv(name, raising=False)
    cell = load_cell("lstm", 512, 512)
    loop = loops(cell)[0]
    assert gpu_loop(cell, loop, 64, np.float32, **H200) == "persistent (tensor cores in 3xTF32, 4 groups of 16 rows)"
    assert gpu_loop(cell, loop, 64, np.float32, **H200, tf32=True) == \
        "persistent (tensor cores in TF32, 4 groups of 16 rows)"
    assert gpu_loop(cell, loop, 16, np.float32, **H200) == "persistent (CUDA cores, 2 groups of 8 rows)"
    assert gpu_loop(cell, loop, 16, np.float32, **H200, tf32=True) == \
        "persistent (tensor cores in TF32, weights in registers, 2 groups of 8 rows)"
    assert gpu_loop(cell, loop, 4, np.float32, **H200, tf32=True) == \
        "persistent (tensor cores in TF32, weights in registers)"
    assert gpu_loop(cell, loop, 2, np.float32, **H200, tf32=True) == "persistent (CUDA cores)"
    assert gpu_loop(cell, loop, 16, np.float32, **H200, mma=False, tf32=True) == \
        "persistent (CUDA cores, 2 groups of 8 rows)"     # no tensor cores on the GPU: as without TF32
    k = chosen(cell, loop, 64, np.float32, **H200, tf32=True)
    assert k.smem <= H200["smem"] and k.tensor_cores and k.row_groups == 4


@needs_cxx
@pytest.mark.parametrize("words", [mma.RESIDENT_WORDS, 0], ids=["registers", "shared"])
@pytest.mark.parametrize("name, B, rows", [("lstm", 16, 16), ("gru", 20, 10), ("mgu", 7, 7)])
def test_3xtf32_kernels_compute_the_reference_within_float32s_rounding(name, B, rows, words, monkeypatch):
    """TF32 not allowed: the weights kept as float32 (in registers, or in shared memory where no registers are
    spared), each operand split into big + small TF32 parts as it enters the MMA, three MMAs (mma.SPLIT). A product
    is then within about 3·2⁻²² relative and the sums float32, so every array of a step agrees with numpy's float32
    loop within 1e-5 (float32 on CUDA cores: ~1e-7), where TF32's err by more than 1e-5 (above)."""
    monkeypatch.setattr(mma, "RESIDENT_WORDS", words)
    cell = load_cell(name, 24, 40)
    be = Emulated(3, "groups", rows, tensor_cores=True, split=True)
    args, lengths = problem_arrays(cell, 7, B, "float32"), np.arange(B) * 5 % 8
    got = run_executor(Executor(cell, be, loop="persistent"), *args, lengths)
    want = run_executor(Executor(cell, get_backend("numpy"), loop="stages"), *args, lengths)
    assert max(relative_errors(got, want)) <= 1e-5, relative_errors(got, want)
    assert all(k.split and k.tensor_cores and k.resident == bool(words) for k in be.ran) and len(be.ran) == 2
    src = be.ran[0].source
    assert "rg_mma3(acc" in src and "rg_mma(acc" not in src and "m16n8k8" in src
    assert "rg_tf32(x0[h])" not in src and "= rg_tf32f(" not in src and "v = rg_tf32(" not in src  # float32 kept


def test_3xtf32_only_on_float32_tensor_cores():
    cell = load_cell("lstm", 64, 64)
    with pytest.raises(RnnGraphError, match="internal"):
        persistent_kernel(cell, loops(cell)[0], "rg_bf16", 16, 8, 1, True, split=True)
    with pytest.raises(RnnGraphError, match="internal"):
        persistent_kernel(cell, loops(cell)[0], "float", 8, 8, 1, False, split=True)
    k = chosen(cell, loops(cell)[0], 64, np.float32, **H200)
    assert k.split and not chosen(cell, loops(cell)[0], 64, np.float32, **H200, tf32=True).split


@needs_cxx
def test_3xtf32_splits_round_as_cvt_rna_and_add_up_to_the_float32():
    """rg_split's integer rounding (mma.SPLIT) gives cvt.rna's TF32 for finite values (the emulator's rg_tf32, checked
    above), and big + small holds the float32 within 2⁻²² of it."""
    import ctypes
    from cuda_on_cpu import PRELUDE, compiled
    lib = compiled(PRELUDE + emulated_mma("tf32") + mma.SPLIT + 'extern "C" void s(unsigned x, unsigned* o) '
                   '{ rg_split(x, o[0], o[1]); o[2] = rg_tf32(x); }\n')
    lib.s.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_uint)]
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000),
                         np.float32(1) + np.arange(16) * np.float32(2 ** -23)]).astype(np.float32)
    out = (ctypes.c_uint * 3)()
    for x in xs:
        lib.s(int(x.view(np.uint32)), out)
        big, small = np.uint32(out[0]).view(np.float32), np.uint32(out[1]).view(np.float32)
        assert out[0] == out[2] and out[0] & 0x1fff == 0 and out[1] & 0x1fff == 0
        assert abs(np.float64(big) + np.float64(small) - np.float64(x)) <= 2.0 ** -22 * abs(np.float64(x))


@needs_cxx
def test_emulated_tf32_rounding_is_to_nearest_ties_away():
    """The emulator's cvt.rna.tf32.f32 (the GPU test checks the GPU's own against the same bound)."""
    import ctypes
    from cuda_on_cpu import PRELUDE, compiled
    lib = compiled(PRELUDE + emulated_mma("tf32") + 'extern "C" unsigned r(unsigned x) { return rg_tf32(x); }\n')
    lib.r.restype, lib.r.argtypes = ctypes.c_uint, [ctypes.c_uint]
    one = np.float32(1).view(np.uint32)
    cases = {one: one, one + 0xfff: one, one + 0x1000: one + 0x2000, one + 0x1001: one + 0x2000,
             one | 0x80000000 | 0x1000: (one + 0x2000) | 0x80000000, np.float32(np.inf).view(np.uint32): 0x7f800000}
    assert {int(a): lib.r(int(a)) for a in cases} == {int(a): int(b) for a, b in cases.items()}
    assert mma.K_STEP["tf32"] == 8


def test_the_backend_s_cublas_setting_allows_tf32():
    """runner.allows_tf32 reads the backend's cuBLAS handle (CupyBackend(tf32=True), rnngraph.torch, bench --tf32); a
    backend without one (numpy, the cpu backend, matmul='own') never allows it."""
    from types import SimpleNamespace

    from rnngraph.run.backends.cuda.persistent.runner import allows_tf32
    assert allows_tf32(SimpleNamespace(blas=SimpleNamespace(tf32=True)))
    assert not allows_tf32(SimpleNamespace(blas=SimpleNamespace(tf32=False)))
    assert not allows_tf32(SimpleNamespace(blas=None)) and not allows_tf32(get_backend("numpy"))
