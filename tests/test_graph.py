"""The cell builder, the graph listing, and one test per validation error."""
import re
import warnings

import pytest

from rnngraph import Cell, OpKind, RnnGraphError, RnnGraphWarning, build_schedule


def small_rnn(name="tiny", delay=1):
    """h = tanh(W·x + b + U·h[t-delay]); x: [3], h: [4]."""
    c = Cell(name)
    x, h = c.input("x", 3), c.state("h", 4)
    pre = c.linear(x, "W", 4, bias="b") + c.linear(h.ago(delay), "U", 4)
    c.output(c.bind(h, c.tanh(pre), name="h"))
    return c.build()


# -- builder ----------------------------------------------------------------------------------

def test_builder_records_inputs_states_outputs_params():
    cell = small_rnn()
    assert cell.inputs == {"x": 3}
    assert cell.states == {"h": ("h", 4)}
    assert cell.outputs == ("h",)
    assert cell.params == {"W": (4, 3), "b": (4,), "U": (4, 4)}
    assert cell.op("h").kind is OpKind.TANH and cell.op("h").size == 4


def test_edges_carry_slot_and_delay():
    cell = small_rnn()
    (lin_h,) = [n for n in cell.graph if cell.op(n).kind is OpKind.LINEAR and cell.reads(n)[0][0] == "h"]
    assert cell.reads(lin_h) == [("h", 1), ("U", 0)]      # slot order: operand, weight
    delayed = [(u, v, d) for u, v, d in cell.graph.edges(data="delay") if d]
    assert delayed == [("h", lin_h, 1)]


def test_operators_map_to_ops():
    c = Cell("ops")
    x = c.input("x", 2)
    y = c.tanh(x)
    made = {"add": y + y, "sub": y - y, "mul": y * y, "scale": 2.0 * y, "neg": -y,
            "one_minus": 1 - y, "div": y / 4}
    c.output(y)
    cell = c.build()
    op = {k: cell.op(v.name) for k, v in made.items()}
    assert [op[k].kind for k in ("add", "sub", "mul", "one_minus")] == \
        [OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.ONE_MINUS]
    assert (op["scale"].kind, op["scale"].attrs) == (OpKind.SCALE, (2.0,))
    assert op["neg"].attrs == (-1.0,) and op["div"].attrs == (0.25,)


def test_concat_slice_split_shapes():
    c = Cell("shapes")
    x = c.input("x", 6)
    a, b, d = c.split(x, 3)
    assert (a.size, b.size, d.size) == (2, 2, 2)
    assert c.concat(a, b, d).size == 6
    assert c.slice(x, 1, 5).size == 4
    assert c.linear(x, "W", 5).size == 5


def test_pretty_print_one_line_per_node():
    cell = small_rnn()
    lines = str(cell).splitlines()
    assert lines[0] == "cell tiny(x[3]) -> h   states: h[4] <- h"
    rows = {re.split(r"\s+", line.strip())[0]: line for line in lines[1:]}
    assert set(rows) == set(cell.graph)                     # every node, parameters included
    assert re.fullmatch(r"\s+U\s+param\s+\[4, 4\]", rows["U"])
    (lin_h,) = [n for n in rows if rows[n].split()[1:3] == ["linear", "h@t-1,"]]
    assert re.fullmatch(rf"\s+{lin_h}\s+linear\s+h@t-1, U\s+\[4\]", rows[lin_h])
    assert re.fullmatch(r"\s+h\s+tanh\s+add\d+\s+\[4\]", rows["h"])


def test_delay_greater_than_one():
    cell = small_rnn(delay=2)
    (lin_h,) = [n for n in cell.graph if cell.op(n).kind is OpKind.LINEAR and cell.reads(n)[0][0] == "h"]
    assert cell.reads(lin_h)[0] == ("h", 2)
    assert "h@t-2, U" in str(cell)
    s = build_schedule(cell)
    assert lin_h in s.summary()["per_frame_stages"][0]
    assert s.summary()["merged_gemms"][1]["operand"] == "h@t-2"


def test_state_read_with_several_delays():
    c = Cell("fir")
    x, h = c.input("x", 2), c.state("h", 2)
    c.output(c.bind(h, c.tanh(x + h + h.ago(3)), name="h"))
    cell = c.build()
    assert sorted(d for _, _, d in cell.graph.edges(data="delay") if d) == [1, 3]


# -- validation: one test per error -----------------------------------------------------------

def test_algebraic_loop():
    c = Cell("loop")
    x, s = c.input("x", 4), c.state("s", 4)
    a = c.tanh(x + s.ago(0), name="a")          # reads s in the same frame ...
    c.bind(s, a * 2.0, name="s")                # ... and s is computed from a: a delay-0 cycle
    c.output("s")
    with pytest.raises(RnnGraphError, match=r"algebraic loop in cell 'loop': (\w+ -> )+\w+ has total delay 0") as e:
        c.build()
    cycle = str(e.value).split(": ")[1].split(" has")[0].split(" -> ")
    assert {"a", "s"} <= set(cycle) and cycle[0] == cycle[-1]
    assert "state with delay ≥ 1" in str(e.value)             # says how to fix it


