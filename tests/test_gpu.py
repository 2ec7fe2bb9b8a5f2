"""GPU backend against the numpy float64 reference: every built-in cell and a random user cell, every mode."""
import numpy as np
import pytest

import rnngraph as rg
from rnngraph.plan.items import Pair
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.run.executor import Executor

pytestmark = pytest.mark.gpu
TOL = {"float64": 1e-10, "float32": 1e-4}   # relative, by dtype (issue 4)


def user_cell(D, H):
    """A cell no library ships: a gated unit with a delay-2 skip and a peephole-style diagonal."""
    c = rg.Cell("user")
    x, h = c.input("x", D), c.state("h", H)
    f = c.sigmoid(c.linear(x, "W_f", H, bias="b_f") + c.linear(h, "U_f", H) + c.diag(h.ago(2), "p"))
    n = c.tanh(c.linear(x, "W_n", H) + c.linear(f * h, "U_n", H))
    c.output(c.bind(h, (1 - f) * h + f * n - 0.5 * c.relu(n), name="h"))
    return c.build()


def _run(cell, backend, params, x, init, gy, gf, xp, dtype, loop="auto"):
    ex = Executor(cell, backend, loop=loop)
    conv = {k: xp.asarray(v.astype(dtype)) for k, v in params.items()}
    outs, fin = ex.forward(conv, {"x": xp.asarray(x.astype(dtype))},
                           {k: xp.asarray(v.astype(dtype)) for k, v in init.items()})
    res = {f"y.{k}": v.copy() for k, v in outs.items()} | {f"n.{k}": v.copy() for k, v in fin.items()}
    gx, g0, gp = ex.backward({k: xp.asarray(v.astype(dtype)) for k, v in gy.items()},
                             {k: xp.asarray(v.astype(dtype)) for k, v in gf.items()})
    res |= {f"gx.{k}": v.copy() for k, v in gx.items()} | {f"g0.{k}": v.copy() for k, v in g0.items()}
    res |= {f"gp.{k}": v.copy() for k, v in gp.items()}
    return ex, res


def _problem(cell, T=6, B=3, seed=0):
    rng = np.random.default_rng(seed)
    params = {p: rng.uniform(-0.5, 0.5, s) for p, s in cell.params.items()}
    D = cell.inputs["x"]
    x = rng.standard_normal((T, B, D))
    init = {s: rng.standard_normal((B, n)) * 0.5 for s, (_, n) in cell.states.items()}
    gy = {o: rng.standard_normal((T, B, cell.op(o).size)) for o in cell.outputs}
    gf = {s: rng.standard_normal((B, n)) for s, (_, n) in cell.states.items()}
    return params, x, init, gy, gf


def _assert_close(got, ref, tol, what):
    import cupy
    for k, r in ref.items():
        g = cupy.asnumpy(got[k]).astype(np.float64)
        err = np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-300)
        assert err <= tol, f"{what}: {k} relative error {err:.2e} > {tol:.0e}"


def softplus_cell(D, H):
    """The op added through ir/ops alone: its generated kernels compile and match numpy."""
    c = rg.Cell("softplus_rnn")
    x, h = c.input("x", D), c.state("h", H)
    pre = c.linear(x, "W", H, bias="b") + c.linear(h, "U", H)
    c.output(c.bind(h, c.tanh(c.apply("softplus", pre) * -0.5), name="h"))
    return c.build()


def post_delay2_cell(D, H):
    """Post-loop work over all frames reading h two frames back: a fused group and a GEMM on shifted views."""
    c = rg.Cell("post_delay2")
    x, h = c.input("x", D), c.state("h", H)
    c.bind(h, c.tanh(c.linear(x, "W", H, bias="b") + c.linear(h, "U", H)), name="h")
    c.output(c.sigmoid(h.ago(2)) * 0.5 + c.linear(h.ago(2), "P", H), name="y")
    return c.build()


