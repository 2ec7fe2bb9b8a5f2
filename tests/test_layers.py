"""Dense, Softmax/LogSoftmax and Sequential: against torch, against finite differences, and their errors."""
import numpy as np
import pytest

from rnngraph.errors import RnnGraphError
from numerics import F, close, directional, needs_torch, torch
from rnngraph.nn.layers import CrossEntropyLoss, Dense, LogSoftmax, MSELoss, Sequential, Softmax

@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- Dense ------------------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 3, 5), (1, 1, 5), (4, 5)])
def test_dense_matches_torch_linear(bias, shape, rng):
    ref = torch.nn.Linear(5, 4, bias=bias, dtype=torch.float64)
    dense = Dense(5, 4, bias=bias, dtype="float64", seed=0)
    dense.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    x, gy = rng.standard_normal(shape), rng.standard_normal(shape[:-1] + (4,))
    xt = torch.tensor(x, requires_grad=True)
    yt = ref(xt)
    yt.backward(torch.tensor(gy))
    y = dense(x)
    gx = dense.backward(gy)
    close(y, yt)
    close(gx, xt.grad)
    assert set(dense.grads) == {k for k, _ in ref.named_parameters()}
    for k, p in ref.named_parameters():
        close(dense.grads[k], p.grad)


def test_dense_finite_differences(rng):
    dense = Dense(6, 3, dtype="float64", seed=1)
    x, w = rng.standard_normal((5, 2, 6)), rng.standard_normal((5, 2, 3))
    dense(x)
    gx = dense.backward(w)
    directional(lambda v: float((dense.forward(v)[0] * w).sum()), x, gx, rng)
    for name, p in dense.parameters().items():
        def f(v, p=p):
            saved = p.copy()
            p[...] = v
            out = float((dense.forward(x)[0] * w).sum())
            p[...] = saved
            return out
        directional(f, p.copy(), dense.grads[name], rng)


def test_dense_explicit_cache_pairs_forward_and_backward(rng):
    dense = Dense(4, 2, dtype="float64", seed=0)
    x1, x2, g = rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 2))
    _, cache1 = dense.forward(x1)
    dense(x2)                                    # the implicit cache is now x2's
    dense.backward(g, cache1)
    assert np.array_equal(dense.grads["weight"], g.reshape(-1, 2).T @ x1.reshape(-1, 4))


def test_dense_init_seeded_and_bounded():
    a, b, c = Dense(9, 4, seed=3), Dense(9, 4, seed=3), Dense(9, 4, seed=4)
    assert all(np.array_equal(a.state_dict()[k], b.state_dict()[k]) for k in ("weight", "bias"))
    assert not np.array_equal(a.weight, c.weight)
    assert a.weight.dtype == np.float32 and a.weight.shape == (4, 9) and a.bias.shape == (4,)
    assert np.abs(a.weight).max() <= 1 / 3 and np.abs(a.bias).max() <= 1 / 3
    assert np.array_equal(Dense(9, 4).weight, Dense(9, 4, seed=0).weight)   # seed=0 by default, as nn.Recurrent
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    assert np.array_equal(Dense(3, 2, rng=r1).weight, Dense(3, 2, rng=r2).weight)
    assert Dense(3, 2, rng=r1).rng is r1 and isinstance(a.rng, np.random.Generator)
    with pytest.raises(RnnGraphError, match="either seed or rng"):
        Dense(3, 2, seed=1, rng=np.random.default_rng(1))


