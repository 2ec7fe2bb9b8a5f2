"""Half precision on the CPU reference (bfloat16 through ml_dtypes, float16): storage in half, arithmetic in
float32, each stored value rounded once, as the GPU kernels will do it. Exact where the rule is exact
(a fused group, a GEMM), within the dtype's precision of float64 for whole layers."""
import numpy as np
import pytest

from rnngraph import CELLS, Cell, RnnGraphError
from rnngraph.arrays import float_dtype
from rnngraph.ir.ops import OpKind
from rnngraph.nn import Recurrent
from rnngraph.plan.items import Fused
from rnngraph.run.backends.base import run_fused_backward, run_fused_forward
from rnngraph.run.backends.numpy_backend import NumpyBackend

pytest.importorskip("ml_dtypes")
BF16 = float_dtype("bfloat16", half=True)
# relative error (2-norm) of a whole layer against float64 on the same (rounded) weights and inputs:
# bfloat16 keeps 8 bits of mantissa (2^-9 ≈ 2e-3 per rounding), float16 11 (2^-12 ≈ 2.4e-4); 12 frames,
# 2 layers and a backward add up to a few tens of roundings
TOL = {"bfloat16": 3e-2, "float16": 5e-3}


def tanh_of_product():
    c = Cell("tp")
    x, h = c.input("x", 4), c.state("h", 4)
    c.output(c.bind(h, c.tanh(c.linear(x, "W", 4) * c.linear(h, "U", 4)), name="h"))
    return c.build()


def test_a_fused_group_computes_in_float32_and_rounds_each_stored_value_once():
    cell = tanh_of_product()
    prod, out = [n for n in cell.frame_order() if cell.op(n).kind in (OpKind.MUL, OpKind.TANH)]
    (a, _), (b, _) = cell.reads(prod)
    rng = np.random.default_rng(0)
    A, B = (rng.standard_normal((64, 4)).astype(BF16) for _ in range(2))
    env = {(a, 0): A, (b, 0): B, prod: np.zeros((64, 4), BF16), out: np.zeros((64, 4), BF16)}
    env[(prod, 0)] = env[prod]
    run_fused_forward(np, cell, Fused((prod, out)), env)
    p32 = A.astype(np.float32) * B.astype(np.float32)
    np.testing.assert_array_equal(env[prod], p32.astype(BF16))
    np.testing.assert_array_equal(env[out], np.tanh(p32).astype(BF16))           # tanh read p unrounded
    assert (np.tanh(p32.astype(BF16).astype(np.float32)).astype(BF16) != env[out]).any()
    g_out = rng.standard_normal((64, 4)).astype(BF16)
    genv, added = {prod: np.zeros((64, 4), BF16), out: g_out.copy()}, {}
    run_fused_backward(np, cell, Fused((prod, out)), env, genv,
                       lambda u, d, v, cols=slice(None): added.setdefault(u, v), params=False)
    gp32 = g_out.astype(np.float32) * (1 - env[out].astype(np.float32) ** 2)        # the member's total, unrounded
    np.testing.assert_array_equal(genv[prod], gp32.astype(BF16))
    np.testing.assert_array_equal(added[a], gp32 * B.astype(np.float32))           # handed on in float32


def test_gemm_accumulates_in_float32_and_rounds_once():
    rng = np.random.default_rng(1)
    a, w = rng.standard_normal((5, 300)).astype(BF16), rng.standard_normal((7, 300)).astype(BF16)
    out = rng.standard_normal((5, 7)).astype(BF16)
    want = (out.astype(np.float32) + a.astype(np.float32) @ w.astype(np.float32).T).astype(BF16)
    NumpyBackend().gemm(a, w, out, tb=True, accumulate=True)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cell,loop", [(c, "auto") for c in sorted(CELLS) if not c.startswith("layernorm")]
                         + [("min_gru", "stages"), ("sru", "stages")])
def test_layers_in_half_precision_are_close_to_float64(cell, loop, dtype, tol=None):
    errors = _errors(cell, dtype, "float64", loop)
    assert max(errors) <= (tol or TOL)[dtype], errors