def norms_cell(D, H):
    """The row reductions (sum, mean: their own kernels) and exp, div, rsqrt inside the recurrence; an
    rms_norm before the loop (over all T·B rows)."""
    c = rg.Cell("norms")
    x, h = c.input("x", D), c.state("h", H)
    a = c.rms_norm(c.linear(x, "W", H, bias="b"), "g")
    r = c.linear(h, "U", H)
    n = c.layer_norm(a + r, "ln_g", "ln_b") + c.sum(r) * 0.1
    c.output(c.bind(h, c.tanh(n) / c.exp(c.tanh(r)) * c.rsqrt(r * r, 1.0), name="h"))
    return c.build()


USER = {"user": user_cell, "softplus": softplus_cell, "post_delay2": post_delay2_cell, "norms": norms_cell}
CELLS = [*rg.CELLS, *USER]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", ["naive", "staged", "graph", "graph-own", "staged-stages", "graph-stages"])
@pytest.mark.parametrize("name", CELLS)
def test_cupy_matches_numpy_reference(name, mode, dtype):
    """Every mode against the reference; auto runs 'persistent' for cells with a GEMM on a state (B ≤ 8),
    '-stages' the frame-by-frame loop."""
    import cupy
    cell = USER[name](5, 8) if name in USER else rg.load_cell(name, 5, 8)
    prob = _problem(cell)
    _, ref = _run(cell, NumpyBackend("naive"), *prob, np, np.float64)
    be = get_backend("cupy", mode.split("-")[0], matmul="own" if mode == "graph-own" else "cublas")
    ex, got = _run(cell, be, *prob, cupy, dtype, "stages" if mode.endswith("-stages") else "auto")
    _assert_close(got, ref, TOL[dtype], f"{name}/{mode}/{dtype} first call")
    if mode.startswith("graph"):   # replay with new inputs must give new, correct results (no stale values)
        own = {}
        for seed in (1, 2):   # the same parameter arrays updated in place, as an optimizer does
            prob2 = _problem(cell, seed=seed)
            _, ref2 = _run(cell, NumpyBackend("naive"), *prob2, np, np.float64)
            got2 = _run_again(ex, prob2, cupy, dtype, own)
            _assert_close(got2, ref2, TOL[dtype], f"{name}/graph replay {seed}")
        assert len(be.graphs.entries) == 4 and all(g != "eager" for g, _ in be.graphs.entries.values())
        assert ex.whole_capture == (mode != "graph-own" and ex.sched.capture_problem is None)