def test_dense_errors():
    dense = Dense(8, 2, dtype="float64", seed=0)
    with pytest.raises(RnnGraphError, match=r"expected input \[\.\.\., 8\], got shape \(5, 3, 7\)"):
        dense(np.zeros((5, 3, 7)))
    with pytest.raises(RnnGraphError, match="dtype mismatch, expected float64, got float32"):
        dense(np.zeros((5, 3, 8), dtype=np.float32))
    with pytest.raises(RnnGraphError, match="expected an array"):
        dense([[0.0] * 8])
    with pytest.raises(RnnGraphError, match="needs a forward call"):
        Dense(8, 2, seed=0).backward(np.zeros((1, 2), dtype=np.float32))
    dense(np.zeros((5, 3, 8)))
    with pytest.raises(RnnGraphError, match=r"expected grad_y of shape \(5, 3, 2\), got \(5, 3, 4\)"):
        dense.backward(np.zeros((5, 3, 4)))
    with pytest.raises(RnnGraphError, match="dtype must be one of"):
        Dense(8, 2, dtype="int32")


def test_dense_load_state_dict_lists_every_problem():
    dense = Dense(8, 2, seed=0)
    with pytest.raises(RnnGraphError) as e:
        dense.load_state_dict({"weight": np.zeros((2, 7)), "extra": np.zeros(1)})
    msg = str(e.value)
    assert msg.startswith("cannot load state dict into Dense:")
    assert "missing keys: bias\n" in msg and "unexpected keys: extra\n" in msg
    assert "wrong shapes: weight: expected [2, 8], got [2, 7]" in msg
    w = dense.weight
    assert dense.load_state_dict({"weight": np.ones((2, 8)), "bias": np.ones(2)}) is dense
    assert dense.weight is w and w.dtype == np.float32 and (w == 1).all()   # in place: optimizers keep their arrays
    dense.load_state_dict({"weight": np.full((2, 8), 2.0), "extra": np.zeros(1)}, strict=False)
    assert (w == 2).all() and (dense.bias == 1).all()              # non-strict: partial loads
    with pytest.raises(RnnGraphError, match=r"wrong shapes: weight: expected \[2, 8\], got \[8, 2\]"):
        dense.load_state_dict({"weight": np.ones((8, 2))}, strict=False)


@needs_torch
def test_dense_load_state_dict_takes_torch_tensors_as_is():
    dense = Dense(8, 2, seed=0)
    w = dense.weight
    dense.load_state_dict({"weight": np.ones((2, 8)), "bias": np.ones(2)})
    dense.load_state_dict({"weight": torch.full((2, 8), 2.0), "extra": np.zeros(1)}, strict=False)
    assert dense.weight is w and w.dtype == np.float32
    assert (w == 2).all() and (dense.bias == 1).all()              # non-strict: partial loads, torch tensors as is


# -- Softmax / LogSoftmax -------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("dim", [-1, 1])
@pytest.mark.parametrize("cls, ref", [(Softmax, lambda x, d: torch.softmax(x, d)),     # lambdas: torch may be None
                                      (LogSoftmax, lambda x, d: torch.log_softmax(x, d))])
def test_softmax_family_matches_torch(cls, ref, dim, rng):
    x, gy = rng.standard_normal((6, 3, 5)) * 4, rng.standard_normal((6, 3, 5))
    m = cls(dim)
    xt = torch.tensor(x, requires_grad=True)
    yt = ref(xt, dim)
    yt.backward(torch.tensor(gy))
    close(m(x), yt)
    close(m.backward(gy), xt.grad)
    assert m.parameters() == {} and m.state_dict() == {}
    directional(lambda v: float((m.forward(v)[0] * gy).sum()), x, m.backward(gy, m.forward(x)[1]), rng)


def test_softmax_family_is_stable_for_huge_logits():
    x = np.array([[[1e4, 0.0, -1e4]]])
    assert np.isfinite(Softmax()(x)).all() and np.isfinite(LogSoftmax()(x)).all()
    close(LogSoftmax()(x)[0, 0, :2], [0.0, -1e4])


# -- Sequential -----------------------------------------------------------------------------------------

