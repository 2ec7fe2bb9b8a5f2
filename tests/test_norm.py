"""Normalisation inside cells: layer_norm and rms_norm built from the row reductions (sum, mean), and the
layernorm_lstm built-in, against independent PyTorch code in float64 (1e-10: the same arithmetic up to
summation order), in naive and staged mode; where the planner puts the reductions."""
import numpy as np
import pytest

from numerics import needs_torch, torch
from rnngraph import Cell, load_cell
from rnngraph.ir.cellio import cell_from_dict, cell_to_dict
from rnngraph.ir.ops import REDUCE
from rnngraph.nn import Recurrent
from rnngraph.plan.items import Fused
from rnngraph.plan.loops import gemm_fused_pairs
from rnngraph.plan.schedule import build_schedule
from rnngraph.run.backends.cuda.rows import row_group

TOL = 1e-10


def rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def torch_layernorm_lstm(x, h, c, P, eps=1e-5):
    """Haste's LayerNorm-LSTM step by step with torch.nn.functional.layer_norm; P: the layer's parameters."""
    F, H = torch.nn.functional, h.shape[-1]
    ys = []
    for t in range(x.shape[0]):
        gates = (F.layer_norm(x[t] @ P["weight_ih_l0"].T, (4 * H,), P["ln_ih_weight_l0"], None, eps)
                 + F.layer_norm(h @ P["weight_hh_l0"].T, (4 * H,), P["ln_hh_weight_l0"], None, eps) + P["bias_l0"])
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(F.layer_norm(c, (H,), P["ln_c_weight_l0"], P["ln_c_bias_l0"], eps))
        ys.append(h)
    return torch.stack(ys), h, c


@needs_torch
@pytest.mark.parametrize("mode", ["naive", "staged"])
def test_layernorm_lstm_equals_torch(mode):
    layer = Recurrent("layernorm_lstm", 3, 5, dtype="float64", mode=mode, seed=4)
    rng = np.random.default_rng(0)
    for name, p in layer.parameters().items():       # gains away from 1, biases away from 0
        p[...] = rng.standard_normal(p.shape) * 0.5 + ("weight" in name and name.startswith("ln")) * 1.0
    x, h0, c0 = rng.standard_normal((6, 2, 3)), rng.standard_normal((1, 2, 5)), rng.standard_normal((1, 2, 5))
    y, (h, c) = layer(x, (h0, c0))
    gy, gh, gc = (rng.standard_normal(a.shape) for a in (y, h, c))
    gx, (gh0, gc0), grads = layer.backward(gy, (gh, gc))
    P = {k: torch.tensor(v, requires_grad=True) for k, v in layer.parameters().items()}
    tx, th0, tc0 = (torch.tensor(a, requires_grad=True) for a in (x, h0[0], c0[0]))
    ty, tht, tct = torch_layernorm_lstm(tx, th0, tc0, P)
    (ty * torch.tensor(gy)).sum().add((tht * torch.tensor(gh[0])).sum()).add((tct * torch.tensor(gc[0])).sum()).backward()
    for ours, theirs in [(y, ty), (h[0], tht), (c[0], tct), (gx, tx.grad), (gh0[0], th0.grad), (gc0[0], tc0.grad)] + \
            [(grads[k], P[k].grad) for k in P]:
        assert rel(ours, theirs.detach().numpy()) <= TOL


