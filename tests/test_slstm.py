"""The built-in head-wise cells on the CPU, float64: sLSTM against the xLSTM paper's stabilised equations written
here in numpy, against the unstabilised form where that does not overflow, the stabiliser changing no output;
the multi-head LSTM against torch.nn.LSTM with block-diagonal recurrent weights; every mode and loop strategy;
their options through load_cell and the layers."""
import numpy as np
import pytest

from numerics import close, needs_torch, torch
from rnngraph import RnnGraphError, build_schedule, load_cell, nn
from rnngraph.ir.cells import SLSTM_GATE_ORDER
from test_gradcheck import gradcheck

H, HEADS, D = 8, 4, 3


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def gates(layer, x_t, h):
    """Per gate (i, f, z, o): W·x + b + R·h with R block-diagonal, read from the layer's PyTorch-layout
    parameters as documented (weight_ih [4H, D], weight_hh [4·heads, H/heads, H/heads], bias [4H])."""
    P = layer.parameters()
    W, R, b = P["weight_ih_l0"], P["weight_hh_l0"], P["bias_l0"]
    k = R.shape[0] // 4
    out = {}
    for j, g in enumerate(SLSTM_GATE_ORDER):
        Rg = R[j * k:(j + 1) * k]                                                        # [k, H/k, H/k]
        rec = np.einsum("bkj,kij->bki", h.reshape(len(h), k, -1), Rg).reshape(len(h), -1)
        out[g] = x_t @ W[j * H:(j + 1) * H].T + b[j * H:(j + 1) * H] + rec
    return out


def stabilised(layer, x, h, c, n, m):
    """The paper's sLSTM (eqs. 8-17, exponential forget gate), frame by frame: y [T, B, H] and the finals."""
    ys = []
    for t in range(len(x)):
        a = gates(layer, x[t], h)
        m_new = np.maximum(a["f"] + m, a["i"])
        i, f = np.exp(a["i"] - m_new), np.exp(a["f"] + m - m_new)
        c, n, m = f * c + i * np.tanh(a["z"]), f * n + i, m_new
        h = sigmoid(a["o"]) * c / n
        ys.append(h)
    return np.array(ys), (h, c, n, m)


def unstabilised(layer, x, h, C, N):
    """The same recurrence with i = exp(ĩ), f = exp(f̃) as they are: C and N are c and n times e^m."""
    ys = []
    for t in range(len(x)):
        a = gates(layer, x[t], h)
        i, f = np.exp(a["i"]), np.exp(a["f"])
        C, N = f * C + i * np.tanh(a["z"]), f * N + i
        h = sigmoid(a["o"]) * C / N
        ys.append(h)
    return np.array(ys), (h, C, N)


def layer_and_problem(seed=0, scale=0.5, mode="staged", loop="auto", **options):
    layer = nn.Recurrent("slstm", D, H, dtype="float64", mode=mode, loop=loop, seed=seed, **options)
    rng = np.random.default_rng(seed)
    for p in layer.parameters().values():
        p[...] = scale * rng.standard_normal(p.shape)
    x = rng.standard_normal((9, 2, D))
    h0, c0 = rng.standard_normal((2, H)), rng.standard_normal((2, H))
    n0, m0 = rng.uniform(0.5, 2.0, (2, H)), rng.standard_normal((2, H))
    return layer, x, (h0, c0, n0, m0)


@pytest.mark.parametrize("mode, loop", [("naive", "stages"), ("staged", "stages"), ("staged", "persistent")])
def test_slstm_is_the_papers_stabilised_recurrence(mode, loop):
    layer, x, init = layer_and_problem(mode=mode, loop=loop)
    want, finals = stabilised(layer, x, *init)
    y, state = layer(x, tuple(s[None] for s in init))
    close(y, want)
    for got, w in zip(state, finals, strict=True):
        close(got[0], w)


def test_slstm_from_zero_states_divides_by_a_positive_normaliser():
    layer, x, _ = layer_and_problem(seed=1)
    zeros = tuple(np.zeros((2, H)) for _ in range(4))
    y, (h, c, n, m) = layer(x)
    want, _ = stabilised(layer, x, *zeros)
    close(y, want)
    assert (n > 0).all() and np.isfinite(y).all()


def test_slstm_equals_the_unstabilised_form_where_that_does_not_overflow():
    layer, x, (h0, c0, n0, m0) = layer_and_problem(seed=2)
    y, (_, c, n, m) = layer(x, tuple(s[None] for s in (h0, c0, n0, m0)))
    want, (_, C, N) = unstabilised(layer, x, h0, c0 * np.exp(m0), n0 * np.exp(m0))
    close(y, want)
    close(c[0] * np.exp(m[0]), C)                   # the states: the unstabilised sums, times e^-m
    close(n[0] * np.exp(m[0]), N)


