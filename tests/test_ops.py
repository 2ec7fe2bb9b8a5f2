"""The op table: every table has an entry for every op it applies to, each op's forward and backward
rules match torch through one helper, and softplus (the op added in one file) runs everywhere."""
import numpy as np
import pytest

from numerics import close, needs_torch, torch
from rnngraph import Cell, build_schedule, nn
from rnngraph.ir import ops
from rnngraph.ir.ops import OpKind
from rnngraph.lab.cli import main
from rnngraph.plan.schedule import schedule_flops
from rnngraph.run.backends.cuda.fused import fused_backward_kernel, fused_forward_kernel
from test_gradcheck import gradcheck

OPS = set(OpKind) - ops.SOURCES
APPLIES = {"ARITY": set(OpKind), "SHAPE": OPS, "FORWARD": OPS, "VJP": OPS, "KERNEL": ops.ELEMENTWISE,
           "FLOPS": OPS, "SYMBOL": OPS, "TORCH": OPS}


@pytest.mark.parametrize("table", sorted(APPLIES))
def test_every_table_has_an_entry_for_exactly_the_ops_it_applies_to(table):
    keys = set(getattr(ops, table))
    assert APPLIES[table] - keys == set(), f"{table} lacks {sorted(k.value for k in APPLIES[table] - keys)}"
    assert keys - APPLIES[table] == set(), f"{table} has stray {sorted(k.value for k in keys - APPLIES[table])}"


def test_kernel_entries_are_all_of_one_kind():
    for kind, (forward, backward) in ops.KERNEL.items():
        assert isinstance(forward, str) and len(backward) == ops.ARITY[kind], kind
        assert all(isinstance(e, str) for e in backward), kind


def test_fixed_arity_ops_have_one_backward_rule_per_operand():
    for kind in OPS:
        if ops.ARITY[kind] is not None:
            assert len(ops.VJP[kind]) == ops.ARITY[kind], kind


# -- each op against torch, through one helper --------------------------------------------------
N = 5
CASES = {  # name: (kind, operand shapes, attrs, torch function of the operands)
    "linear": (OpKind.LINEAR, [(N, 3), (4, 3)], (), lambda x, w: x @ w.T),
    "head_linear": (OpKind.HEAD_LINEAR, [(N, 6), (3, 4, 2)], (3,), lambda x, w: x @ torch.block_diag(*w).T),
    "add": (OpKind.ADD, [(N, 4), (N, 4)], (), lambda a, b: a + b),
    "add_bias": (OpKind.ADD, [(N, 4), (4,)], (), lambda a, b: a + b),
    "sub": (OpKind.SUB, [(N, 4), (N, 4)], (), lambda a, b: a - b),
    "mul": (OpKind.MUL, [(N, 4), (N, 4)], (), lambda a, b: a * b),
    "mul_diag": (OpKind.MUL, [(N, 4), (4,)], (), lambda a, b: a * b),
    "scale": (OpKind.SCALE, [(N, 4)], (-0.7,), lambda a: -0.7 * a),
    "one_minus": (OpKind.ONE_MINUS, [(N, 4)], (), lambda a: 1 - a),
    "sigmoid": (OpKind.SIGMOID, [(N, 4)], (), lambda a: torch.sigmoid(a)),
    "tanh": (OpKind.TANH, [(N, 4)], (), lambda a: torch.tanh(a)),
    "relu": (OpKind.RELU, [(N, 4)], (), lambda a: torch.relu(a)),
    "softplus": (OpKind.SOFTPLUS, [(N, 4)], (), lambda a: torch.nn.functional.softplus(a)),
    "identity": (OpKind.IDENTITY, [(N, 4)], (), lambda a: a),
    "slice": (OpKind.SLICE, [(N, 6)], (1, 4), lambda a: a[:, 1:4]),
    "concat": (OpKind.CONCAT, [(N, 2), (N, 3), (N, 1)], (), lambda *xs: torch.cat(xs, dim=1)),
    "exp": (OpKind.EXP, [(N, 4)], (), lambda a: torch.exp(a)),
    "div": (OpKind.DIV, [(N, 4), (N, 4)], (), lambda a, b: a / b),
    "div_vector": (OpKind.DIV, [(N, 4), (4,)], (), lambda a, b: a / b),
    "maximum": (OpKind.MAXIMUM, [(N, 4), (N, 4)], (), lambda a, b: torch.maximum(a, b)),
    "maximum_vector": (OpKind.MAXIMUM, [(N, 4), (4,)], (), lambda a, b: torch.maximum(a, b)),
    "rsqrt": (OpKind.RSQRT, [(N, 4)], (10.0,), lambda a: torch.rsqrt(a + 10.0)),     # ε keeps a + ε > 0
    "sum": (OpKind.SUM, [(N, 4)], (), lambda a: a.sum(1, keepdim=True).expand(-1, 4)),
    "mean": (OpKind.MEAN, [(N, 7)], (), lambda a: a.mean(1, keepdim=True).expand(-1, 7)),
}


