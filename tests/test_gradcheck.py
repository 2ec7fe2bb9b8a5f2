"""Directional central-difference gradient checks in float64, through the public layer API.

For a loss L = <gy, y> + Σ <gs, s_n> with random upstream gradients, each checked tensor (x, every
initial state, every parameter) gets its own random direction v, and the analytic <∇L, v> is
compared with (L(θ + εv) − L(θ − εv)) / 2ε.

Tolerance: with ε = 1e-6 the central difference's truncation error is ε²·|L'''|/6 ≈ 1e-12, and its
rounding error is about 1e-16·|L| / ε ≈ 1e-10·|L|. Both sit far below the 1e-6 relative bound, while
a wrong backward rule (a dropped term, a wrong sign, a wrong frame) gives errors of order one. For a
standard-normal v, <∇L, v> has scale ‖∇L‖, so the error is relative to max(|<∇L, v>|, ‖∇L‖), plus
a 1e-9·|L| floor for the rounding error when a gradient is exactly zero.
"""
import numpy as np
import pytest

from rnngraph import CELLS, Cell, nn

EPS, TOL = 1e-6, 1e-6


def as_tuple(s):
    return s if isinstance(s, tuple) else (s,)


def loss(layer, x, state, lengths, gy, gs):
    y, sn = layer(x, state, lengths=lengths)
    return float(np.vdot(gy, y) + sum(np.vdot(g, s) for g, s in zip(gs, as_tuple(sn))))


def gradcheck(layer, T=5, B=3, lengths=None, seed=0, dropout_seed=None):
    """Checks every parameter, x and every initial state of `layer` (float64) along random directions.
    dropout_seed: reseed the layer's generator before each call so every call draws the same masks."""
    rng = np.random.default_rng(seed)
    K = layer.num_layers * layer.num_directions
    x = rng.standard_normal((B, T, layer.input_size) if layer.batch_first else (T, B, layer.input_size))
    states = [rng.standard_normal((K, B, n)) for _, n in layer.cell.states.values()]
    state = tuple(states) if len(states) > 1 else states[0]

    def call():
        if dropout_seed is not None:
            layer.rng = np.random.default_rng(dropout_seed)
        return loss(layer, x, state, lengths, gy, gs)

    if dropout_seed is not None:
        layer.rng = np.random.default_rng(dropout_seed)
    y, sn = layer(x, state, lengths=lengths)
    gy, gs = rng.standard_normal(y.shape), [rng.standard_normal(s.shape) for s in as_tuple(sn)]
    gx, g0, grads = layer.backward(gy, tuple(gs) if len(gs) > 1 else gs[0])
    checked = [("x", x, gx)] + [(f"state0[{k}]", s, g) for k, (s, g) in enumerate(zip(states, as_tuple(g0)))]
    checked += [(n, p, grads[n]) for n, p in layer.parameters().items()]
    L0 = abs(call())
    for name, arr, grad in checked:
        v = rng.standard_normal(arr.shape)
        analytic = float(np.vdot(grad, v))
        arr += EPS * v
        lp = call()
        arr -= 2 * EPS * v
        lm = call()
        arr += EPS * v
        numeric = (lp - lm) / (2 * EPS)
        scale = max(abs(analytic), float(np.linalg.norm(grad)))
        assert abs(numeric - analytic) <= TOL * scale + 1e-9 * L0, \
            f"{layer.cell.name} {name}: analytic {analytic:.12g} vs numeric {numeric:.12g}"
    return len(checked)


# -- one small cell per op kind: each op sits inside the recurrence ---------------------------
def op_cell(kind):
    """A cell function whose update h = f(a, r) uses `kind`, with a = W·x + b and r = U·h[t-1]."""
    def fn(D, H, bias=True):
        c = Cell(f"op_{kind}")
        x, h = c.input("x", D), c.state("h", H)
        a, r = c.linear(x, "W", H, bias="b"), c.linear(h, "U", H)
        new = BODIES[kind](c, a, r, h, H)
        c.output(c.bind(h, new, name="h"))
        return c.build()
    return fn