def _errors(cell, dtype, ref_dtype, loop="auto") -> list:
    """Relative 2-norm errors of a half layer's output, input gradient and parameter gradients against a
    ref_dtype layer on the same (rounded) weights, inputs and output gradients."""
    half = Recurrent(cell, 3, 8, num_layers=2, dtype=dtype, seed=1, loop=loop)
    ref = Recurrent(cell, 3, 8, num_layers=2, dtype=ref_dtype, seed=1, loop=loop)
    ref.load_state_dict({k: v.astype(ref_dtype) for k, v in half.parameters().items()})
    x = np.random.default_rng(0).standard_normal((12, 4, 3)).astype(half.dtype)
    gy = np.random.default_rng(1).standard_normal((12, 4, 8)).astype(half.dtype)
    (y, _), (yr, _) = half(x), ref(x.astype(ref_dtype))
    (gx, _, grads), (gxr, _, gref) = half.backward(gy), ref.backward(gy.astype(ref_dtype))
    assert y.dtype == gx.dtype == half.dtype and all(g.dtype == half.dtype for g in grads.values())
    return [np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b)
            for a, b in [(y, yr), (gx, gxr)] + [(grads[k], gref[k]) for k in sorted(grads)]]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "min_gru", "sru", "indrnn"])
def test_against_float32_on_the_same_rounded_inputs_the_error_is_the_half_roundings_alone(cell, dtype):
    """float32 on the same rounded weights and inputs differs from the half run by what the half storage
    rounds (within the format's bound), and by the same amount as float64 does, to float32's precision."""
    e32, e64 = _errors(cell, dtype, "float32"), _errors(cell, dtype, "float64")
    assert max(e32) <= TOL[dtype] and max(e32) > 0
    np.testing.assert_allclose(e32, e64, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cell", ["layernorm_lstm", "layernorm_gru"])
def test_layernorm_cells_lose_more_in_half_precision(cell, dtype):
    """A layer norm's row group keeps its intermediates in float32 registers, but its input and output
    are stored in half and x − μ cancels: in bfloat16 the LayerNorm-LSTM's gradients come out ~7% off
    float64 (its float16 ones ~1.7%; ~15% and ~1% while the norms ran as four kernels each). Bounds at
    about twice what was measured: this documents the loss, it is not a goal."""
    test_layers_in_half_precision_are_close_to_float64(cell, "auto", dtype, tol={"bfloat16": 0.15, "float16": 0.035})


def test_half_runs_are_deterministic_and_errors_are_clear():
    runs = []
    for _ in range(2):
        layer = Recurrent("gru", 3, 8, dtype="bfloat16", seed=2)
        y, _ = layer(np.ones((5, 2, 3), BF16))
        runs.append((y, layer.backward(np.ones_like(y))[0]))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(RnnGraphError, match="x has dtype float32 but the layer is bfloat16"):
        Recurrent("gru", 3, 8, dtype="bfloat16")(np.ones((5, 2, 3), np.float32))

    class OtherBackend(NumpyBackend):
        name = "other"

        def half_problem(self, dtype):
            return f"no {dtype.name} here"
    with pytest.raises(RnnGraphError, match="dtype float16 does not run here: no float16 here"):
        Recurrent("gru", 3, 8, dtype="float16", backend=OtherBackend())
    with pytest.raises(RnnGraphError, match="half precision runs in the recurrent layers only"):
        float_dtype("bfloat16")


@pytest.mark.parametrize("cc, zeros_fails, dtype, want", [
    ("90", False, "bfloat16", None), ("75", False, "float16", None),
    ("75", False, "bfloat16", "compute capability 8.0 or newer (this one is 7.5)"),
    ("120", False, "bfloat16", None), ("90", True, "bfloat16", "bfloat16 needs cupy 14 or newer with ml_dtypes")])
def test_the_gpu_says_in_one_line_what_half_dtype_it_lacks(cc, zeros_fails, dtype, want):
    """CupyBackend.half_problem on a stand-in for cupy: an old cupy without bfloat16 arrays, an old GPU."""
    from types import SimpleNamespace
    from rnngraph.run.backends.cuda.backend import CupyBackend

    def zeros(shape, dt):
        if zeros_fails:
            raise TypeError(f"Unsupported type {dt}")
    cp = SimpleNamespace(__version__="13.6.0", zeros=zeros,
                         cuda=SimpleNamespace(Device=lambda: SimpleNamespace(compute_capability=cc)))
    got = CupyBackend.half_problem(SimpleNamespace(xp=cp), float_dtype(dtype, half=True))
    assert got == want if want is None else want in got


def test_ragged_batches_stay_in_half_precision():
    """Padded frames are zeroed without promoting the activations to float32 (a bare 0 in `where` did, with
    some numpy and ml_dtypes versions)."""
    layer = Recurrent("gru", 3, 8, num_layers=2, dtype="bfloat16", seed=2)
    y, h = layer(np.ones((5, 2, 3), BF16), lengths=np.array([5, 2]))
    gx, _, grads = layer.backward(np.ones_like(y))
    assert y.dtype == h.dtype == gx.dtype == BF16 and not y[2:, 1].astype(np.float32).any()
