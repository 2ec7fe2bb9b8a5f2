"""The persistent loop on tensor cores (run/backends/cuda/persistent/mma.py: half storage, 4 <= B <= 256)
against the CPU half-precision reference, within the bounds the half-precision tests use (test_gpu_half):
every built-in cell with a GEMM core, batch sizes around the 16-row tiles, sizes that pad K, ragged and
chunked calls, replays after an in-place update, bit-identical gradients run to run, and the fallbacks."""
import numpy as np
import pytest

from test_gpu_half import PERSISTENT, agree, half_pair
from test_gpu_loops import agree as agree_float, calls, pair

pytestmark = pytest.mark.gpu


def on_tensor_cores(layer):
    assert layer.loop_strategy == "persistent", layer.loop_note


@pytest.mark.parametrize("B", [9, 64])
@pytest.mark.parametrize("cell", PERSISTENT)
def test_every_gemm_core_cell_on_tensor_cores(cell, B):
    ref, gpu = half_pair(cell, "bfloat16", "graph", hidden=64, size=24, loop="persistent")
    x = np.random.default_rng(B).standard_normal((23, B, 24))
    lengths = np.random.default_rng(0).integers(1, 24, size=B)
    agree(ref, gpu, [x], lengths, "bfloat16", f"{cell} B={B} ragged")
    on_tensor_cores(gpu)
    agree(ref, gpu, [x[:9], x[9:]], None, "bfloat16", f"{cell} B={B} chunked")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("B,H", [(16, 512), (100, 512), (256, 512), (7 * 9, 1000), (256, 1000)])
def test_lstm_batches_and_sizes(B, H, dtype):
    """B = 100: seven tiles, the last one padded; H = 1000: K padded to 1008 and an uneven split over blocks."""
    ref, gpu = half_pair("lstm", dtype, "graph", hidden=H, size=32, loop="persistent")
    x = np.random.default_rng(H + B).standard_normal((7, B, 32))
    agree(ref, gpu, [x, x[:1]], None, dtype, f"B={B} H={H}")
    on_tensor_cores(gpu)


def test_a_hundred_frames_and_a_bidirectional_stack():
    ref, gpu = half_pair("lstm", "bfloat16", "graph", hidden=512, size=64, loop="persistent", num_layers=2,
                         bidirectional=True)
    x = np.random.default_rng(5).standard_normal((100, 64, 64))
    agree(ref, gpu, [x], np.array([100, 37] * 32), "bfloat16", "T=100 B=64")
    on_tensor_cores(gpu)


