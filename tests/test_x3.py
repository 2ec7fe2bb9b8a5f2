"""Products over all frames in 3xTF32 (rnngraph/run/backends/cuda/x3.py) on the CPU: the split kernel compiled as C++
(cuda_on_cpu's prelude, test_scan_kernels' launcher) and cuBLAS's TF32 GEMM as exact products of the TF32 parts
summed in float64 and rounded to float32 once, in panels of rows as small as a test makes them. The results are
within 3xTF32's bound of float64 products (float32 operands), in every form, assigning and adding; which products
run so (x3.applies); and which of the executor's products are over all frames (gemm_frames)."""
import ctypes

import numpy as np
import pytest

from cuda_on_cpu import needs_cxx
from rnngraph import load_cell
from rnngraph.run.backends.cuda import x3
from rnngraph.run.backends.cuda.cublas import Cublas
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.run.executor import Executor
from test_persistent_heads import problem_arrays
from test_scan_kernels import _library


def tf32(a):
    """float32 values rounded to TF32 as cvt.rna.tf32.f32 rounds finite values (to nearest, ties away)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


class TensorCoreBlas:
    """cuBLAS's three forms on TF32 operands: exact products, float64 sums, float32 once a GEMM; `calls` lists
    (form, beta, tf32) and `seen` whether every operand given was a TF32 value."""
    tf32 = False
    usable = staticmethod(Cublas.usable)

    def __init__(self):
        self.calls, self.seen = [], []

    def _run(self, form, prod, out, beta, tf32_, *ops):
        self.calls.append((form, beta, tf32_))
        self.seen.append(all(np.array_equal(tf32(o), o) for o in ops))
        f64 = [o.astype(np.float64) for o in ops]
        out[...] = (prod(*f64) + (out.astype(np.float64) if beta else 0)).astype(np.float32)

    def nt(self, x, w, out, beta=0.0, tf32=False):
        self._run("nt", lambda x, w: x @ w.T, out, beta, tf32, x, w)

    def nn(self, g, w, out, beta=1.0, tf32=False):
        self._run("nn", lambda g, w: g @ w, out, beta, tf32, g, w)

    def tn(self, g, x, out, beta=1.0, tf32=False):
        self._run("tn", lambda g, x: g.T @ x, out, beta, tf32, g, x)


class _Kernel:
    """An emulated kernel called as cupy calls a RawKernel: kernel(grid, block, args)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, grid, block, args):
        words = [a.ctypes.data if isinstance(a, np.ndarray) else int(a) % 2 ** 64 for a in args]
        self.fn((ctypes.c_ulonglong * len(words))(*words), int(grid[0]), 1, int(block[0]), 1)


class Emulated:
    """What x3 reads of a backend: numpy, the TF32 BLAS above, its split buffers and the split kernel on the CPU."""
    xp = np

    def __init__(self, elements: int):
        self.blas = TensorCoreBlas()
        self.split3 = np.full((2, 3 * elements), np.nan, np.float32)

    def raw(self, name, src):
        return _Kernel(getattr(_library(src), f"rg_launch_{name}"))