def test_slstm_stays_finite_where_the_unstabilised_form_overflows():
    layer, x, _ = layer_and_problem(seed=3, scale=60.0)         # gate pre-activations of several hundred
    y, _ = layer(x)
    zeros = tuple(np.zeros((2, H)) for _ in range(4))
    close(y, stabilised(layer, x, *zeros)[0])
    with np.errstate(over="ignore", invalid="ignore"):
        raw, _ = unstabilised(layer, x, *zeros[:3])
    assert np.isfinite(y).all() and not np.isfinite(raw).all()


@pytest.mark.parametrize("shift", [-7.0, 3.0, 40.0])
def test_the_stabiliser_changes_no_output(shift):
    """(c0, n0, m0) and (c0·e^-δ, n0·e^-δ, m0 + δ) are one state: the same outputs, and so are the gradients
    of everything but the initial state; from c0 = n0 = 0 any m0 gives the same outputs."""
    layer, x, (h0, c0, n0, m0) = layer_and_problem(seed=4)
    e = np.exp(-shift)
    runs = []
    for init in ((h0, c0, n0, m0), (h0, c0 * e, n0 * e, m0 + shift)):
        y, state = layer(x, tuple(s[None] for s in init))
        gx, _, grads = layer.backward(np.cos(y), (np.sin(state[0]), None, None, None))
        runs.append([y.copy(), state[0].copy(), gx.copy(), *(grads[k].copy() for k in sorted(grads))])
    for a, b in zip(*runs, strict=True):
        close(a, b, 1e-9)
    zero = np.zeros((1, 2, H))
    ys = [layer(x, (h0[None], zero, zero, np.full((1, 2, H), m)))[0].copy() for m in (-5.0, 0.0, 5.0)]
    close(ys[0], ys[1])
    close(ys[2], ys[1])


def test_slstm_gradients_match_central_differences():
    layer, _, _ = layer_and_problem(seed=5)
    assert gradcheck(layer, T=6) == 1 + 4 + 3


