"""The planner's class of each recurrent state, read off the graph (issue 12's analysis; only 'stages' runs yet)."""
import json

import numpy as np
import pytest

from rnngraph import CELLS, Cell, build_schedule, load_cell
from rnngraph.lab.cli import main
from rnngraph.nn import Recurrent

# cell: ({state: class}, admitted strategies best first)
EXPECTED = {
    "lstm": ({"h": "general", "c": "general"}, ("persistent", "stages")),
    "layernorm_lstm": ({"h": "general", "c": "general"}, ("stages",)),    # persistent: a row reduction in the loop
    "layernorm_gru": ({"h": "general"}, ("stages",)),
    "gru": ({"h": "general"}, ("persistent", "stages")),
    "rnn_tanh": ({"h": "general"}, ("persistent", "stages")),
    "rnn_relu": ({"h": "general"}, ("persistent", "stages")),
    "peephole_lstm": ({"h": "general", "c": "general"}, ("persistent", "stages")),
    "cifg_lstm": ({"h": "general", "c": "general"}, ("persistent", "stages")),
    "min_gru": ({"h": "linear_diagonal"}, ("scan", "elementwise", "stages")),
    "mgu": ({"h": "general"}, ("persistent", "stages")),
    "min_lstm": ({"h": "linear_diagonal"}, ("scan", "elementwise", "stages")),
    "qrnn": ({"c": "linear_diagonal"}, ("scan", "elementwise", "stages")),
    "indrnn": ({"h": "elementwise"}, ("elementwise", "stages")),
    "sru": ({"c": "elementwise"}, ("elementwise", "stages")),
    "slstm": ({"h": "general", "c": "general", "n": "general", "m": "general"}, ("persistent", "stages")),
    "mh_lstm": ({"h": "general", "c": "general"}, ("persistent", "stages")),
}


def classes(cell) -> dict:
    return {s: c.kind for s, c in build_schedule(cell).state_classes.items()}