def test_gradients_are_bit_identical_run_to_run_and_replays_see_updates():
    import cupy
    _, gpu = half_pair("gru", "bfloat16", "graph", hidden=256, size=32, loop="persistent")
    x = np.random.default_rng(1).standard_normal((20, 48, 32))
    first, second = (calls(gpu, [x], None, cupy, gpu.dtype) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    ref, gpu = half_pair("lstm", "bfloat16", "graph", hidden=128, size=32, loop="persistent")
    agree(ref, gpu, [x], None, "bfloat16", "before")
    for p, q in zip(ref.parameters().values(), gpu.parameters().values()):
        p[...] = (p.astype(np.float32) * 0.5).astype(p.dtype)
        q[...] = (q.astype(cupy.float32) * 0.5).astype(q.dtype)    # in place: the recording reads the same arrays
    agree(ref, gpu, [x], None, "bfloat16", "after an in-place update")
    on_tensor_cores(gpu)


def test_beyond_the_tensor_core_limits_it_says_why(monkeypatch):
    import cupy
    big = half_pair("lstm", "bfloat16", "graph", hidden=64, size=8, loop="persistent")[1]
    big(cupy.zeros((3, 300, 8), big.dtype))
    assert big.loop_strategy == "stages" and "takes at most 256" in big.loop_note
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", "0")     # float32 on CUDA cores, not in 3xTF32
    f32 = half_pair("lstm", "float32", "graph", hidden=512, size=8, loop="persistent")[1]
    f32(cupy.zeros((3, 64, 8), "float32"))      # 8 groups of 8 rows on CUDA cores: 256 KiB of weights a block
    assert f32.loop_strategy == "stages" and "KiB of shared memory" in f32.loop_note


@pytest.mark.parametrize("dtype, B, rows", [("bfloat16", 64, None), ("float16", 48, 8), ("float32", 16, None),
                                            ("float32", 40, 4)])
def test_full_matrices_in_row_groups(dtype, B, rows, monkeypatch):
    """Row groups (runner.full_groups): each group of blocks meets at its own barriers; ragged, chunked, and
    bit-identical run to run."""
    import cupy
    if rows:
        monkeypatch.setenv("RNNGRAPH_PERSISTENT_ROWS", str(rows))
    half = dtype != "float32"           # float32 against the float64 reference, within 1e-4
    ref, gpu = half_pair("lstm", dtype, "graph", hidden=256, size=32, loop="persistent") if half else \
        pair("lstm", "persistent", 32, 256, dtype, "graph")
    check = agree if half else agree_float
    x = np.random.default_rng(B).standard_normal((30, B, 32))
    check(ref, gpu, [x], np.arange(B) % 31, dtype, f"B={B} ragged")
    check(ref, gpu, [x[:20], x[20:]], None, dtype, f"B={B} chunked")
    on_tensor_cores(gpu)
    from rnngraph.run.backends.cuda.persistent import runner
    assert any(k.row_groups == B // (rows or {"float32": 8}.get(dtype, 16)) and k.cooperative
               for _, k in runner._KERNELS.values())
    first, second = (calls(gpu, [x], None, cupy, gpu.dtype) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_auto_runs_tensor_cores_where_they_measured_faster_and_stages_beyond():
    import cupy
    layer = half_pair("lstm", "bfloat16", "graph", hidden=64, size=8)[1]        # loop 'auto'
    layer(cupy.zeros((3, 16, 8), layer.dtype))
    on_tensor_cores(layer)
    layer(cupy.zeros((3, 64, 8), layer.dtype))        # 8 groups of 8 rows
    on_tensor_cores(layer)
    layer(cupy.zeros((3, 128, 8), layer.dtype))       # 16 groups of 8 rows
    on_tensor_cores(layer)
    layer(cupy.zeros((3, 256, 8), layer.dtype))
    assert layer.loop_strategy == "stages" and "measured no faster than stages" in layer.loop_note


@pytest.mark.parametrize("cell, B, H", [("lstm", 16, 512), ("lstm", 64, 512), ("gru", 100, 256), ("mgu", 5, 1000)])
def test_float32_in_tf32_on_tensor_cores(cell, B, H):
    """TF32 allowed (the backend's tf32=True, as torch's allow_tf32): float32 runs on tensor cores (m16n8k8), each
    array within the TF32 bound of the float64 reference (test_tf32.TF32_BOUND: a GEMM's inputs rounded within
    2⁻¹¹, a few units of 2⁻¹⁰ over the step), visibly rounded (beyond float32's 1e-5), ragged and chunked, and
    bit-identical run to run. B = 64 at H = 512 runs in 4 groups of 16 rows, where CUDA cores' weights do not fit."""
    import cupy

    from rnngraph.nn.recurrent import Recurrent
    from rnngraph.run.backends import get_backend
    from rnngraph.run.backends.cuda.persistent import runner
    from test_tf32 import TF32_BOUND
    ref = Recurrent(cell, 32, H, dtype="float64", loop="stages", seed=1)
    gpu = Recurrent(cell, 32, H, backend=get_backend("cupy", "graph", tf32=True), dtype="float32", loop="persistent")
    gpu.load_state_dict({k: cupy.asarray(v.astype("float32")) for k, v in ref.state_dict().items()})
    x = np.random.default_rng(B).standard_normal((23, B, 32))
    for xs, lengths in (([x], np.arange(B) % 24), ([x[:9], x[9:]], None)):
        got, want = calls(gpu, xs, lengths, cupy, "float32"), calls(ref, xs, lengths, np, "float64")
        errors = [np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300) for a, b in zip(got, want, strict=True)]
        assert 1e-5 < max(errors) <= TF32_BOUND, errors
    on_tensor_cores(gpu)
    assert any(k.tensor_cores and "m16n8k8" in k.source for _, k in runner._KERNELS.values())
    first, second = (calls(gpu, [x], None, cupy, "float32") for _ in range(2))
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cell, B, H, asked", [("lstm", 64, 512, None), ("gru", 32, 256, None),
                                              ("mgu", 16, 1000, None), ("peephole_lstm", 9, 64, "1")])
def test_float32_without_tf32_in_3xtf32_on_tensor_cores(cell, B, H, asked, monkeypatch):
    """TF32 not allowed: float32 runs on tensor cores in 3xTF32 from runner.SPLIT_FROM's rows (B = 9 where asked,
    RNNGRAPH_PERSISTENT_TENSOR_CORES=1), each array within 1e-5 of the float64 reference: a product within about
    3·2⁻²² relative (float32 rounds it within 2⁻²⁴), the sums in float32, so a step's arrays err by a few 1e-7, as
    on CUDA cores, where TF32's err by more than 1e-5 (the test above). Ragged and chunked, bit-identical run to
    run."""
    import cupy

    from rnngraph.nn.recurrent import Recurrent
    from rnngraph.run.backends.cuda.persistent import runner
    if asked:
        monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", asked)
    runner._KERNELS.clear()             # the kernels this test's layer builds, and no others
    ref = Recurrent(cell, 32, H, dtype="float64", loop="stages", seed=1)
    gpu = Recurrent(cell, 32, H, backend="cupy", mode="graph", dtype="float32", loop="persistent")
    gpu.load_state_dict({k: cupy.asarray(v.astype("float32")) for k, v in ref.state_dict().items()})
    x = np.random.default_rng(B).standard_normal((23, B, 32))
    for xs, lengths in (([x], np.arange(B) % 24), ([x[:9], x[9:]], None)):
        got, want = calls(gpu, xs, lengths, cupy, "float32"), calls(ref, xs, lengths, np, "float64")
        errors = [np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300) for a, b in zip(got, want, strict=True)]
        assert max(errors) <= 1e-5, errors
    on_tensor_cores(gpu)
    made = [k for _, k in runner._KERNELS.values()]
    assert made and all(k.split and k.tensor_cores and "rg_mma3(acc" in k.source for k in made)
    first, second = (calls(gpu, [x], None, cupy, "float32") for _ in range(2))
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_tf32_needs_cublas():
    from rnngraph.errors import RnnGraphError
    from rnngraph.run.backends import get_backend
    with pytest.raises(RnnGraphError, match="tf32=True needs cuBLAS"):
        get_backend("cupy", "graph", matmul="own", tf32=True)
