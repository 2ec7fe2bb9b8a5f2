"""What a fused group's forward stores (plan.backward.kept_values): outputs, states, values read outside the
group or at a delay, and values a gradient reads by the kernel rules' templates, which must name every value
the numpy gradient rules (ir/ops.py VJP, the spec) read too."""
import dis

from rnngraph.ir.loading import load_cell
from rnngraph.ir.ops import KERNEL, VJP
from rnngraph.plan.backward import kept_values
from rnngraph.plan.items import Fused
from rnngraph.plan.schedule import build_schedule


def used(fn) -> set:
    """The arguments a gradient rule (lambda xp, add, g, *operands, y, attrs) reads."""
    return {i.argval for i in dis.get_instructions(fn) if i.opname.startswith("LOAD_FAST")}


def test_the_kernel_templates_read_what_the_numpy_rules_read():
    for kind, (_, grads) in KERNEL.items():
        rules = VJP[kind]
        for slot, template in enumerate(grads):
            fn = rules[slot]
            names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
            operands = names[3:-2]              # after xp, add, g; before y, attrs
            read = used(fn)
            want = {f"{{{k}}}" for k, nm in enumerate(operands) if nm in read} | ({"{y}"} if "y" in read else set())
            assert all(w in template for w in want), (kind, slot, want, template)


def test_an_lstm_loop_group_stores_its_gates_cell_and_output_only():
    cell = load_cell("lstm", 4, 8)
    loop = [it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused)]
    (group,) = loop
    assert kept_values(cell, group.nodes) == {"i", "f", "g", "o", "c", "tanh24", "h"}


def test_what_a_user_cells_group_keeps():
    """s feeds only tanh (whose gradient reads its own value), p feeds only an add: both live in the pass; t is
    read by its gradient and by p's (a product), q by a linear outside the group."""
    from rnngraph import Cell
    c = Cell("keep")
    x, h = c.input("x", 3), c.state("h", 3)
    s = c.add(x, h.ago(1), name="s")
    t = c.tanh(s, name="t")
    p = c.mul(t, x, name="p")
    q = c.add(p, x, name="q")
    c.output(c.bind(h, c.tanh(c.linear(q, "W", 3), name="hn"), name="h"))
    assert kept_values(c.build(), ["s", "t", "p", "q"]) == {"t", "q"}


def test_a_group_stores_the_gradients_of_members_reading_a_parameter():
    """Their sums over frames are the parameters' gradients (ParamSum); the others are spent in the pass."""
    from rnngraph.plan.backward import kept_grads
    cell = load_cell("lstm", 4, 8)
    (group,) = [it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused)]
    kept = kept_grads(cell, group.nodes)
    assert kept == {n for n in group.nodes if any(u in cell.params for u, _ in cell.reads(n))} and len(kept) == 4


def test_only_states_outputs_and_members_read_elsewhere_get_arriving_gradients():
    """In an LSTM's loop group only h (the caller's output gradient, the recurrent GEMM's) and c (the next frame's)
    receive a gradient from outside the pass; in the user cell above, q's comes from the linear reading it."""
    from rnngraph import Cell
    from rnngraph.plan.backward import arriving
    cell = load_cell("lstm", 4, 8)
    (group,) = [it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused)]
    assert arriving(cell, group.nodes) == {"c", "h"}
    c = Cell("arrive")
    x, h = c.input("x", 3), c.state("h", 3)
    s = c.add(x, h.ago(1), name="s")
    q = c.add(c.tanh(s, name="t"), x, name="q")
    c.output(c.bind(h, c.tanh(c.linear(q, "W", 3), name="hn"), name="h"))
    assert arriving(c.build(), ["s", "t", "q"]) == {"q"}


def test_a_backward_spec_stores_kept_gradients_and_reads_only_what_arrives():
    """stored_only: the LSTM group's backward stores the 4 gradients its bias sums read (and its operands'), loads
    the arriving sums of c and h only, and reads only the values its templates name (the kept ones)."""
    from rnngraph.run.backends.cuda.fused import fused_backward_kernel, fused_forward_kernel, stored_only
    cell = load_cell("lstm", 4, 8)
    (group,) = [it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused)]
    nodes = group.nodes
    spec = stored_only(cell, nodes, "bwd", fused_backward_kernel(cell, nodes, set(cell.params)))
    stored = {n for kind, n in spec.outputs if kind == "grad"}
    assert stored == {"add4", "add8", "add12", "add16"}
    assert {dict(zip(spec.in_names + spec.out_names, spec.inputs + spec.outputs))[nm][1]
            for nm in spec.arrivals() + [n for n in spec.read_inputs() if n.startswith("gm")]} == {"c", "h"}
    values = {key for nm, (kind, key) in zip(spec.in_names, spec.inputs) if kind == "val" and nm in spec.read_inputs()}
    assert values <= kept_values(cell, nodes)
    assert "T d4 = 0;" in spec.body and "T d14 = gm14;" in spec.body
    fwd = stored_only(cell, nodes, "fwd", fused_forward_kernel(cell, nodes))
    assert {n for _, n in fwd.outputs} == kept_values(cell, nodes)