def _run_again(ex, prob, xp, dtype, own: dict):
    """Runs ex again with prob's values written into the parameter arrays `own` (made on the first call)."""
    params, x, init, gy, gf = prob
    conv = lambda d: {k: xp.asarray(v.astype(dtype)) for k, v in d.items()}
    if not own:
        own.update(conv(params))
    for k, v in params.items():
        own[k][...] = xp.asarray(v.astype(dtype))
    outs, fin = ex.forward(own, {"x": xp.asarray(x.astype(dtype))}, conv(init))
    res = {f"y.{k}": v.copy() for k, v in outs.items()} | {f"n.{k}": v.copy() for k, v in fin.items()}
    gx, g0, gp = ex.backward(conv(gy), conv(gf))
    res |= {f"gx.{k}": v.copy() for k, v in gx.items()} | {f"g0.{k}": v.copy() for k, v in g0.items()}
    return res | {f"gp.{k}": v.copy() for k, v in gp.items()}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("N,M,K", [(1, 96, 40), (3, 2048, 512), (8, 33, 7), (9, 64, 64), (64, 2048, 512), (70, 50, 33)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_captured_matmul_kernels_match_cublas(N, M, K, dtype, accumulate):
    import cupy
    be = get_backend("cupy")
    rng = np.random.default_rng(N * M + K)
    big_a = cupy.asarray(rng.standard_normal((N, K + 5)).astype(dtype))
    a = big_a[:, 2:K + 2]                               # row stride != K, as a merged-buffer view has
    w = cupy.asarray(rng.standard_normal((M, K)).astype(dtype))
    big_c = cupy.asarray(rng.standard_normal((N, M + 3)).astype(dtype))
    c = big_c[:, 1:M + 1]
    want = (c if accumulate else 0) + a @ w.T          # cuBLAS
    be.launch((be.matmul_launch(a, w, c, accumulate),))
    err = float(cupy.linalg.norm(c - want) / cupy.linalg.norm(want))
    assert err <= TOL[dtype], f"matmul {N}x{M}x{K} {dtype}: {err:.2e}"


def two_path_cell(D, H):
    """Two independent recurrences: each loop stage holds two GEMMs that CUDA-stream lanes can overlap."""
    c = rg.Cell("two_path")
    x, a, b = c.input("x", D), c.state("a", H), c.state("b", H)
    a_new = c.bind(a, c.tanh(c.linear(x, "W_a", H, bias="b_a") + c.linear(a, "U_a", H)), name="a")
    b_new = c.bind(b, c.sigmoid(c.linear(x, "W_b", H) + c.linear(b, "U_b", H)), name="b")
    c.output(a_new * b_new, name="y")
    return c.build()


@pytest.mark.parametrize("mode", ["staged", "graph"])
def test_lanes_match_reference(mode):
    import cupy
    cell = two_path_cell(5, 8)
    assert max(len(st) for st in rg.build_schedule(cell).loop) == 2
    prob = _problem(cell)
    _, ref = _run(cell, NumpyBackend("naive"), *prob, np, np.float64)
    be = get_backend("cupy", mode, lanes=2)
    ex, got = _run(cell, be, *prob, cupy, "float64", "stages")
    _assert_close(got, ref, TOL["float64"], f"lanes/{mode}")
    got2 = _run_again(ex, prob, cupy, "float64", {})
    _assert_close(got2, ref, TOL["float64"], f"lanes/{mode} replay")


def paired_launches(ex) -> list:
    """The launch of each prepared pair item: memo (item, frame) -> (views, launch); other memo keys differ."""
    return [v[1] for k, v in ex.ws.memo.items() if isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], Pair)]


@pytest.mark.parametrize("B", [1, 3, 8, 9])
def test_gemm_fused_pair_matches_reference(B):
    """The per-frame GEMV runs inside the fused kernel for B ≤ 8; B = 9 takes the two-kernel path."""
    import cupy
    cell = rg.load_cell("lstm", 5, 8)
    prob = _problem(cell, B=B)
    _, ref = _run(cell, NumpyBackend("naive"), *prob, np, np.float64)
    for mode in ("staged", "graph"):
        ex, got = _run(cell, get_backend("cupy", mode), *prob, cupy, "float64", "stages")
        _assert_close(got, ref, TOL["float64"], f"pair B={B} {mode}")
        paired = paired_launches(ex)
        assert paired and all((v is not None) == (B <= 8) for v in paired)


def test_no_gemm_fused_pair_when_the_weights_are_large():
    """Rows × weight bytes over PAIR_MAX_BYTES (here B = 1, H = 1024: 32 MB in fp64) take two kernels."""
    import cupy
    cell = rg.load_cell("lstm", 5, 1024)
    prob = _problem(cell, T=3, B=1)
    _, ref = _run(cell, NumpyBackend("naive"), *prob, np, np.float64)
    ex, got = _run(cell, get_backend("cupy", "graph"), *prob, cupy, "float64", "stages")
    _assert_close(got, ref, TOL["float64"], "unpaired H=1024")
    paired = paired_launches(ex)
    assert paired and all(v is None for v in paired)