class Leaky:
    """A minimal recurrent module for the protocol: h_t = a ⊙ h_{t-1} + x_t, y_t = h_t; parameter a [D]."""

    def __init__(self, D, rng):
        self.a = rng.uniform(0.2, 0.9, D)                 # [D]
        self.grads = {}

    def parameters(self):
        return {"a": self.a}

    def state_dict(self):
        return {"a": self.a.copy()}

    def load_state_dict(self, d):
        self.a[...] = d["a"]

    def __call__(self, x, state=None):                    # x: [T, B, D], state: [B, D]
        T, B, D = x.shape
        self.h = np.zeros((T + 1, B, D))                  # [T+1, B, D], frame 0 the initial state
        if state is not None:
            self.h[0] = state
        for t in range(T):
            self.h[t + 1] = self.a * self.h[t] + x[t]
        return self.h[1:].copy(), self.h[T].copy()

    def backward(self, grad_y, grad_state_n=None):
        gh = np.zeros_like(self.h[0]) if grad_state_n is None else grad_state_n.copy()
        gx, ga = np.empty_like(grad_y), np.zeros_like(self.a)
        for t in reversed(range(len(grad_y))):
            gh = gh + grad_y[t]
            gx[t] = gh
            ga += (gh * self.h[t]).sum(axis=0)
            gh = gh * self.a
        self.grads = {"a": ga}
        return gx, gh, dict(self.grads)


def _model(rng):
    return Sequential(Leaky(4, rng), Dense(4, 3, dtype="float64", seed=0), LogSoftmax())


def test_sequential_forward_backward_names_and_states(rng):
    model = _model(rng)
    x, h0 = rng.standard_normal((6, 2, 4)), rng.standard_normal((2, 4))
    y, states = model(x, [h0, None, None])
    leaky, dense, lsm = model.modules
    ref_y, ref_h = Leaky.__call__(leaky, x, h0)
    assert np.array_equal(y, lsm(dense(ref_y))) and np.array_equal(states[0], ref_h) and states[1:] == [None, None]
    model(x, [h0, None, None])
    gy, gh = rng.standard_normal(y.shape), rng.standard_normal(h0.shape)
    gx, gstates0, grads = model.backward(gy, [gh, None, None])
    assert list(grads) == ["0.a", "1.weight", "1.bias"] == list(model.parameters()) == list(model.state_dict())
    assert gstates0[1:] == [None, None] and gstates0[0].shape == h0.shape

    def objective(x_, h0_=h0):
        y_, s_ = model(x_, [h0_, None, None])
        return float((y_ * gy).sum() + (s_[0] * gh).sum())
    directional(objective, x, gx, rng)
    directional(lambda v: objective(x, v), h0, gstates0[0], rng)
    for name, p in model.parameters().items():
        def f(v, p=p):
            saved = p.copy()
            p[...] = v
            out = objective(x)
            p[...] = saved
            return out
        directional(f, p.copy(), grads[name], rng)


def test_sequential_state_dict_round_trip_and_errors(rng):
    a, b = _model(rng), _model(np.random.default_rng(99))
    b.load_state_dict(a.state_dict())
    x = rng.standard_normal((3, 2, 4))
    assert np.array_equal(a(x)[0], b(x)[0])
    bad = a.state_dict()
    bad.pop("1.bias")
    bad["2.weight"] = np.zeros(1)
    bad["1.weight"] = np.zeros((3, 5))
    with pytest.raises(RnnGraphError) as e:
        b.load_state_dict(bad)
    assert all(s in str(e.value) for s in ("cannot load state dict into Sequential:", "missing keys: 1.bias\n",
                                           "unexpected keys: 2.weight\n",
                                           "wrong shapes: 1.weight: expected [3, 4], got [3, 5]"))
    part = {k: v + 1 for k, v in a.state_dict().items() if k.startswith("1.")}
    assert b.load_state_dict({**part, "9.bogus": np.zeros(1)}, strict=False) is b
    assert np.array_equal(b[1].weight, part["1.weight"]) and np.array_equal(b.state_dict()["0.a"], a.state_dict()["0.a"])
    with pytest.raises(RnnGraphError, match="list of 3 entries"):
        a(x, [None])
    with pytest.raises(RnnGraphError, match="module 1 .Dense. is feed-forward"):
        a(x, [None, np.zeros(1), None])
    with pytest.raises(RnnGraphError, match="at least one module"):
        Sequential()


