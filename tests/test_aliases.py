"""Gradients that are one another (plan/aliases.py): the classes the plan finds, the buffers a workspace of a
backend that shares them carves, the specs that store a class once, and results equal to the numpy reference's
with separate buffers: the numpy backend made to share (the rule-table path, float64 and float16), and the
compiled cpu backend, which shares by default (tests/test_cpu_backend.py runs every cell and strategy on it)."""
import numpy as np
import pytest

from rnngraph.arrays import address
from rnngraph.ir.cells import CELLS
from rnngraph.ir.loading import load_cell
from rnngraph.ir.ops import KERNEL
from rnngraph.nn import Recurrent
from rnngraph.plan.items import Fused, Gemm
from rnngraph.plan.schedule import build_schedule
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.run.workspace import UNTOUCHED, Workspace, stored_bytes
from test_random_forms import random_cell

GATES = ("i", "f", "g", "o")


def lstm_sched(H=8):
    return build_schedule(load_cell("lstm", 4, H))


def test_an_lstms_gate_gradients_are_one_class_a_gate_and_its_two_biases_one_sum():
    sched = lstm_sched()
    a = sched.grad_aliases
    pre, loop = sched.pre[0], sched.loop[0][0]
    assert isinstance(pre, Gemm) and isinstance(loop, Gemm) and loop.operand == "h"
    assert a.windows == {loop: (pre, 0)}        # h's four products are the x products' columns
    for k in range(4):
        x_prod, h_prod = pre.nodes[k], loop.nodes[k]
        same = {x_prod, h_prod, f"add{2 + 4 * k}", f"add{4 + 4 * k}", f"add{17 + k}"}
        assert set(a.members(x_prod)) == same and {a.home[n] for n in same} == {x_prod}
    # a gate's two biases: one sum, the other its twin (which is which follows the reductions' order)
    assert {frozenset((s.param, t.param)) for s, t in a.twins.items()} == {frozenset((f"b_i{g}", f"b_h{g}"))
                                                                         for g in GATES}
    assert set(a.members("c")) == {"c", "mul21", "mul22"}        # c = f ⊙ c@t-1 + i ⊙ g
    assert "h" not in a.home and "tanh24" not in a.home


def test_an_mgus_two_recurrent_products_are_windows_of_the_input_products():
    sched = build_schedule(load_cell("mgu", 4, 8))
    pre = sched.pre[0]
    loops = [it for st in sched.loop for it in st if isinstance(it, Gemm)]
    assert sched.grad_aliases.windows == {loops[0]: (pre, 0), loops[1]: (pre, 8)}


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_every_member_has_one_reader_that_hands_its_gradient_on(cell):
    """A member that is not its class's root is read once, at delay 0, by a skipped hand-on '{g}' of its
    class; no input, output, state or parameter is one; a class's members have one size and one buffer."""
    c = load_cell(cell, 4, 8)
    a = build_schedule(c).grad_aliases
    fixed = {*c.inputs, *c.outputs, *c.params, *(p for p, _ in c.states.values())}
    for n, r in a.root.items():
        assert c.op(n).size == c.op(r).size and a.home[n] == a.home[r]
        if n == r:
            continue
        reads = [(m, k, d) for m in c.graph.successors(n) for k, (u, d) in enumerate(c.reads(m)) if u == n]
        assert n not in fixed and len(reads) == 1
        (m, k, d), = reads
        assert d == 0 and (m, k) in a.skips and a.root[m] == r and KERNEL[c.op(m).kind][1][k] == "{g}"


def test_the_plan_lists_its_gradient_classes_and_the_gradients_one_write_makes_whole():
    s = build_schedule(load_cell("mgu", 4, 8)).summary()
    assert s["grad_classes"] == [["linear1", "add2", "linear3", "add4"], ["linear5", "add6", "linear8", "add9"],
                                 ["mul11", "mul12", "h"]]
    assert s["grad_assigned"] == ["x", "f", "mul7"]


def test_the_naive_schedule_and_a_scans_loop_share_nothing_of_their_own():
    c = load_cell("min_gru", 4, 8)
    assert not build_schedule(c, optimize=False).grad_aliases.home
    sched = build_schedule(c, loop="scan")
    loop_nodes = {n for st in sched.loop for it in st for n in it.nodes}
    assert sched.grad_aliases.home and not loop_nodes & set(sched.grad_aliases.home)


def test_a_node_read_twice_or_through_a_product_keeps_its_own_gradient():
    from rnngraph import Cell
    c = Cell("twice")
    x, h = c.input("x", 4), c.state("h", 4)
    a = c.linear(x, "W", 4)
    s = a + c.linear(h, "U", 4)
    c.output(c.bind(h, c.tanh(s) * a, name="h"))        # a read twice: by the add and by the product
    sched = build_schedule(c.build())
    al = sched.grad_aliases
    lin_x = sched.pre[0].nodes[0]
    assert lin_x not in al.home
    assert all(KERNEL[c.build().op(m).kind][1][k] == "{g}" for m, k in al.skips)