@needs_cxx
@pytest.mark.parametrize("along", ["cols", "rows"])
@pytest.mark.parametrize("small_at", [0, 1])
def test_the_split_kernel_gives_three_tf32_parts(along, small_at):
    """Part small_at small, the others big: big + small within 2⁻²² of x, both TF32 values (to nearest, ties away
    from zero), side by side in a row or stacked."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((9, 40)) * 10.0 ** rng.integers(-30, 30, (9, 40))).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 1.0 + 2 ** -11, -(1.0 + 2 ** -11)]          # ties round away from zero
    view = x[:, 3:35]                                                    # a column window: row stride 40
    be = Emulated(view.size)
    got = x3._split(be, view, be.split3[0], along, small_at)
    parts = np.split(got, 3, axis=1 if along == "cols" else 0)
    big, small = tf32(view), tf32(view - tf32(view))
    for p, part in enumerate(parts):
        assert np.array_equal(part, small if p == small_at else big)
    assert np.array_equal(tf32(x[0, :4]), [0.0, -0.0, 1.0 + 2 ** -10, -(1.0 + 2 ** -10)])
    assert (np.abs(view.astype(np.float64) - big - small) <= np.abs(view) * 2.0 ** -22).all()


FORMS = [((False, True), (150, 24), (40, 24), (150, 40)),     # nt: out [N, M] = a [N, K] · b [M, K]ᵀ
         ((False, False), (150, 40), (40, 24), (150, 24))]    # nn: out [N, K] = a [N, M] · b [M, K]


@needs_cxx
@pytest.mark.parametrize("form", FORMS, ids=["nt", "nn"])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("elements", [1 << 13, 1000])
def test_3xtf32_products_are_within_their_bound_of_float64(form, accumulate, elements):
    """Whole and in panels of 41 or 25 rows (1000 elements split at a time, the weights whole): within 2⁻¹⁸ of the
    products' sizes (a product within 3 · 2⁻²² of exact, the sums float32's), one TF32 GEMM a panel on TF32 parts
    over three times the reduction, assigning where the call does, else adding."""
    (ta, tb), sa, sb, so = form
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((s[0], s[1] + 3)).astype(np.float32)[:, 2:2 + s[1]] for s in (sa, sb))
    out0 = rng.standard_normal(so).astype(np.float32)
    out = out0.copy()
    be = Emulated(elements)
    x3.product(be, a, b, out, ta, tb, accumulate)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if ta else a64) @ (b64.T if tb else b64) + (out0 if accumulate else 0)
    size = np.abs(a64.T if ta else a64) @ np.abs(b64.T if tb else b64) + (np.abs(out0) if accumulate else 0)
    assert (np.abs(out - want) <= size * 2.0 ** -18).all()
    panels = -(-a.shape[0] // (elements // a.shape[1]))
    assert len(be.blas.calls) == panels and all(t for _, _, t in be.blas.calls) and all(be.blas.seen)
    assert [beta for _, beta, _ in be.blas.calls] == [float(accumulate)] * panels


@needs_cxx
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("elements", [1 << 13, 1600])
def test_both_gradients_share_the_output_gradients_parts(accumulate, elements):
    """gx (+)= g · w and gw += gᵀ · x (x3.grads): both within 2⁻¹⁸ of float64, whole and in panels (1600 elements a
    part: 40 rows of g's parts, 26 of x's beside w's 2880 aligned), per panel the operand's gradient then the
    weight's on TF32 parts, g split once for both: three splits for one panel, 1 + 2 a panel for more."""
    rng = np.random.default_rng(2)
    win = lambda *s: rng.standard_normal((s[0], s[1] + 3)).astype(np.float32)[:, 1:1 + s[1]]
    g, w, x = win(150, 40), win(40, 24), win(150, 24)
    gx0, gw0 = rng.standard_normal((150, 24)).astype(np.float32), rng.standard_normal((40, 24)).astype(np.float32)
    gx, gw = gx0.copy(), gw0.copy()
    be = Emulated(elements)
    splits = []
    raw = be.raw
    be.raw = lambda name, src: (splits.append(name), raw(name, src))[1]
    assert x3.grads(be, g, w, x, gx, gw, accumulate)
    g64, w64, x64 = g.astype(np.float64), w.astype(np.float64), x.astype(np.float64)
    for got, want, size in ((gx, g64 @ w64 + (gx0 if accumulate else 0), abs(g64) @ abs(w64) + abs(gx0)),
                            (gw, g64.T @ x64 + gw0, abs(g64.T) @ abs(x64) + abs(gw0))):
        assert (np.abs(got - want) <= size * 2.0 ** -18).all()
    panels = 1 if elements > 150 * 40 else 6
    assert [c[:2] for c in be.blas.calls] == [("nn", float(accumulate)), ("tn", 1.0)] * panels
    assert all(t for _, _, t in be.blas.calls) and all(be.blas.seen) and len(splits) == 1 + 2 * panels


@needs_cxx
def test_both_gradients_are_left_to_the_caller_where_no_panel_fits_beside_w():
    """w's parts fill the second buffer: grads() does nothing and says so."""
    g, w, x = (np.ones(s, np.float32) for s in ((16, 40), (40, 24), (16, 24)))
    be = Emulated(40 * 24)
    assert not x3.grads(be, g, w, x, np.zeros((16, 24), np.float32), np.zeros((40, 24), np.float32), False)
    assert be.blas.calls == []


def test_which_products_run_in_3xtf32(monkeypatch):
    be = Emulated(1)
    big = lambda *s: np.zeros(s, np.float32)
    x, w, out = big(8192, 512), big(1024, 512), big(8192, 1024)       # 4.3e9 multiply-adds
    assert x3.applies(be, x, w, out, False, True)
    assert not x3.applies(be, x[:64], w, out[:64], False, True)         # 3.4e7: one float32 GEMM costs less
    assert not x3.applies(be, x.astype(np.float64), w.astype(np.float64), out.astype(np.float64), False, True)
    assert not x3.applies(be, big(8192, 2048), big(4096, 2048), big(8192, 4096), False, True)   # b beyond a buffer
    g, gx, gw = big(8192, 1024), big(8192, 512), big(1024, 512)
    assert x3.applies(be, g, w, gx, False, False)                      # nn: an operand's gradient
    assert not x3.applies(be, g, x, gw, True, False)                   # tn: a weight gradient alone stays float32
    assert x3.applies_grads(be, g, w, x, gx, gw)                       # ... and runs beside its operand's
    assert not x3.applies_grads(be, g, w, x.astype(np.float64), gx, gw)
    assert not x3.applies_grads(be, g, w, x[:, None], gx, gw)
    assert not x3.applies(be, x[:, None], w[:, None], out[:, None], False, True)            # heads
    monkeypatch.setenv("RNNGRAPH_GEMM_3XTF32", "0")
    assert not x3.applies(be, x, w, out, False, True)
    monkeypatch.delenv("RNNGRAPH_GEMM_3XTF32")
    be.blas.tf32 = True                      # cuBLAS runs float32 in TF32 itself
    assert not x3.applies(be, x, w, out, False, True)
    be.blas = None
    assert not x3.applies(be, x, w, out, False, True)


class Counting(NumpyBackend):
    """numpy, counting products over all frames (gemm_frames) and the rest (gemm)."""

    def __init__(self):
        super().__init__("staged")
        self.frames, self.other, self.pairs = [], [], []

    def gemm_frames(self, a, b, out, **kw):
        self.frames.append((a.shape, kw))
        NumpyBackend.gemm(self, a, b, out, **kw)

    def gemm(self, a, b, out, **kw):
        self.other.append(a.shape)
        super().gemm(a, b, out, **kw)

    def gemm_grads_frames(self, g, w, x, gx, gw, **kw):
        self.pairs.append(g.shape)
        super().gemm_grads_frames(g, w, x, gx, gw, **kw)


@pytest.mark.parametrize("loop", ["stages", "scan"])
def test_the_products_over_all_frames_are_the_hoisted_ones_and_the_weight_gradients(loop):
    """LSTM (stages) and minGRU (scan), T = 7, B = 3: the input product, its operand's gradient and the weight
    gradients (the per-frame product's too, summed over all frames) over all T·B rows, the input product's two
    gradients as one step (gemm_grads_frames); every per-frame product (B rows) through gemm."""
    cell = load_cell("lstm" if loop == "stages" else "min_gru", 5, 6)
    be = Counting()
    ex = Executor(cell, be, loop=loop)
    params, x, init, gy, gf = problem_arrays(cell, 7, 3, "float64")
    ex.forward(params, {"x": x}, init)
    ex.backward({cell.outputs[0]: gy}, gf)
    forms = sorted((kw.get("ta", False), kw.get("tb", False)) for _, kw in be.frames)
    assert forms == [(False, False), (False, True), (True, False)] + [(True, False)] * (loop == "stages")
    assert be.pairs == [(21, 24 if loop == "stages" else 12)]   # the input product's two gradients, as one step
    assert all(shape[0] == 21 for shape, _ in be.frames) and all(n == 3 for n, _ in be.other)
    assert len(be.other) == (0 if loop == "scan" else 2 * 7)     # stages: h · Wᵀ and its d operand a frame
    assert ex.sched.loop_strategy == loop