def test_every_op_has_a_torch_case():
    assert {kind for kind, *_ in CASES.values()} == OPS


def check_op(kind, shapes, attrs, torch_fn, scale=1.0, seed=0):
    """Value and every operand's gradient of the op's rules (numpy, float64) equal torch's, and the
    op's own torch rule gives the same value."""
    rng = np.random.default_rng(seed)
    ins = [scale * rng.standard_normal(s) for s in shapes]
    tins = [torch.tensor(a, requires_grad=True) for a in ins]
    want = torch_fn(*tins)
    g = rng.standard_normal(tuple(want.shape))
    want.backward(torch.tensor(g))
    y = np.empty(tuple(want.shape))
    with np.errstate(over="raise", invalid="raise", divide="raise"):   # underflow to 0 is fine
        ops.FORWARD[kind](np, y, *ins, attrs)
        close(y, want)
        close(ops.TORCH[kind](torch, *tins, attrs).detach(), want)
        for slot, (a, ta) in enumerate(zip(ins, tins)):
            grad = np.zeros_like(a)
            ops.VJP[kind][slot](np, lambda v, cols=ops.ALL: ops.accumulate(grad[..., cols], v), g, *ins, y, attrs)
            close(grad, ta.grad)


@needs_torch
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_torch(name):
    check_op(*CASES[name])


@needs_torch
@pytest.mark.parametrize("scale", [10.0, 1000.0])
def test_softplus_is_stable_for_large_inputs(scale):
    check_op(*CASES["softplus"][:3], CASES["softplus"][3], scale=scale)


# -- softplus through the whole pipeline -------------------------------------------------------
def softplus_cell(D, H, bias=True):
    """An update h = tanh(W·x + b) ⊙ softplus(U·h[t-1]) − h[t-1]: softplus in the recurrent core."""
    c = Cell("softplus_cell")
    x, h = c.input("x", D), c.state("h", H)
    a = c.tanh(c.linear(x, "W", H, bias="b"))
    c.output(c.bind(h, a * c.apply("softplus", c.linear(h, "U", H)) - h, name="h"))
    return c.build()


def test_softplus_cell_gradients_match_central_differences_staged():
    assert gradcheck(nn.Recurrent(softplus_cell, 3, 4, dtype="float64", mode="staged", seed=1), T=6) >= 4


def test_softplus_cell_runs_the_same_in_every_cpu_mode():
    rng = np.random.default_rng(0)
    x, h0 = rng.standard_normal((6, 3, 2)), rng.standard_normal((1, 3, 5))
    runs = {}
    for mode in ("naive", "staged"):
        layer = nn.Recurrent(softplus_cell, 2, 5, dtype="float64", mode=mode, seed=3)
        y, hn = layer(x, h0)
        gy = np.ones_like(y)
        gx, g0, grads = layer.backward(gy, np.ones_like(hn))
        runs[mode] = [y, hn, gx, g0, *(grads[k] for k in sorted(grads))]
    for naive, staged in zip(runs["naive"], runs["staged"]):
        close(staged, naive, rtol=1e-12)


