"""Parameter gradients in PyTorch's layout: one gather per (layer, direction) from the workspace's gradient
arena (nn/grads.py), equal to every cell parameter's own gradient, and fresh arrays each backward."""
import numpy as np
import pytest

from rnngraph import Cell, nn

F64 = {"dtype": "float64"}


def tied_cell(input_size, hidden_size, bias=True):
    """U read by two linear ops (its gradient is accumulated, not a row block of a merged GEMM)."""
    c = Cell("tied")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    pre = c.linear(x, "W", hidden_size) + c.linear(h, "U", hidden_size) + c.linear(c.tanh(h), "U", hidden_size)
    c.output(c.bind(h, c.tanh(pre), name="h"))
    return c.build()


@pytest.mark.parametrize("cell", ["lstm", "gru", tied_cell])
def test_grads_gathered_into_torch_layout(cell):
    """layer.grads (one gather per layer and direction from its workspace) hold every cell parameter's
    gradient at its rows of the PyTorch-layout parameter, and stay as they were after the next backward."""
    layer = nn.Recurrent(cell, 3, 4, num_layers=2, bidirectional=True, **F64)
    rng = np.random.default_rng(0)
    y, _ = layer(rng.standard_normal((5, 2, 3)))
    gy = rng.standard_normal(y.shape)
    grads = layer.backward(gy)[2]
    kept = {k: g.copy() for k, g in grads.items()}
    _, _, per_cell = layer._stack.backward(gy, {s: None for s in layer.state_names}, layer._last[0])
    for per_l, g_l in zip(layer._layout, per_cell):
        for per_d, g in zip(per_l, g_l):
            for name, _, parts in per_d:
                for p, start, stop in parts:
                    np.testing.assert_array_equal(grads[name][start:stop], g[p])
    layer(rng.standard_normal((5, 2, 3)))
    layer.backward(gy)
    for k, g in grads.items():
        np.testing.assert_array_equal(g, kept[k])


def test_backward_flat_leaves_them_as_one_fresh_array_in_parameters_order():
    """backward_flat: the same gradient input and state gradients as backward(), the parameters' in grad_flat
    one after another (what backward() hands out as views of it), fresh each call; layer.grads empty."""
    layer = nn.Recurrent("lstm", 3, 4, num_layers=2, bidirectional=True, **F64)
    rng = np.random.default_rng(1)
    x, gy = rng.standard_normal((5, 2, 3)), rng.standard_normal((5, 2, 8))
    layer(x)
    gx, g0, grads = layer.backward(gy)
    kept = {k: g.copy() for k, g in grads.items()}
    layer(x)
    gx_flat, g0_flat = layer.backward_flat(gy)
    np.testing.assert_array_equal(gx_flat, gx)
    for a, b in zip(g0_flat, g0):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(layer.grad_flat, np.concatenate([g.ravel() for g in kept.values()]))
    assert list(kept) == list(layer.parameters()) and layer.grads == {}
    for k, g in grads.items():                       # the earlier call's views: untouched
        np.testing.assert_array_equal(g, kept[k])


def gathers():
    """A few long runs and a short one; a permutation (many runs: the host backends take once)."""
    rng = np.random.default_rng(0)
    return np.r_[np.arange(10, 400), np.arange(500, 520), [7]], rng.permutation(1000)[:300]


def test_the_gradient_gather_by_runs_equals_a_take():
    """The host backends copy a layer's gradients run by run (a few long runs a layer); many runs take once."""
    from rnngraph.nn.grads import runs
    from rnngraph.run.backends import get_backend
    src = np.arange(1000.0)
    assert runs(np.r_[np.arange(10, 400), np.arange(500, 520), [7]]) == [(10, 0, 390), (500, 390, 20), (7, 410, 1)]
    for idx in gathers():
        for name in ("numpy", "cpu"):
            be, out = get_backend(name), np.full(len(idx), np.nan)
            plan = be.gather_plan(idx, runs(idx))
            assert plan.size == len(idx) and (plan.table is None) == (len(runs(idx)) <= 64)
            be.gather(src, plan, out)
            np.testing.assert_array_equal(out, src[idx])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "int8"])
def test_the_gpu_gathers_every_run_in_one_launch(dtype):
    """The cupy backend's runs table: one kernel copies each run (grid rows over runs, a run longer than the
    grid's row strided), for elements of 8, 4, 2 and 1 bytes; the layer's own gradients are checked by every
    GPU test against staged mode and numpy."""
    import cupy
    from rnngraph.nn.grads import runs
    from rnngraph.run.backends import get_backend
    be = get_backend("cupy")
    src = cupy.arange(400_000).astype(dtype)
    for idx in (*gathers(), np.r_[np.arange(300_000, 400_000), np.arange(0, 290_000)]):
        plan = be.gather_plan(idx, runs(idx))
        out = cupy.zeros(len(idx), dtype)
        be.gather(src, plan, out)
        assert plan.table.shape == (len(runs(idx)), 3)
        np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(src)[idx])
