"""States read D ≥ 2 frames back carry their last D frames, so truncated BPTT equals one long call."""
import numpy as np
import pytest

from rnngraph import Cell, RnnGraphError
from rnngraph.nn import LSTM, Dense, Recurrent, Sequential

TOL = 1e-12     # float64: chunked and full runs do the same arithmetic in the same order


def skip_cell(input_size, hidden_size, bias=True):
    """Reads h at delays 1, 2 and 3 and c at delays 1 and 2 (depths 3 and 2)."""
    c, H = Cell("skip"), hidden_size
    x, h, s = c.input("x", input_size), c.state("h", H), c.state("c", H)
    f = c.sigmoid(c.linear(x, "W_f", H, bias="b_f") + c.linear(h.ago(2), "U_f", H) + c.diag(s.ago(2), "p"))
    n = c.tanh(c.linear(x, "W_n", H) + c.linear(h, "U_n", H) + c.diag(h.ago(3), "q"))
    c.bind(s, f * s + (1 - f) * n, name="c")
    c.output(c.bind(h, c.tanh(s) * f + 0.5 * n, name="h"))     # s: the new c, read at delay 0
    return c.build()


def make(num_layers=1, mode="staged", **kw):
    return Recurrent(skip_cell, 3, 5, num_layers=num_layers, dtype="float64", mode=mode, seed=1, **kw)


def close(a, b, tol=TOL):
    scale = max(float(np.abs(b).max()), 1e-300)
    assert float(np.abs(a - b).max()) <= tol * scale, float(np.abs(a - b).max()) / scale


def test_depths_and_state_shapes():
    layer = make(num_layers=2)
    assert layer.cell.depths == {"h": 3, "c": 2}
    y, (h, c) = layer(np.random.default_rng(0).standard_normal((6, 4, 3)))
    assert h.shape == (3, 2, 4, 5) and c.shape == (2, 2, 4, 5)
    _, (h1, c1) = LSTM(3, 5, dtype="float64")(np.zeros((6, 4, 3)))
    assert h1.shape == c1.shape == (1, 4, 5)          # PyTorch's cells keep PyTorch's shapes


@pytest.mark.parametrize("mode", ["naive", "staged"])
@pytest.mark.parametrize("cuts", [[4], [1], [1, 2, 3], [2, 5, 6]])
def test_chunked_forward_equals_one_call(mode, cuts):
    x = np.random.default_rng(2).standard_normal((8, 3, 3))
    layer = make(num_layers=2, mode=mode)
    want, want_state = layer(x)
    ys, state = [], None
    for a, b in zip([0] + cuts, cuts + [len(x)]):
        y, state = layer(x[a:b], state)
        ys.append(y)
    close(np.concatenate(ys), want)
    for got, ref in zip(state, want_state):
        close(got, ref)


def test_chunked_backward_equals_one_call():
    """BPTT across a cut: chunk 2's grad_state0 fed as chunk 1's grad_state_n gives the full gradients."""
    rng = np.random.default_rng(3)
    x, gy = rng.standard_normal((7, 2, 3)), rng.standard_normal((7, 2, 5))
    layer = make(num_layers=2)
    layer(x)
    gx, _, grads = layer.backward(gy)
    _, s = layer(x[:3])
    layer(x[3:], s)
    gx2, g0, grads2 = layer.backward(gy[3:])
    layer(x[:3])
    gx1, _, grads1 = layer.backward(gy[:3], g0)
    close(np.concatenate([gx1, gx2]), gx)
    for k in grads:
        close(grads1[k] + grads2[k], grads[k])


def test_initial_history_gradient_by_finite_differences():
    rng = np.random.default_rng(4)
    layer = make()
    x, w = rng.standard_normal((5, 2, 3)), rng.standard_normal((5, 2, 5))
    h0, c0 = rng.standard_normal((3, 1, 2, 5)), rng.standard_normal((2, 1, 2, 5))
    layer(x, (h0, c0))
    _, (gh0, gc0), _ = layer.backward(w)
    for k, (a, g) in enumerate([(h0, gh0), (c0, gc0)]):
        d = rng.standard_normal(a.shape)
        def loss(e):
            state = [h0, c0]
            state[k] = a + e * d
            return float((layer(x, tuple(state))[0] * w).sum())
        fd = (loss(1e-6) - loss(-1e-6)) / 2e-6
        assert abs(fd - float((g * d).sum())) <= 1e-7 * max(1.0, abs(fd))