def test_a_sharing_workspace_carves_one_buffer_a_class():
    sched = lstm_sched()
    T, B, H = 5, 3, 8
    shared, apart = (Workspace(sched, be, T, B, np.float64) for be in (get_backend("cpu"), get_backend("numpy")))
    pre, loop = sched.pre[0], sched.loop[0][0]
    assert np.shares_memory(shared.cat[loop][1], shared.cat[pre][1])
    for n in ("add2", "add4", "add17", "linear3"):
        assert np.shares_memory(shared.grads[n], shared.grads["linear1"]) and \
            shared.grads[n].shape == shared.grads["linear1"].shape
        assert not np.shares_memory(apart.grads[n], apart.grads["linear1"])
    # not carved: 12 adds of the gates, c's two products, h's four products (columns of x's): 18 H a row
    saved, page = apart.grad_arena.size - shared.grad_arena.size, 4096 // 8
    assert 18 * H * (1 + T) * B <= saved <= 18 * H * (1 + T) * B + 19 * page
    # what the store limit counts (Executor._store_cost) leaves them out too
    assert stored_bytes(sched, T, B, np.float64) - stored_bytes(sched, T, B, np.float64, sched.grad_aliases) == \
        18 * H * (1 + T) * B * 8
    assert shared.val_arena.size == apart.val_arena.size


def test_a_fused_backward_stores_a_class_once_and_one_that_only_hands_on_stores_nothing():
    from rnngraph.run.backends.cpu.fused import group_spec
    sched = lstm_sched()
    c, a = sched.cell, sched.grad_aliases
    gates = next(it for st in sched.loop for it in st if isinstance(it, Fused))
    spec = group_spec(c, gates.nodes, "bwd", a)
    # each gate's class once, as its root's gradient, and c@t-1's (f ⊙ c@t-1)
    assert spec.outputs == (*(("grad", f"add{17 + k}") for k in range(4)), ("gext", ("c", 1, None)))
    assert {f"add{2 + 4 * k}" for k in range(4)} <= set(gates.nodes)     # + b_ii in the group: add17's gradient
    plain = group_spec(c, gates.nodes, "bwd").outputs
    assert len(plain) == 17      # apart: add2's and add4's (the bias sums'), linear1's and linear3's a gate, c@t-1's


def sharing_numpy(monkeypatch):
    monkeypatch.setattr(NumpyBackend, "alias_grads", True)


def run(layer, x, lengths, seed=5):
    rng = np.random.default_rng(seed)
    y, fin = layer(x, None, lengths)
    fins = fin if isinstance(fin, tuple) else (fin,)
    gfin = tuple(rng.standard_normal(f.shape).astype(f.dtype) for f in fins)
    gx, g0, grads = layer.backward(rng.standard_normal(y.shape).astype(y.dtype), gfin if len(gfin) > 1 else gfin[0])
    return [np.asarray(v, np.float64) for v in (y, *fins, gx, *(g0 if isinstance(g0, tuple) else (g0,)),
                                                 *(grads[n] for n in sorted(grads)))]


def agree(cell, monkeypatch, dtype="float64", tol=1e-12, loop="auto", H=5, share=sharing_numpy, **layers):
    """The numpy backend sharing gradients (or as `share` sets it) against the numpy backend keeping them apart,
    same parameters."""
    kw = {"num_layers": 2, "bidirectional": True, "dtype": dtype, "seed": 2, "loop": loop, **layers}
    x = np.random.default_rng(3).standard_normal((9, 4, 3)).astype(dtype)
    lengths = np.array([9, 5, 1, 7])
    ref = run(Recurrent(cell, 3, H, backend="numpy", **kw), x, lengths)
    share(monkeypatch)
    layer = Recurrent(cell, 3, H, backend="numpy", **kw)
    out = run(layer, x, lengths)
    ws = layer._stack.runs[0][0].ex.ws
    for a, b in zip(out, ref, strict=True):
        scale = max(float(np.abs(b).max(initial=0)), 1e-300)
        assert float(np.abs(a - b).max(initial=0)) <= tol * scale
    return ws


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_the_rule_table_path_sharing_gradients_equals_it_apart(cell, monkeypatch):
    ws = agree(cell, monkeypatch)
    assert ws.aliases.home


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_a_backend_keeping_gradients_apart_copies_a_sum_equal_to_an_earlier_one(cell, monkeypatch):
    """twin_sums without alias_grads (the cupy backend's way): the gradient buffers stay apart, only a vector
    parameter's sum that equals an earlier one's is a copy of it; an LSTM sums 4 of its 8 biases."""
    import rnngraph.run.handlers as handlers
    sums, summed = [], handlers.run_param_grad

    def copying(mp):
        mp.setattr(NumpyBackend, "twin_sums", True)
        mp.setattr(handlers, "run_param_grad", lambda *a: (sums.append(a[2]), summed(*a)))
    ws = agree(cell, monkeypatch, share=copying)
    assert not ws.aliases.home and not ws.aliases.windows
    if cell == "lstm":
        assert {frozenset((s.param, t.param)) for s, t in ws.aliases.twins.items()} == \
            {frozenset((f"b_i{g}", f"b_h{g}")) for g in GATES}
        for k in range(4):      # one of a gate's two bias sums runs, in each of 2 layers x 2 directions
            assert sums.count(f"add{2 + 4 * k}") + sums.count(f"add{4 + 4 * k}") == 4
        assert len(sums) == 16


