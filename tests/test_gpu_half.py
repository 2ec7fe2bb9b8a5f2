"""Half precision (bfloat16, float16) on the GPU against the CPU half-precision reference (numpy and ml_dtypes:
float32 arithmetic, each stored value rounded once, run/backends/base.py): every built-in cell, staged and
graph mode, cuBLAS GemmEx and rnngraph's own GEMMs, ragged and chunked calls, and overflow named by op.

The two differ only where float32 results differ (a GEMM's summation order, expf and tanhf against numpy's,
in bfloat16 their fast approximations: source.options)
and a rounding falls the other way: one unit in the last place of the half value, which the recurrence
can carry a few frames on. So each array is held to a few units of the format's rounding unit u (2^-8
bfloat16, 2^-11 float16), relative to its 2-norm, not to float32's 1e-4."""
import numpy as np
import pytest

from rnngraph import CELLS
from rnngraph.arrays import float_dtype
from rnngraph.errors import RnnGraphError
from rnngraph.nn.recurrent import Recurrent
from rnngraph.run.backends import get_backend
from test_gpu_loops import calls

pytestmark = pytest.mark.gpu
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
UNITS = 4           # the bound on each array's relative 2-norm difference, in units of the format's u
# ... where a layer norm sums rows in another order (a block-wide tree against numpy's pairwise sum) and then
# subtracts nearly equal values (x − μ), which magnifies a flipped rounding: up to 5.2 u measured
NORM_UNITS = 8


def half_pair(cell, dtype, mode, hidden=16, size=5, backend="cupy", **options):
    """(numpy half-precision reference layer, GPU layer) with the same half-precision parameters."""
    import cupy
    ref = Recurrent(cell, size, hidden, dtype=dtype, seed=1, **options)
    gpu = Recurrent(cell, size, hidden, backend=backend, dtype=dtype, mode=mode, **options)
    gpu.load_state_dict({k: cupy.asarray(v) for k, v in ref.state_dict().items()})
    return ref, gpu


def agree(ref, gpu, xs, lengths, dtype, what):
    import cupy
    dt = float_dtype(dtype, half=True)
    bound = NORM_UNITS if gpu.cell.name.startswith("layernorm") else UNITS
    for k, (a, b) in enumerate(zip(calls(gpu, xs, lengths, cupy, dt), calls(ref, xs, lengths, np, dt), strict=True)):
        err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30) / UNIT[dtype]
        assert err <= bound, f"{what}: array {k} differs by {err:.2f} u (relative 2-norm) > {bound} u"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", ["staged", "graph"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_builtins_match_the_cpu_half_reference(cell, mode, dtype):
    ref, gpu = half_pair(cell, dtype, mode, num_layers=2, bidirectional=True)
    x = np.random.default_rng(3).standard_normal((19, 3, 5))
    agree(ref, gpu, [x], np.array([19, 11, 1]), dtype, f"{cell}/{mode} ragged")
    agree(ref, gpu, [x[:7], x[7:14], x[14:]], None, dtype, f"{cell}/{mode} chunked")     # graph: replays