BODIES = {
    "add": lambda c, a, r, h, H: c.tanh(a + r),
    "sub": lambda c, a, r, h, H: c.tanh(a - r),
    "mul": lambda c, a, r, h, H: c.tanh(a * r + a * a),                 # also one operand in both slots
    "scale": lambda c, a, r, h, H: c.tanh(0.7 * a + (-1.3) * r),
    "one_minus": lambda c, a, r, h, H: (1 - c.sigmoid(a + r)) * h + c.tanh(a),
    "sigmoid": lambda c, a, r, h, H: c.sigmoid(a + r),
    "tanh": lambda c, a, r, h, H: c.tanh(a + r),
    "relu": lambda c, a, r, h, H: c.relu(a + r),
    "identity": lambda c, a, r, h, H: c.identity(c.tanh(a + r)),
    "concat": lambda c, a, r, h, H: c.tanh(c.linear(c.concat(c.tanh(a), c.tanh(r)), "V", H)),
    "slice": lambda c, a, r, h, H: (lambda s: c.tanh(a + s[0]) * c.sigmoid(s[1]))(c.split(c.linear(h, "U2", 2 * H), 2)),
    "diag": lambda c, a, r, h, H: c.tanh(a + c.diag(h, "u")),
    "linear": lambda c, a, r, h, H: c.linear(c.tanh(a + r), "V", H, bias="c"),
    "delay2": lambda c, a, r, h, H: c.tanh(a + r + c.linear(h.ago(2), "U2", H)),
    "delay3": lambda c, a, r, h, H: c.tanh(a + c.linear(h.ago(3), "U3", H)),
    "exp": lambda c, a, r, h, H: c.tanh(a + r) * c.exp(c.tanh(r)),
    "div": lambda c, a, r, h, H: c.tanh(a) / c.exp(c.tanh(r)),
    "rsqrt": lambda c, a, r, h, H: c.tanh(a) * c.rsqrt(r * r, 1.0),
    "maximum": lambda c, a, r, h, H: c.tanh(c.maximum(a, r) + c.maximum(h, c.diag(h, "u"))),
    "head_linear": lambda c, a, r, h, H: c.tanh(a + c.linear(h, "R", H, heads=2)),
    "sum": lambda c, a, r, h, H: c.tanh(a + c.sum(r) * 0.3),
    "mean": lambda c, a, r, h, H: c.tanh(a + c.mean(r * r)),
    "layer_norm": lambda c, a, r, h, H: c.tanh(c.layer_norm(a + r, "g", "beta")),
    "rms_norm": lambda c, a, r, h, H: c.tanh(a + c.rms_norm(r, "g")),
}


@pytest.mark.parametrize("mode", ["staged", "naive"])
@pytest.mark.parametrize("kind", list(BODIES))
def test_gradcheck_each_op(kind, mode):
    layer = nn.Recurrent(op_cell(kind), 3, 4, dtype="float64", mode=mode, seed=1)
    assert gradcheck(layer, T=6) >= 4


def post_loop_cell(D, H, bias=True):
    """An output computed after the loop (post section) from the state, not the state itself."""
    c = Cell("post")
    x, h = c.input("x", D), c.state("h", H)
    h_new = c.bind(h, c.tanh(c.linear(x, "W", H, bias="b") + c.linear(h, "U", H)), name="h")
    c.output(c.sigmoid(c.linear(h_new, "V", H)) * h_new, name="y")
    return c.build()


def test_gradcheck_post_loop_output():
    gradcheck(nn.Recurrent(post_loop_cell, 3, 4, num_layers=2, dtype="float64"))


@pytest.mark.parametrize("cell", list(CELLS))
def test_gradcheck_builtin_cells(cell):
    gradcheck(nn.Recurrent(cell, 3, 4, dtype="float64", seed=2))


@pytest.mark.parametrize("cell", ["lstm", "gru", "sru"])
def test_gradcheck_two_layer_bidirectional_stack_with_lengths(cell):
    layer = nn.Recurrent(cell, 3, 4, num_layers=2, bidirectional=True, batch_first=True, dtype="float64")
    gradcheck(layer, T=6, B=3, lengths=[6, 2, 4])


def test_gradcheck_stack_with_dropout_masks():
    layer = nn.LSTM(3, 4, num_layers=3, bidirectional=True, dropout=0.4, dtype="float64")
    gradcheck(layer, T=4, B=2, lengths=[4, 3], dropout_seed=7)