def test_softplus_kernel_source_holds_its_expressions():
    cell = softplus_cell(3, 4)
    (group,) = [it for it in build_schedule(cell).items if any(cell.op(n).kind is OpKind.SOFTPLUS
                                                               for n in it.nodes)]
    k = [cell.op(n).kind for n in group.nodes].index(OpKind.SOFTPLUS)
    for ctype in ("float", "double"):
        _, fwd = fused_forward_kernel(cell, group.nodes).source(ctype)
        _, bwd = fused_backward_kernel(cell, group.nodes, set(cell.params)).source(ctype)
        assert f"{ctype} v{k} = log1p(exp(-fabs(x" in fwd and "> 0 ? x" in fwd
        assert f"/ (1 + exp(-x" in bwd


def test_softplus_counts_one_flop_per_element():
    cell = softplus_cell(3, 4)
    plain = Cell("plain")
    x, h = plain.input("x", 3), plain.state("h", 4)
    a = plain.tanh(plain.linear(x, "W", 4, bias="b"))
    plain.output(plain.bind(h, a * plain.linear(h, "U", 4) - h, name="h"))
    with_op, without = schedule_flops(build_schedule(cell)), schedule_flops(build_schedule(plain.build()))
    assert with_op["forward"]["per_frame"] - without["forward"]["per_frame"] == 4
    assert with_op["backward"]["per_frame"] - without["backward"]["per_frame"] == 4


def test_softplus_cell_schedules_and_draws(tmp_path, capsys):
    path = tmp_path / "softplus.png"
    assert main(["schedule", "test_ops:softplus_cell", "--input-size", "3", "--hidden-size", "4",
                 "--draw", str(path)]) == 0
    assert "softplus" in capsys.readouterr().out
    assert path.stat().st_size > 10_000


@needs_torch
def test_softplus_cell_in_the_benchmarks_torch_graph_loop():
    from rnngraph.lab.references import GraphLoop
    from test_bench import assert_same_cell        # values, finals and input gradients vs the naive run
    assert_same_cell(GraphLoop, softplus_cell(5, 6))


# -- maximum: the gradient of a tie goes to the first operand, on every path --------------------
def test_maximum_gives_a_tie_to_its_first_operand():
    a, b, g = np.array([[1.0, 2.0, 3.0]]), np.array([[1.0, 5.0, -1.0]]), np.array([[10.0, 20.0, 30.0]])
    y = np.empty((1, 3))
    ops.FORWARD[OpKind.MAXIMUM](np, y, a, b, ())
    grads = [np.zeros((1, 3)), np.zeros((1, 3))]
    for slot in (0, 1):
        ops.VJP[OpKind.MAXIMUM][slot](np, lambda v, cols=ops.ALL: ops.accumulate(grads[slot][..., cols], v),
                                      g, a, b, y, ())
    np.testing.assert_array_equal(y, [[1.0, 5.0, 3.0]])
    np.testing.assert_array_equal(grads[0], [[10.0, 0.0, 30.0]])
    np.testing.assert_array_equal(grads[1], [[0.0, 20.0, 0.0]])
    if torch is not None:                   # the torch rule too (torch.maximum would split the tie)
        ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
        ops.TORCH[OpKind.MAXIMUM](torch, ta, tb, ()).backward(torch.tensor(g))
        np.testing.assert_array_equal(ta.grad.numpy(), grads[0])
        np.testing.assert_array_equal(tb.grad.numpy(), grads[1])


def test_maximum_kernel_source_gives_the_tie_to_the_first_operand():
    c = Cell("max_cell")
    x, h = c.input("x", 3), c.state("h", 4)
    m = c.maximum(c.linear(x, "W", 4), h, name="m")
    c.output(c.bind(h, c.tanh(m), name="h"))
    cell = c.build()
    (group,) = [it for it in build_schedule(cell).items if "m" in it.nodes]
    _, fwd = fused_forward_kernel(cell, group.nodes).source("float")
    _, bwd = fused_backward_kernel(cell, group.nodes, set(cell.params)).source("float")
    assert "? x0 : x1" in fwd and "(x0 >= x1 ? d0 : 0)" in bwd and "(x0 >= x1 ? 0 : d0)" in bwd