@needs_torch
def test_layernorm_gru_equals_torch():
    layer = Recurrent("layernorm_gru", 3, 5, dtype="float64", seed=4)
    rng = np.random.default_rng(1)
    for p in layer.parameters().values():
        p[...] += rng.standard_normal(p.shape) * 0.5
    x, h0 = rng.standard_normal((6, 2, 3)), rng.standard_normal((1, 2, 5))
    y, h = layer(x, h0)
    gy = rng.standard_normal(y.shape)
    gx, gh0, grads = layer.backward(gy)
    P = {k: torch.tensor(v, requires_grad=True) for k, v in layer.parameters().items()}
    tx, th = torch.tensor(x, requires_grad=True), torch.tensor(h0[0], requires_grad=True)
    F, hs, ht = torch.nn.functional, [], th
    for t in range(6):
        gi = F.layer_norm(tx[t] @ P["weight_ih_l0"].T, (15,), P["ln_ih_weight_l0"], None, 1e-5) + P["bias_ih_l0"]
        gh = F.layer_norm(ht @ P["weight_hh_l0"].T, (15,), P["ln_hh_weight_l0"], None, 1e-5) + P["bias_hh_l0"]
        (ir, iz, i_n), (hr, hz, hn) = gi.chunk(3, 1), gh.chunk(3, 1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        ht = (1 - z) * torch.tanh(i_n + r * hn) + z * ht
        hs.append(ht)
    (torch.stack(hs) * torch.tensor(gy)).sum().backward()
    pairs = [(y, torch.stack(hs)), (h[0], ht), (gx, tx.grad), (gh0[0], th.grad)] + [(grads[k], P[k].grad) for k in P]
    assert all(rel(a, b.detach().numpy()) <= TOL for a, b in pairs)


def test_norm_gains_start_at_one_and_biases_at_zero():
    """Whatever draws the other parameters (uniform, orthogonal, the torch module's reset_parameters)."""
    for init in ("uniform", "orthogonal"):
        P = Recurrent("layernorm_lstm", 3, 4, num_layers=2, init=init).parameters()
        assert all((P[k] == 1).all() for k in P if k.startswith(("ln_ih_weight", "ln_hh_weight", "ln_c_weight")))
        assert all((P[k] == 0).all() for k in P if k.startswith("ln_c_bias"))
        assert np.abs(P["weight_hh_l1"]).max() > 0 and (P["bias_l0"] == 0).all() == (init == "orthogonal")
    if torch is not None:
        import rnngraph.torch as rt
        m = rt.Recurrent("layernorm_gru", 3, 4)
        for k, p in m.named_parameters():
            assert (p == 1).all() if k.startswith("ln_") else p.abs().max() <= 0.5


@needs_torch
def test_rms_norm_in_the_recurrence_equals_torch():
    def cell(D, H, bias=True):
        c = Cell("rms_cell")
        x, h = c.input("x", D), c.state("h", H)
        c.output(c.bind(h, c.tanh(c.rms_norm(c.linear(x, "W", H) + c.linear(h, "U", H), "g", eps=1e-3)), name="h"))
        return c.build()

    layer = Recurrent(cell, 3, 4, dtype="float64", seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 3, 3))
    y, _ = layer(x)
    gy = rng.standard_normal(y.shape)
    gx, _, grads = layer.backward(gy)
    P = {k: torch.tensor(v, requires_grad=True) for k, v in layer.parameters().items()}
    tx, h, ys = torch.tensor(x, requires_grad=True), torch.zeros(3, 4, dtype=torch.float64), []
    for t in range(5):
        a = tx[t] @ P["W_l0"].T + h @ P["U_l0"].T
        h = torch.tanh(a * torch.rsqrt((a * a).mean(1, keepdim=True) + 1e-3) * P["g_l0"])
        ys.append(h)
    (torch.stack(ys) * torch.tensor(gy)).sum().backward()
    assert rel(y, torch.stack(ys).detach().numpy()) <= TOL and rel(gx, tx.grad.numpy()) <= TOL
    assert all(rel(grads[k], P[k].grad.numpy()) <= TOL for k in P)


def test_the_plan_hoists_the_input_norm_and_makes_each_norm_one_row_group():
    """A group holding a row reduction runs a block per row: all its ops have the row's width (so none
    works on another row's features), and it never runs inside a per-feature GEMV kernel (a pair)."""
    cell = load_cell("layernorm_lstm", 3, 5)
    sched = build_schedule(cell)
    where = sched.section_of()
    reductions = [where[n] for n in cell.graph if cell.op(n).kind in REDUCE]
    assert reductions.count("pre") == 2             # μ and σ² of LN(W_ih·x): once over all T·B rows
    assert sum(w.startswith("stage") for w in reductions) == 4     # those of LN(W_hh·h) and LN(c'), per frame
    rows = [it for st in sched.loop for it in st if isinstance(it, Fused) and row_group(cell, it.nodes)]
    assert [sum(cell.op(n).kind in REDUCE for n in it.nodes) for it in rows] == [2, 2]
    assert [{cell.op(n).size for n in it.nodes} for it in rows] == [{4 * 5}, {5}]
    assert not gemm_fused_pairs(cell, sched.loop)
    assert sched.loop_strategies == ("stages",)     # a row-wide op in the recurrence: no scan, elementwise, persistent
    assert "reduces over features inside the loop" in sched.blocked_loops["persistent"]


def test_norm_cells_round_trip_through_json():
    cell = load_cell("layernorm_lstm", 3, 5)
    back = cell_from_dict(cell_to_dict(cell))
    assert cell_to_dict(back) == cell_to_dict(cell)
    rs = [cell.op(n).attrs for n in cell.graph if cell.op(n).kind.value == "rsqrt"]
    assert rs == [(1e-5,)] * 3
    assert back.inits == cell.inits == {"ln_ih_weight": 1.0, "ln_hh_weight": 1.0, "ln_c_weight": 1.0, "ln_c_bias": 0.0}
