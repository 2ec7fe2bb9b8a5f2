"""Exact schedules of every built-in cell, and properties of the scheduler on random cells."""
from collections import Counter

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rnngraph import CELLS, Cell, OpKind, build_schedule, load_cell
from rnngraph.ir.ops import ELEMENTWISE
from rnngraph.plan.schedule import SINKS, Fused, Gemm, sunk

# cell: (pre items, loop stages, post items, forward kernels/frame, backward kernels/frame).
# An item is ("gemm", n): n linear ops merged into one GEMM, or ("fused", n): n elementwise ops (and row
# reductions) in one kernel. Kernels per frame are (before merging, after merging).
EXPECTED = {
    # a hoisted GEMM's bias joins the loop's fused body (schedule.sunk): no pass of its own over all frames
    "lstm": ([("gemm", 4)], [[("gemm", 4)], [("fused", 21)]], [], (25, 2), (45, 2)),
    # a layer norm is one row group (a block per row: its reductions and its per-feature work together)
    "layernorm_gru": ([("gemm", 1), ("fused", 8), ("fused", 3)],
                      [[("gemm", 1)], [("fused", 8)], [("fused", 14)]], [], (23, 3), (36, 3)),
    "layernorm_lstm": ([("gemm", 1), ("fused", 6)],                   # LN(W_ih·x) hoisted but for its β
                       [[("gemm", 1)], [("fused", 10)], [("fused", 21)]], [], (32, 3), (49, 3)),
    "gru": ([("gemm", 3)], [[("gemm", 3)], [("fused", 17)]], [], (20, 2), (36, 2)),
    "rnn_tanh": ([("gemm", 1)], [[("gemm", 1)], [("fused", 4)]], [], (5, 2), (9, 2)),
    "rnn_relu": ([("gemm", 1)], [[("gemm", 1)], [("fused", 4)]], [], (5, 2), (9, 2)),
    "peephole_lstm": ([("gemm", 4)], [[("gemm", 4)], [("fused", 27)]], [], (31, 2), (57, 2)),
    "cifg_lstm": ([("gemm", 3)], [[("gemm", 3)], [("fused", 18)]], [], (21, 2), (37, 2)),
    "min_gru": ([("gemm", 2), ("fused", 5)], [[("fused", 2)]], [], (2, 1), (4, 1)),
    "min_lstm": ([("gemm", 3), ("fused", 11)], [[("fused", 2)]], [], (2, 1), (4, 1)),
    "qrnn": ([("gemm", 3), ("fused", 8)], [[("fused", 2)]], [("fused", 1)], (2, 1), (4, 1)),
    "mgu": ([("gemm", 2)], [[("gemm", 1)], [("fused", 6)], [("gemm", 1)], [("fused", 5)]], [], (13, 4), (23, 4)),
    "indrnn": ([("gemm", 1)], [[("fused", 4)]], [], (4, 1), (7, 1)),
    "sru": ([("gemm", 4), ("fused", 1)], [[("fused", 8)]], [("fused", 7)], (8, 1), (14, 1)),
    # the head-wise cells: their four recurrent products one batched GEMM a frame (4 heads at H = 16)
    "slstm": ([("gemm", 4)], [[("gemm", 4)], [("fused", 23)]], [], (27, 2), (50, 2)),
    "mh_lstm": ([("gemm", 4)], [[("gemm", 4)], [("fused", 21)]], [], (25, 2), (45, 2)),
}


def shape(item):
    return ("gemm" if isinstance(item, Gemm) else "fused", len(item.nodes))