@pytest.mark.parametrize("cell", ["lstm", "mgu", "gru", "slstm"])
def test_the_rule_table_path_in_half_precision_sums_a_shared_buffer_once(cell, monkeypatch):
    agree(cell, monkeypatch, dtype="float16", tol=0.0)


@pytest.mark.parametrize("seed", range(0, 40, 3))
@pytest.mark.parametrize("loop", ["stages", "elementwise"])
def test_random_linear_forms_sharing_gradients_equal_them_apart(seed, loop, monkeypatch):
    """Adds with the bias first or last, a subtraction's two operands, slices of one shared projection."""
    agree(random_cell(seed)[0], monkeypatch, loop=loop, H=4, num_layers=1, bidirectional=False)


@pytest.mark.parametrize("seed", range(1, 40, 8))
def test_random_linear_forms_on_the_compiled_backend_equal_numpy(seed):
    """The compiled spec path (one store a class, the hand-ons skipped) on the same odd forms."""
    pytest.importorskip("numba")
    cell = random_cell(seed)[0]
    kw = {"dtype": "float64", "seed": 2, "loop": "stages"}
    x, lengths = np.random.default_rng(3).standard_normal((9, 4, 3)), np.array([9, 5, 1, 7])
    ref = run(Recurrent(cell, 3, 4, backend="numpy", **kw), x, lengths)
    layer = Recurrent(cell, 3, 4, backend="cpu", **kw)
    out = run(layer, x, lengths)
    assert layer._stack.runs[0][0].ex.ws.aliases.home
    for a, b in zip(out, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * float(np.abs(b).max(initial=1)))


def test_the_gate_gradients_a_compiled_loop_stores_whole_are_not_zeroed():
    """The x-products' gradient [P+T, B, 4H] holds the four gate classes, each stored with '=' by the loop's fused
    backward (no gradient arrives at a gate's sum from outside it): zero_grads skips the whole block."""
    pytest.importorskip("numba")
    layer = Recurrent("lstm", 3, 5, backend="cpu", dtype="float64", seed=2)
    run(layer, np.random.default_rng(3).standard_normal((6, 4, 3)), None)
    ws = layer._stack.runs[0][0].ex.ws
    g = ws.cat[next(it for it in ws.cat if it not in ws.aliases.windows)][1]       # x · [W_ii; W_if; W_ig; W_io]ᵀ
    start = (address(g) - address(ws.grad_arena)) // g.itemsize
    assert (start, start + g.size) in ws.memo[UNTOUCHED]


def test_a_gradient_one_write_makes_whole_is_stored_and_never_zeroed():
    """An MGU's f (read by the candidate's group and its own), f ⊙ h (read by one GEMM) and x (likewise): each
    gradient has one write, stored ('=', a GEMM's beta 0), so zero_grads skips them; NaN there changes nothing."""
    pytest.importorskip("numba")
    from rnngraph.run.backends.cpu.fused import group_spec
    sched = build_schedule(load_cell("mgu", 3, 5))
    a = sched.grad_aliases
    assert a.assigned == {"f", "mul7", "x"}
    candidate = next(it for st in sched.loop for it in st if isinstance(it, Fused) and "n" in it.nodes)
    spec = group_spec(sched.cell, candidate.nodes, "bwd", a)
    (f_store,) = [op for (kind, key), (_, _, op) in zip(spec.outputs, spec.stores) if kind == "gext" and key[0] == "f"]
    assert f_store == "="
    kw = {"dtype": "float64", "seed": 2}
    ref, layer = Recurrent("mgu", 3, 5, backend="numpy", **kw), Recurrent("mgu", 3, 5, backend="cpu", **kw)
    x = np.random.default_rng(3).standard_normal((6, 4, 3))
    run(layer, x, None)
    ws = layer._stack.runs[0][0].ex.ws
    spans = ws.memo[UNTOUCHED]
    for n in ("f", "mul7", "x"):
        start = (address(ws.grads[n]) - address(ws.grad_arena)) // 8
        assert (start, start + ws.grads[n].size) in spans
    for lo, hi in spans:
        ws.grad_arena[lo:hi] = np.nan
    for p, q in zip(run(layer, x, None, seed=6), run(ref, x, None, seed=6), strict=True):
        np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-12 * float(np.abs(q).max(initial=1)))