def test_shape_mismatch_names_both_shapes_and_the_op():
    c = Cell("bad")
    x = c.input("x", 4)
    y = c.linear(x, "W", 8, name="y")
    with pytest.raises(RnnGraphError, match="shape mismatch") as e:
        c.add(x, y, name="z")
    msg = str(e.value)
    assert "add op 'z'" in msg and "x[4]" in msg and "y[8]" in msg and "4 vs 8" in msg


def test_linear_shape_mismatch_names_the_weight_shape():
    c = Cell("bad")
    x = c.input("x", 4)
    c.param("W", (8, 3))
    with pytest.raises(RnnGraphError, match=r"linear op 'l'.*x\[4\].*W\[8, 3\]"):
        c.apply("linear", x, "W", name="l")


def test_sizes_are_positive_integers_numpy_integers_included():
    import numpy as np
    c = Cell("sizes")
    x, h = c.input("x", np.int64(3)), c.state("h", np.int32(4))
    c.output(c.bind(h, c.tanh(c.linear(x, "W", np.int16(4)) + c.slice(c.linear(h, "U", 8), 2, np.int64(6)))))
    cell = c.build()
    assert cell.inputs == {"x": 3} and cell.params == {"W": (4, 3), "U": (8, 4)}
    assert all(type(n) is int for n in [*cell.inputs.values(), *cell.params["W"]])
    for size in (0, -2, 2.5, 4.0, True, "4", None):       # the catalogue test has the messages
        with pytest.raises(RnnGraphError, match="must be a positive integer"):
            Cell("bad").input("x", size)
    with pytest.raises(RnnGraphError, match="parts of split in cell 'bad' must be a positive integer, got 0"):
        c = Cell("bad")
        c.split(c.input("x", 4), 0)


def test_unbound_state():
    c = Cell("unbound")
    x, h = c.input("x", 4), c.state("h", 4)
    c.output(c.tanh(x + h, name="y"))
    with pytest.raises(RnnGraphError, match=r"state 'h' of cell 'unbound' is read by \['add\d+'\] but never "
                                            r"bound to a producer; add cell.bind\(h, <its new value>\)"):
        c.build()


def test_output_not_reachable_from_inputs():
    c = Cell("unreachable")
    x, h = c.input("x", 4), c.state("h", 4)
    c.tanh(c.linear(x, "W", 4))                 # x is read, but not on the output's path
    c.output(c.bind(h, c.tanh(c.linear(h, "U", 4)), name="h"))
    with pytest.raises(RnnGraphError, match="output 'h' of cell 'unreachable' is not reachable from any input"):
        c.build()


def test_unknown_op():
    c = Cell("unknown")
    x = c.input("x", 4)
    with pytest.raises(RnnGraphError, match="unknown op 'foo'; known ops: .*tanh"):
        c.apply("foo", x)


def test_duplicate_node_name():
    c = Cell("dup")
    x = c.input("x", 4)
    c.tanh(x, name="a")
    with pytest.raises(RnnGraphError, match="duplicate node name 'a' in cell 'dup'"):
        c.sigmoid(x, name="a")


def test_unused_input_warns():
    c = Cell("unused")
    x, _ = c.input("x", 4), c.input("spare", 2)
    c.output(c.tanh(x))
    with pytest.warns(RnnGraphWarning, match="input 'spare' of cell 'unused' is never used"):
        c.build()


def test_valid_cell_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small_rnn()


def test_ago_only_on_states_and_nonnegative():
    c = Cell("ago")
    x, h = c.input("x", 4), c.state("h", 4)
    with pytest.raises(RnnGraphError, match="'x' is not a state"):
        x.ago(1)
    with pytest.raises(RnnGraphError, match="integer ≥ 0"):
        h.ago(-1)


def test_handles_stay_valid_after_bind_renames_their_node():
    c = Cell("rename")
    x, m = c.input("x", 4), c.state("m", 4)
    m_new = c.tanh(x + m, name="m_new")
    c.bind(m, m_new, name="m")                  # renames node 'm_new' to 'm'
    y = c.linear(m_new, "P", 4)                 # the old handle still means that node
    assert m_new.size == 4
    c.output(y, name="y")
    cell = c.build()
    assert cell.reads("y")[0] == ("m", 0) and "m_new" not in cell.graph


def test_a_state_bound_to_a_parameter_or_an_input_never_overwrites_it():
    c = Cell("p")
    x, h = c.input("x", 4), c.state("h", 4)
    with pytest.raises(RnnGraphError, match="state 'h' is bound to parameter 'b', which would make it a constant"):
        c.bind(h, c.param("b", (4,)))
    bound = c.bind(h, x)                       # an input: the state gets its own copy (an identity op)
    c.output(c.tanh(bound + h), name="y")
    cell = c.build()
    assert cell.states["h"][0] != "x" and cell.op(cell.states["h"][0]).kind.value == "identity"