def test_nested_sequential_uses_torch_style_prefixes(rng):
    model = Sequential(Leaky(4, rng), Sequential(Dense(4, 3, dtype="float64", seed=0), Softmax()))
    y, _ = model(rng.standard_normal((2, 2, 4)))
    _, _, grads = model.backward(np.ones_like(y))
    assert list(grads) == ["0.a", "1.0.weight", "1.0.bias"] == list(model.parameters())


@needs_torch
def test_sequential_with_nn_lstm_matches_torch(rng):
    nn = pytest.importorskip("rnngraph.nn")
    if not hasattr(nn, "LSTM"):
        pytest.skip("rnngraph.nn has no LSTM yet")
    T, B, D, H, C = 7, 3, 5, 6, 4
    lstm_t, lin_t = torch.nn.LSTM(D, H, num_layers=2, dtype=torch.float64), torch.nn.Linear(H, C, dtype=torch.float64)
    model = Sequential(nn.LSTM(D, H, num_layers=2, dtype="float64"), Dense(H, C, dtype="float64"))
    model.load_state_dict({f"{i}.{k}": v.detach().numpy()
                           for i, m in enumerate((lstm_t, lin_t)) for k, v in m.state_dict().items()})
    x, target = rng.standard_normal((T, B, D)), rng.integers(0, C, (T, B))
    target[0, 1] = -100
    xt = torch.tensor(x, requires_grad=True)
    ref = F.cross_entropy(lin_t(lstm_t(xt)[0]).reshape(-1, C), torch.tensor(target).reshape(-1))
    ref.backward()
    ce = CrossEntropyLoss()
    y, states = model(x)
    close(ce(y, target), ref)
    gx, _, grads = model.backward(ce.backward())
    close(gx, xt.grad)
    torch_grads = {f"{i}.{k}": p.grad for i, m in enumerate((lstm_t, lin_t)) for k, p in m.named_parameters()}
    assert set(grads) == set(torch_grads)
    for k, g in torch_grads.items():
        close(grads[k], g)


@pytest.mark.gpu
def test_layers_losses_and_optimizers_on_cupy_match_numpy(rng):
    import cupy

    from rnngraph.nn.optim import Adam, clip_grad_norm
    x, gy = rng.standard_normal((5, 3, 4)), rng.standard_normal((5, 3, 2))
    target, mask = rng.integers(0, 2, (5, 3)), rng.random((5, 3)) < 0.7
    results = []
    for backend, xp in (("numpy", np), ("cupy", cupy)):
        model = Sequential(Dense(4, 2, dtype="float64", seed=0, backend=backend), LogSoftmax())
        ce, mse = CrossEntropyLoss(), MSELoss()
        y, _ = model(xp.asarray(x))
        l1, l2 = ce(y, xp.asarray(target), xp.asarray(mask)), mse(y, xp.asarray(gy), xp.asarray(mask))
        g = model.backward(ce.backward() + mse.backward())[0]
        total = clip_grad_norm(model.grads, 0.1)
        Adam(model.parameters(), lr=0.1, weight_decay=0.01).step(model.grads)
        arrays = (y, l1, l2, g, total, *model.parameters().values())
        assert all(type(a) is xp.ndarray for a in arrays), [type(a) for a in arrays]
        results.append([cupy.asnumpy(a) for a in arrays[:5]] + list(model.state_dict().values()))
    for a, b in zip(*results):
        close(a, b)
    with pytest.raises(RnnGraphError, match="expected a cupy array .* got a numpy array"):
        Dense(4, 2, dtype="float64", seed=0, backend="cupy")(x)