@pytest.mark.parametrize("B", [1, 8, 64])
def test_lstm_at_bench_sizes_in_bfloat16(B):
    """H = 512: GemmEx on tensor cores over K = 512, the GEMV inside the fused kernel (B ≤ 8), replays."""
    ref, gpu = half_pair("lstm", "bfloat16", "graph", hidden=512, size=64)
    agree(ref, gpu, [np.random.default_rng(B).standard_normal((30, B, 64))], None, "bfloat16", f"B={B}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_own_gemm_kernels_in_half(dtype):
    """Graph mode with rnngraph's own GEMV and GEMM kernels in place of cuBLAS inside the time loop."""
    ref, gpu = half_pair("gru", dtype, "graph", backend=get_backend("cupy", "graph", matmul="own"))
    x = np.random.default_rng(4).standard_normal((11, 12, 5))       # B = 12: the tiled GEMM, not the GEMV
    agree(ref, gpu, [x], None, dtype, "own gemm")
    agree(ref, gpu, [x[:, :3]], None, dtype, "own gemv")


PERSISTENT = ["lstm", "gru", "mgu", "peephole_lstm", "cifg_lstm", "rnn_tanh", "rnn_relu"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("cell", PERSISTENT)
def test_persistent_kernels_in_half(cell, B, dtype):
    """One cooperative kernel a direction, weights on chip in half precision, GEMM sums read as stored."""
    ref, gpu = half_pair(cell, dtype, "graph", hidden=256, size=32, loop="persistent")
    x = np.random.default_rng(B).standard_normal((23, B, 32))
    agree(ref, gpu, [x], None, dtype, f"{cell} B={B}")
    assert gpu.loop_strategy == "persistent", gpu.loop_note
    agree(ref, gpu, [x[:9], x[9:]], None, dtype, f"{cell} B={B} chunked")


def test_half_weights_fit_where_float32_ones_do_not():
    """H = 1700: float32's LSTM weights exceed an H200 block's shared memory, bfloat16's fit."""
    import cupy
    layers = {dt: Recurrent("lstm", 64, 1700, backend="cupy", dtype=dt, mode="graph") for dt in ("float32", "bfloat16")}
    for dt, layer in layers.items():
        layer(cupy.zeros((3, 1, 64), dtype=layer.dtype))
    assert layers["bfloat16"].loop_strategy == "persistent", layers["bfloat16"].loop_note
    assert layers["float32"].loop_strategy == "stages" and "shared memory" in layers["float32"].loop_note


def test_float16_overflow_is_named_by_op_on_the_gpu():
    """As on the CPU (test_errors_nn.py): an overflow the gates' saturation hides from the output is found."""
    import cupy
    _, gpu = half_pair("lstm", "float16", "staged", num_layers=2, bidirectional=True)
    gpu.parameters()["weight_ih_l0_reverse"][...] = 100.0
    x = np.ones((9, 2, 5), "float16")
    x[3] = 300.0
    y, _ = gpu(cupy.asarray(x))
    assert bool(cupy.isfinite(y.astype(cupy.float32)).all())
    gpu.check_finite = True
    with pytest.raises(RnnGraphError, match=r"layer 0 \(reverse direction.*op 'linear1' \(linear\) at frame 5;"
                                            r".*65504"):
        gpu(cupy.asarray(x))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_training_on_the_gpu_follows_the_cpu_run(small_text, tmp_path, dtype):
    """The char-LM with a half-precision recurrence, float32 masters and (float16) loss scaling, in graph
    mode: its losses follow the CPU half-precision run's; the first one (before any update) to a few u."""
    from rnngraph.train.loop import train
    from rnngraph.train.sample import generate, load_model
    from test_train import QUIET, tiny
    runs = {b: train(tiny(small_text, tmp_path / b, backend=b, mode=m, dtype=dtype, layers=2, max_steps=12), **QUIET)
            for b, m in (("numpy", "staged"), ("cupy", "graph"))}
    got, want = ([r["loss"] for r in runs[b].history] for b in ("cupy", "numpy"))
    assert runs["cupy"].backend == "cupy" and abs(got[0] - want[0]) <= UNITS * UNIT[dtype] * want[0]
    np.testing.assert_allclose(got, want, rtol=0.02)
    lm, vocab = load_model(runs["cupy"].checkpoint, "cupy", "graph")
    assert len(generate(lm, vocab, "Ham", 30)) == 30


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_torch_module_in_half_on_cuda_follows_the_cpu_module(dtype):
    """rnngraph.torch with half CUDA tensors (shared with cupy without copies, bfloat16 as its bits)."""
    torch = pytest.importorskip("torch")
    import rnngraph.torch as rt
    tdt = getattr(torch, dtype)
    torch.manual_seed(0)
    cpu = rt.LSTM(5, 16, num_layers=2, bidirectional=True).to(tdt)
    gpu = rt.LSTM(5, 16, num_layers=2, bidirectional=True).to("cuda", tdt)
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(9, 3, 5).to(tdt)
    out = {}
    for name, m, xx in (("cpu", cpu, x.clone().requires_grad_()), ("gpu", gpu, x.cuda().requires_grad_())):
        y, (h, c) = m(xx)
        assert y.dtype == tdt and y.device == xx.device
        (y.float().pow(2).sum() + h.float().sum()).backward()
        out[name] = [a.detach().cpu().double() for a in (y, h, c, xx.grad, *(p.grad for p in m.parameters()))]
    for k, (a, b) in enumerate(zip(out["gpu"], out["cpu"], strict=True)):
        err = float((a - b).norm() / b.norm()) / UNIT[dtype]
        assert err <= UNITS, f"array {k} differs by {err:.2f} u > {UNITS} u"


def test_bench_runs_in_bfloat16_on_the_gpu():
    """`rnngraph bench --dtype bfloat16`: rnngraph's graph mode in bfloat16 beside cuDNN in float16."""
    from rnngraph.lab.bench import measure
    ours = measure("lstm", "graph", T=6, B=2, H=32, dtype="bfloat16", repeats=2, warmup=1)
    peer = measure("lstm", "cudnn@float16", T=6, B=2, H=32, dtype="bfloat16", repeats=2, warmup=1)
    assert ours["backend"] == "cupy" and ours["dtype"] == "bfloat16" and ours["train_ms"] > 0
    assert ours["loop_strategy"] == "persistent"
    assert peer.get("skipped") or (peer["dtype"] == "float16" and peer["impl"] == "cudnn@float16" and peer["train_ms"] > 0)