def test_a_state_given_once_stands_for_every_earlier_frame():
    rng = np.random.default_rng(5)
    layer = make()
    x, h0, c0 = rng.standard_normal((4, 2, 3)), rng.standard_normal((1, 2, 5)), rng.standard_normal((1, 2, 5))
    y, _ = layer(x, (h0, c0))
    _, (gh, gc), _ = layer.backward(y)
    full = (np.repeat(h0[None], 3, axis=0), np.repeat(c0[None], 2, axis=0))
    y_full, _ = layer(x, full)
    _, (gh_full, gc_full), _ = layer.backward(y_full)
    close(y, y_full)
    assert gh.shape == h0.shape and gc.shape == c0.shape and gh_full.shape == (3, 1, 2, 5)
    close(gh, gh_full.sum(axis=0))
    close(gc, gc_full.sum(axis=0))


def test_lengths_carry_each_sequence_its_own_last_frames():
    rng = np.random.default_rng(6)
    layer = make()
    x, lengths = rng.standard_normal((6, 3, 3)), np.array([6, 2, 4])
    _, (h, c) = layer(x, lengths=lengths)
    for b, n in enumerate(lengths):
        _, (hb, cb) = layer(x[:n, b:b + 1])
        close(h[:, :, b:b + 1], hb)
        close(c[:, :, b:b + 1], cb)


def test_a_wrongly_shaped_history_is_one_clear_error():
    layer = make()
    with pytest.raises(RnnGraphError, match=r"h0 must be \[D, num_layers·num_directions, B, S\] = \[3, 1, 2, 5\]"):
        layer(np.zeros((4, 2, 3)), (np.zeros((2, 1, 2, 5)), None))
    layer(np.zeros((4, 2, 3)))
    with pytest.raises(RnnGraphError, match=r"grad_h_n must be .*\[3, 1, 2, 5\].*got \[1, 2, 5\]"):
        layer.backward(np.zeros((4, 2, 5)), (np.zeros((1, 2, 5)), None))


def test_a_model_carries_the_history_across_chunks():
    """What `rnngraph train` does at every chunk boundary, through Sequential with a Dense head."""
    model = Sequential(make(num_layers=2), Dense(5, 4, dtype="float64"))
    x = np.random.default_rng(7).standard_normal((9, 2, 3))
    want, _ = model(x)
    a, s = model(x[:4])
    b, _ = model(x[4:], s)
    close(np.concatenate([a, b]), want)


def test_a_repeated_whole_call_gives_each_calls_results_through_the_same_views():
    """An executor's whole calls of one shape hand back the same views of their workspace (made once: outputs,
    finals, the input and initial states' gradients), each holding that call's results, whatever the earlier
    call's initial states were: a given one, then zeros (None), as a fresh executor gives them."""
    from rnngraph.run.backends import get_backend
    from rnngraph.run.executor import Executor
    from test_persistent_heads import problem_arrays
    cell = skip_cell(3, 5)
    ex = Executor(cell, get_backend("numpy"))
    params, runs = problem_arrays(cell, 6, 4, "float64")[0], []      # new parameter arrays would remake the views
    for seed, given in ((0, True), (1, False), (2, False)):
        _, x, init, gy, gf = problem_arrays(cell, 6, 4, "float64", seed)
        init = init if given else {}
        outs, finals = ex.forward(params, {"x": x}, init)
        gx, g0, _ = ex.backward({"h": gy}, gf)
        runs.append((outs["h"], finals, gx["x"], g0))
        fresh = Executor(cell, get_backend("numpy"))
        want_outs, want_finals = fresh.forward(params, {"x": x}, init)
        want_gx, want_g0, _ = fresh.backward({"h": gy}, gf)
        close(outs["h"], want_outs["h"])
        close(gx["x"], want_gx["x"])
        for s in cell.states:
            close(finals[s], want_finals[s])
            close(g0[s], want_g0[s])
    (y0, f0, gx0, g00), (y1, f1, gx1, g01) = runs[:2]
    assert y1 is y0 and gx1 is gx0 and all(f1[s] is f0[s] and g01[s] is g00[s] for s in cell.states)