def test_every_builtin_has_an_expected_schedule():
    assert set(EXPECTED) == set(CELLS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_schedule_exact(name):
    pre, loop, post, fwd, bwd = EXPECTED[name]
    s = build_schedule(load_cell(name, 8, 16))
    assert [shape(it) for it in s.pre] == pre
    assert [[shape(it) for it in stage] for stage in s.loop] == loop
    assert [shape(it) for it in s.post] == post
    k = s.summary()["kernels_per_frame"]
    assert (k["forward"]["before_merge"], k["forward"]["after_merge"]) == fwd
    assert (k["backward"]["before_merge"], k["backward"]["after_merge"]) == bwd


def test_lstm_input_products_hoisted_into_one_gemm():
    s = build_schedule(load_cell("lstm", 8, 16))
    (gemm,) = s.pre
    assert (gemm.operand, gemm.delay) == ("x", 0)                # [T·B, D] × [D, 4H], once
    assert gemm.weights == ("W_ii", "W_if", "W_ig", "W_io") and sum(gemm.sizes) == 4 * 16
    (fused,) = s.loop[1]            # + b_i*: in the gate group, which reads the products (sunk), no pass of its own
    biases = [n for n in fused.nodes if any(p.startswith("b_i") for p, _ in s.cell.reads(n))]
    assert [s.cell.reads(n) for n in biases] == [[(lin, 0), (f"b_i{k}", 0)] for lin, k in zip(gemm.nodes, "ifgo")]
    assert set(biases) == sunk(s.cell, set(biases) | {"h"}, set(fused.nodes) - set(biases))


def test_lstm_recurrent_products_one_gemm_per_frame():
    s = build_schedule(load_cell("lstm", 8, 16))
    (gemm,) = s.loop[0]
    assert (gemm.operand, gemm.delay) == ("h", 1)
    assert gemm.weights == ("W_hi", "W_hf", "W_hg", "W_ho")
    (fused,) = s.loop[1]
    assert {"i", "f", "g", "o", "c", "h"} <= set(fused.nodes) and fused.nodes[-1] == "h"


def test_lstm_backward_reduces_weight_gradients_outside_the_loop():
    s = build_schedule(load_cell("lstm", 8, 16))
    assert s.summary()["param_grad_reductions"] == [
        "dW_hi; dW_hf; dW_hg; dW_ho <- gemm over T",        # dW_hh = Σ_t dgates_tᵀ·h_{t-1}: one GEMM
        "db_hf <- sum over T", "db_hg <- sum over T", "db_hi <- sum over T", "db_ho <- sum over T",
        "db_if <- sum over T", "db_ig <- sum over T", "db_ii <- sum over T", "db_io <- sum over T"]


def test_min_gru_hoists_all_gates():
    s = build_schedule(load_cell("min_gru", 8, 16))
    assert "z" in s.summary()["hoisted"]
    ((fused,),) = s.loop                                          # per frame: (1-z)·h[t-1] + z·h~
    mul, h = fused.nodes
    assert h == "h" and s.cell.op(mul).kind is OpKind.MUL and ("h", 1) in s.cell.reads(mul)


def test_sru_highway_output_runs_after_the_loop():
    s = build_schedule(load_cell("sru", 8, 16)).summary()
    assert "c" in s["per_frame_stages"][0]
    assert {"r", "h"} <= set(s["post_loop"])
    assert s["param_grad_reductions"] == ["db_f <- sum over T", "dv_f <- sum over T"]     # b_f sunk into c's loop


def test_naive_schedule_is_one_kernel_per_op():
    cell = load_cell("lstm", 8, 16)
    s = build_schedule(cell, optimize=False)
    assert s.pre == () and s.post == ()
    assert all(len(stage) == 1 and len(stage[0].nodes) == 1 for stage in s.loop)
    assert len(s.loop) == 29 == s.summary()["ops"]


def test_summary_is_plain_json_data():
    import json
    s = build_schedule(load_cell("gru", 8, 16)).summary()
    assert json.loads(json.dumps(s)) == s


# -- properties on random cells ---------------------------------------------------------------

H = 4
UNARY = ("tanh", "sigmoid", "relu", "one_minus", "identity", "scale")
BINARY = ("add", "sub", "mul")


@st.composite
def recipes(draw):
    """Plain data for a random cell: states, ops reading earlier values or delayed states, bindings."""
    n_states = draw(st.integers(1, 3))
    operand = st.one_of(st.tuples(st.just("value"), st.integers(0, 50)),
                        st.tuples(st.just("state"), st.integers(0, n_states - 1), st.integers(1, 3)))
    kinds = st.sampled_from(UNARY + BINARY + ("linear", "concat_slice"))
    ops = draw(st.lists(st.tuples(kinds, operand, operand), min_size=1, max_size=14))
    binds = draw(st.lists(st.integers(1, 50), min_size=n_states, max_size=n_states))
    out = draw(st.integers(0, 50))
    return n_states, ops, binds, out


def build(recipe):
    """The recipe's cell, through the public builder only; every value has H features."""
    n_states, ops, binds, out = recipe
    c = Cell("random")
    values = [c.input("x", H)]
    states = [c.state(f"s{k}", H) for k in range(n_states)]

    def pick(ref):
        return values[ref[1] % len(values)] if ref[0] == "value" else states[ref[1]].ago(ref[2])

    for k, (kind, a, b) in enumerate(ops):
        a, b = pick(a), pick(b)
        if kind in BINARY:
            v = c.apply(kind, a, b)
        elif kind == "scale":
            v = c.scale(a, 0.5)
        elif kind == "linear":
            v = c.linear(a, f"W{k}", H, bias=f"b{k}" if k % 2 else None)
        elif kind == "concat_slice":
            v = c.slice(c.concat(a, b), (k % 2) * H, (k % 2 + 1) * H)
        else:
            v = c.apply(kind, a)
        values.append(v)
    for k, ref in enumerate(binds):
        c.bind(states[k], values[1 + ref % (len(values) - 1)])
    c.output(c.add(values[out % len(values)], values[0]), name="y")
    return c.build()


def positions(s):
    """node -> (section, stage, item, index in item): the order in which a staged run computes it."""
    pos = {}
    sections = [[s.pre], list(s.loop), [s.post]]
    for rank, stages in enumerate(sections):
        for k, stage in enumerate(stages):
            for j, it in enumerate(stage):
                for i, n in enumerate(it.nodes):
                    pos[n] = (rank, k, j, i)
    return pos


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes())
def test_random_cells_schedule_soundly(recipe):
    cell = build(recipe)
    g = cell.graph
    s = build_schedule(cell)
    compute = {n for n in g if cell.op(n).kind not in (OpKind.INPUT, OpKind.PARAM)}

    # every op is scheduled exactly once
    counts = Counter(n for it in s.items for n in it.nodes)
    assert set(counts) == compute and set(counts.values()) == {1}

    # every same-frame dependency is respected; items of one stage are independent
    pos = positions(s)
    owner = {n: it for it in s.items for n in it.nodes}
    for u, v, d in g.edges(data="delay"):
        if d or u not in compute:
            continue
        assert pos[u] < pos[v], (u, v)
        if pos[u][0] == pos[v][0] == 1 and pos[u][1] == pos[v][1]:
            assert owner[u] is owner[v], f"{u} -> {v} inside stage {pos[u][1]}"
        if owner[u] is owner[v]:
            assert isinstance(owner[u], Fused), f"{u} -> {v} inside one GEMM"

    # nothing that depends on a delayed value is hoisted; everything not hoisted does, but for an add, sub or mul
    # of one frame value and parameters whose every reader is in the loop at delay 0 (sunk)
    hoisted = {n for it in s.pre for n in it.nodes}
    delayed = {v for _, v, d in g.edges(data="delay") if d}
    dependent = delayed.union(*(nx.descendants(g, v) for v in delayed))
    loop = {n for stage in s.loop for it in stage for n in it.nodes}
    assert not hoisted & dependent
    for n in compute - hoisted - dependent:
        reads = [cell.op(u).kind for u, _ in cell.reads(n)]
        assert cell.op(n).kind in SINKS and sum(k is not OpKind.PARAM for k in reads) == 1 and n not in cell.outputs
        assert all(v in loop and d == 0 for _, v, d in g.out_edges(n, data="delay")), n

    # post-loop work feeds nothing back into the loop
    post = {n for it in s.post for n in it.nodes}
    assert not any(v in loop for u in post for v in g.successors(u))

    # items are well formed: a GEMM reads one operand at one delay; a fused group is elementwise
    for it in s.items:
        if isinstance(it, Gemm):
            assert all(cell.reads(n)[0] == (it.operand, it.delay) for n in it.nodes)
            assert it.weights == tuple(cell.reads(n)[1][0] for n in it.nodes)
        else:
            assert all(cell.op(n).kind in ELEMENTWISE for n in it.nodes) or \
                [cell.op(n).kind for n in it.nodes] == [OpKind.CONCAT]