def test_failed_capture_warns_falls_back_and_leaves_no_broken_stream():
    import cupy
    cell = rg.load_cell("gru", 5, 8)
    prob = _problem(cell)
    _, ref = _run(cell, NumpyBackend("naive"), *prob, np, np.float64)
    be = get_backend("cupy", "graph")
    real = be.gemm

    def gemm(a, b, out, **how):   # CuPy's own matmul (cuBLAS) is refused inside a capture
        if cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr):
            product = cupy.matmul(a.T if how.get("ta") else a, b.T if how.get("tb") else b)
            if how.get("accumulate"):
                out += product
            else:
                out[...] = product
            return None
        return real(a, b, out, **how)

    be.gemm = gemm
    with pytest.warns(rg.RnnGraphWarning, match="capture failed"):
        ex, got = _run(cell, be, *prob, cupy, "float64")
    _assert_close(got, ref, TOL["float64"], "after a failed capture")
    assert "eager" in [g for g, _ in be.graphs.entries.values()]
    _assert_close(_run_again(ex, prob, cupy, "float64", {}), ref, TOL["float64"], "eager fallback, second call")
    be.gemm = real   # the stream still records: a fresh executor captures normally
    ex2, got2 = _run(cell, be, *prob, cupy, "float64")
    _assert_close(got2, ref, TOL["float64"], "capture after a failed one")
    assert any(g != "eager" for g, _ in be.graphs.entries.values())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dropout_mask_on_the_device_equals_numpy(dtype):
    import cupy

    from rnngraph.arrays import dropout_mask
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    want = dropout_mask(a, (33, 7, 9), 0.3, np, dtype)                  # [33, 7, 9]
    got = dropout_mask(b, (33, 7, 9), 0.3, cupy, dtype)
    assert type(got) is cupy.ndarray and got.dtype == want.dtype
    np.testing.assert_array_equal(cupy.asnumpy(got), want)


@pytest.mark.parametrize("mode", ["staged", "graph"])
def test_chunked_calls_carry_the_history_on_the_gpu(mode):
    """A state read two frames back crosses a chunk boundary intact: chunks equal one call."""
    import cupy
    from rnngraph.nn import Recurrent
    layer = Recurrent(user_cell, 5, 8, num_layers=2, backend="cupy", mode=mode, dtype="float64")
    x = cupy.asarray(np.random.default_rng(9).standard_normal((9, 3, 5)))
    want, want_h = layer(x)
    want, want_h = want.copy(), want_h.copy()
    a, h = layer(x[:4])
    a = a.copy()
    b, h2 = layer(x[4:], h)
    assert h2.shape == (2, 2, 3, 8)
    _assert_close({"y": cupy.concatenate([a, b]), "h": h2}, {"y": cupy.asnumpy(want), "h": cupy.asnumpy(want_h)},
                  TOL["float64"], f"chunked {mode}")


@pytest.mark.parametrize("cell,loop", [("lstm", "stages"), ("min_gru", "scan"), ("lstm", "persistent"),
                                       ("slstm", "persistent")])
def test_the_finite_check_skips_what_the_gpu_kernels_never_store(cell, loop):
    """The fused kernels store only what the rest of the step reads (rows.group_kernel; the persistent loop's
    pairs not their GEMM sums, elements.stored_sums): the results equal the numpy reference's, NaN left in the
    buffers of what they drop raises nothing, a NaN they store is named."""
    import cupy
    from rnngraph.errors import RnnGraphError
    from rnngraph.nn import Recurrent
    layer = Recurrent(cell, 5, 8, backend="cupy", mode="graph", dtype="float64", loop=loop, seed=3)
    ref = Recurrent(cell, 5, 8, backend="numpy", dtype="float64", loop=loop, seed=3)
    x = np.random.default_rng(4).standard_normal((7, 3, 5))
    gy = np.random.default_rng(5).standard_normal((7, 3, 8))
    layer.check_finite = True
    y = cupy.asnumpy(layer(cupy.asarray(x))[0])
    gx, _, grads = layer.backward(cupy.asarray(gy))
    want_y, (want_gx, _, want) = ref(x)[0], ref.backward(gy)
    _assert_close({"y": y, "gx": gx, **grads}, {"y": want_y, "gx": want_gx, **want}, TOL["float64"], f"{cell} {loop}")
    ex = layer._stack.runs[0][0].ex
    dropped = ex.backend.unstored(ex.sched)
    assert dropped
    for n in dropped:
        ex.ws.vals[n][...] = cupy.nan
    layer(cupy.asarray(x))
    with pytest.raises(RnnGraphError, match="not finite"):
        layer(cupy.full(x.shape, cupy.nan))