def test_every_builtin_has_expected_classes():
    assert set(EXPECTED) == set(CELLS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_classes(name):
    sched = build_schedule(load_cell(name, 5, 8))
    assert classes(sched.cell) == EXPECTED[name][0]
    assert sched.loop_strategies == EXPECTED[name][1]
    assert sched.loop_strategy == EXPECTED[name][1][0]        # auto: the best one admitted
    numpy = [s for s in EXPECTED[name][1] if s != "persistent"][0]      # numpy runs 'persistent' as 'stages'
    assert Recurrent(name, 5, 8).loop_strategy == numpy


def one_state(update, delay=1, D=3, H=4):
    """A cell whose state h is update(c, h read `delay` frames back, a, b) with a, b from x only."""
    c = Cell("form")
    x, h = c.input("x", D), c.state("h", H)
    a = c.sigmoid(c.linear(x, "W_a", H), name="a")
    b = c.tanh(c.linear(x, "W_b", H), name="b")
    c.output(c.bind(h, update(c, h.ago(delay), a, b), name="h"))
    return c.build()


LINEAR_FORMS = {
    "a*h + b": lambda c, h, a, b: a * h + b,
    "h*a + b": lambda c, h, a, b: h * a + b,
    "b + a*h": lambda c, h, a, b: b + a * h,
    "b + h*a": lambda c, h, a, b: b + h * a,
    "(1-a)*h + a*b": lambda c, h, a, b: (1 - a) * h + a * b,
    "a*h + a*b": lambda c, h, a, b: a * h + a * b,             # a's gradient: from the scan and from a*b
    "parameter decay": lambda c, h, a, b: c.diag(h, "w") + b,
}


@pytest.mark.parametrize("form", LINEAR_FORMS)
@pytest.mark.parametrize("delay", [1, 2])
def test_linear_diagonal_forms_are_recognised_on_the_graph(form, delay):
    cell = one_state(LINEAR_FORMS[form], delay)
    c = build_schedule(cell).state_classes["h"]
    assert (c.kind, c.delay) == ("linear_diagonal", delay)
    assert cell.op(c.a).kind.value in ("sigmoid", "one_minus", "param") and c.b in cell.graph


def test_the_scan_writes_the_gradients_only_it_sends():
    """plan.loops.scan.sole_gradient: the backward scan writes (not adds) the gradient of a coefficient read by its
    product alone and of an offset read by the sum alone; a coefficient another op reads, or the cell's output, it
    adds to."""
    from rnngraph.plan.loops.scan import sole_gradient
    sends = {}
    for form in ("a*h + b", "(1-a)*h + a*b", "a*h + a*b"):
        cell = one_state(LINEAR_FORMS[form], 1)
        c = build_schedule(cell).state_classes["h"]
        sends[form] = (sole_gradient(cell, c.a, c.m), sole_gradient(cell, c.b, "h"))
    assert sends == {"a*h + b": (True, True), "(1-a)*h + a*b": (True, True), "a*h + a*b": (False, True)}
    c = Cell("out")
    x, h = c.input("x", 3), c.state("h", 3)
    a = c.sigmoid(c.linear(x, "W", 3), name="a")
    m = c.mul(a, h.ago(1), name="m")
    c.output(c.bind(h, m + x, name="h"))
    c.output(a)
    cell = c.build()
    assert not sole_gradient(cell, "a", "m")


NOT_LINEAR = {   # each looks close, but a or b depends on the state, or the update is not a ⊙ s + b
    "a from the state": (lambda c, h, a, b: c.sigmoid(c.diag(h, "u")) * h + b, "elementwise"),
    "b from the state": (lambda c, h, a, b: a * h + c.tanh(h), "elementwise"),
    "h*h + b": (lambda c, h, a, b: h * h + b, "elementwise"),
    "squashed": (lambda c, h, a, b: c.tanh(a * h + b), "elementwise"),
    "a through W·h": (lambda c, h, a, b: c.sigmoid(c.linear(h, "U", 4)) * h + b, "general"),
}


@pytest.mark.parametrize("form", NOT_LINEAR)
def test_cells_that_look_linear_but_are_not(form):
    update, kind = NOT_LINEAR[form]
    assert classes(one_state(update)) == {"h": kind}


def test_schedule_prints_and_dumps_the_classes(capsys):
    assert main(["schedule", "min_gru", "--input-size", "4", "--hidden-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "    state h: linear_diagonal (h = one_minus" in out
    assert "    strategies this loop admits, best first: scan, elementwise, stages" in out
    assert main(["schedule", "sru", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["loop_strategies"] == ["elementwise", "stages"] and d["loop_strategy"] == "elementwise"
    assert d["state_classes"]["c"]["class"] == "elementwise"


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def test_min_lstm_and_qrnn_compute_their_papers_equations():
    """Against the equations written directly (minLSTM's f' = f / (f + i) as a division)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 2, 3)) * 3
    for name in ("min_lstm", "qrnn"):
        layer = Recurrent(name, 3, 4, dtype="float64", init="orthogonal", seed=1)
        for p in layer.parameters().values():
            p[...] = rng.standard_normal(p.shape)
        y, _ = layer(x)
        P = layer.parameters()
        W, b = P["weight_ih_l0"].reshape(3, 4, 3), P["bias_ih_l0"].reshape(3, 4)
        u = np.einsum("tbd,khd->ktbh", x, W) + b[:, None, None, :]        # [3 gates, T, B, H]
        s, want = np.zeros((2, 4)), []
        for t in range(6):
            if name == "min_lstm":
                f, i = sigmoid(u[0, t]), sigmoid(u[1, t])
                s = f / (f + i) * s + i / (f + i) * u[2, t]
                want.append(s)
            else:
                z, f, o = np.tanh(u[0, t]), sigmoid(u[1, t]), sigmoid(u[2, t])
                s = f * s + (1 - f) * z
                want.append(o * s)
        assert np.allclose(y, np.array(want), rtol=1e-12, atol=1e-13), name