@pytest.mark.parametrize("cell", ["slstm", "mh_lstm"])
def test_every_cpu_mode_and_strategy_agree(cell):
    """naive, staged 'stages' and staged 'persistent' (on numpy: the stages frame by frame): two layers both
    ways, ragged, states carried across two calls; bit for bit between the two staged strategies."""
    opts = dict(num_layers=2, bidirectional=True, dtype="float64", heads=2)
    layers = {(m, lp): nn.Recurrent(cell, D, H, mode=m, loop=lp, seed=6, **opts)
              for m, lp in (("naive", "stages"), ("staged", "stages"), ("staged", "persistent"))}
    assert {lp for _, lp in layers} == set(build_schedule(load_cell(cell, D, H, heads=2)).loop_strategies)
    rng = np.random.default_rng(7)
    x, lengths = rng.standard_normal((11, 3, D)), np.array([11, 6, 1])
    runs = {}
    for key, layer in layers.items():
        out, state = [], None
        for part in (x[:5], x[5:]):                     # two calls, the state carried
            y, state = layer(part, state)
            gx, g0, grads = layer.backward(np.tanh(y), tuple(np.ones_like(s) for s in state))
            out += [y.copy(), *(s.copy() for s in state), gx.copy(), *(g.copy() for g in g0),
                    *(grads[k].copy() for k in sorted(grads))]
        y, _ = layer(x, None, lengths)
        runs[key] = out + [y.copy()]
    for a, b in zip(runs["staged", "persistent"], runs["staged", "stages"], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(runs["naive", "stages"], runs["staged", "stages"], strict=True):
        close(a, b, 1e-12)


@needs_torch
def test_mh_lstm_is_torchs_lstm_with_block_diagonal_recurrent_weights():
    """rnngraph.torch.Recurrent('mh_lstm', heads=4) against torch.nn.LSTM whose weight_hh is the block
    diagonal of the four gates' heads: outputs, states and every gradient."""
    import rnngraph.torch as rt
    torch.manual_seed(0)
    ours = rt.Recurrent("mh_lstm", D, H, num_layers=2, bidirectional=True, heads=HEADS).double()
    ref = torch.nn.LSTM(D, H, num_layers=2, bidirectional=True).double()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            q = getattr(ours, name)                 # weight_hh: four gates of [k, H/k, H/k], a block diagonal each
            p.copy_(torch.cat([torch.block_diag(*g) for g in q.view(4, HEADS, H // HEADS, H // HEADS)])
                    if name.startswith("weight_hh") else q)
    xs = [torch.randn(7, 2, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
          for _ in range(2)]
    got, want = ours(xs[0]), ref(xs[1])
    close(got[0].detach(), want[0].detach())
    for a, b in zip(got[1], want[1], strict=True):
        close(a.detach(), b.detach())
    for r in (got, want):
        ((r[0] ** 2).sum() + r[1][1].sum()).backward()
    close(xs[0].grad, xs[1].grad)
    for name, p in ref.named_parameters():
        q = getattr(ours, name).grad
        if name.startswith("weight_hh"):            # the diagonal blocks of the full matrix's gradient
            blocks = p.grad.view(4, HEADS, H // HEADS, HEADS, H // HEADS)
            p_grad = torch.stack([blocks[:, k, :, k] for k in range(HEADS)], 1).reshape(q.shape)
        else:
            p_grad = p.grad
        close(q, p_grad)


@needs_torch
def test_the_torch_module_takes_heads():
    import rnngraph.torch as rt
    m = rt.Recurrent("slstm", 16, 32, heads=4)
    assert repr(m) == "Recurrent(cell=slstm, 16, 32, heads=4)"
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "weight_ih_l0": (128, 16), "weight_hh_l0": (16, 8, 8), "bias_l0": (128,)}
    x = torch.randn(5, 3, 16, requires_grad=True)
    y, (h, c, n, mm) = m(x)
    assert y.shape == (5, 3, 32) and h.shape == c.shape == n.shape == mm.shape == (1, 3, 32)
    (y.sum() + n.sum()).backward()
    assert x.grad.shape == x.shape and m.weight_hh_l0.grad.shape == (16, 8, 8)


def test_heads_default_to_four_or_what_divides_the_hidden_size():
    R = lambda cell, H, **kw: load_cell(cell, 3, H, **kw).params["R_i" if cell == "slstm" else "W_hi"]
    assert R("slstm", 16) == (4, 4, 4) and R("mh_lstm", 16) == (4, 4, 4)
    assert R("slstm", 6) == (3, 2, 2) and R("slstm", 10) == (2, 5, 5) and R("slstm", 5) == (5, 5)   # 1: full
    assert R("slstm", 16, heads=8) == (8, 2, 2) and R("mh_lstm", 16, heads=1) == (16, 16)


def test_cell_options_errors_name_what_the_cell_takes():
    with pytest.raises(RnnGraphError, match=r"^cell 'lstm' takes no option 'heads'; its options: proj_size$"):
        nn.Recurrent("lstm", 3, 8, heads=2)
    with pytest.raises(RnnGraphError, match=r"^cell 'slstm' takes no option 'head'; its options: heads$"):
        load_cell("slstm", 3, 8, head=2)
    with pytest.raises(RnnGraphError, match=r"^cell 'mh_lstm' splits hidden_size 8 into heads=3 heads: pass a "
                                            r"positive integer that divides it"):
        nn.Recurrent("mh_lstm", 3, 8, heads=3)
    with pytest.raises(RnnGraphError, match=r"apply to a cell function; cell 'slstm' is a CellGraph"):
        load_cell(load_cell("slstm", 3, 8), 3, 8, heads=2)


def test_the_layers_orthogonal_init_makes_each_head_orthogonal():
    layer = nn.Recurrent("mh_lstm", 3, 8, heads=2, init="orthogonal", dtype="float64")
    w = layer.parameters()["weight_hh_l0"]                  # [4·2, 4, 4]
    for block in w:
        close(block @ block.T, np.eye(4), 1e-12)


@pytest.mark.parametrize("cell, weights", [("slstm", ("R_i", "R_f", "R_z", "R_o")),
                                           ("mh_lstm", ("W_hi", "W_hf", "W_hg", "W_ho"))])
def test_the_recurrent_products_are_one_batched_gemm_a_frame_and_each_head_its_own_recurrence(cell, weights):
    s = build_schedule(load_cell(cell, D, H))
    (gemm,) = s.loop[0]
    assert (gemm.operand, gemm.delay, gemm.weights, gemm.heads) == ("h", 1, weights, HEADS)
    assert {c.heads for c in s.state_classes.values()} == {HEADS}
    assert "    runs all stages as one kernel a direction on the GPU, each block owning whole heads of the 4 " in str(s)
    full = build_schedule(load_cell(cell, D, H, heads=1))
    assert full.loop[0][0].heads == 1 and {c.heads for c in full.state_classes.values()} == {None}
    assert "    runs all stages as one cooperative kernel a direction on the GPU" in str(full)
