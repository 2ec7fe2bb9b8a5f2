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


def test_a_pairs_products_are_stored_only_where_a_gradient_reads_them():
    """Given with the group that reads them (a persistent kernel's pair), an LSTM's four products feed only adds,
    so none is stored (elements.stored_sums); a product a mul reads is (the mul's gradient reads its operand)."""
    from rnngraph import Cell
    from rnngraph.run.backends.cuda.persistent.elements import stored_sums
    from rnngraph.run.backends.cuda.persistent.phases import phases
    cell = load_cell("lstm", 4, 8)
    (pair,) = [p for g in phases(cell, build_schedule(cell, loop="persistent").forward[1].items[0]) for p in g
               if p.kind == "pair"]
    assert len(pair.item.gemm.nodes) == 4 and stored_sums(cell, pair) == set()
    c = Cell("gated")
    x, h = c.input("x", 3), c.state("h", 3)
    a, b = c.linear(h, "U", 3, name="a"), c.linear(h, "V", 3, name="b")
    c.output(c.bind(h, c.tanh(c.linear(x, "W", 3) + a * c.sigmoid(b), name="hn"), name="h"))
    cell = c.build()
    (pair,) = [p for g in phases(cell, build_schedule(cell, loop="persistent").forward[1].items[0]) for p in g
               if p.kind == "pair"]
    assert set(pair.item.gemm.nodes) == {"a", "b"} and stored_sums(cell, pair) == {"a"}


def test_a_group_stores_the_gradients_of_members_reading_a_parameter():
    """Their sums over frames are the parameters' gradients (ParamSum); the others are spent in the pass."""
    from rnngraph.plan.backward import kept_grads
    cell = load_cell("lstm", 4, 8)
    (group,) = [it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused)]
    kept = kept_grads(cell, group.nodes)
    assert kept == {n for n in group.nodes if any(u in cell.params for u, _ in cell.reads(n))} and len(kept) == 8


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
    """stored_only: the LSTM group's backward stores the 8 gradients its bias sums read (and its operands'), loads
    the arriving sums of c and h only, and reads only the values its templates name (the kept ones)."""
    from rnngraph.run.backends.cuda.fused import fused_backward_kernel, fused_forward_kernel, stored_only
    cell = load_cell("lstm", 4, 8)
    (group,) = [it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused)]
    nodes = group.nodes
    spec = stored_only(cell, nodes, "bwd", fused_backward_kernel(cell, nodes, set(cell.params)))
    stored = {n for kind, n in spec.outputs if kind == "grad"}
    assert stored == {f"add{2 * k}" for k in range(1, 9)}       # both biases of each gate
    assert {dict(zip(spec.in_names + spec.out_names, spec.inputs + spec.outputs))[nm][1]
            for nm in spec.arrivals() + [n for n in spec.read_inputs() if n.startswith("gm")]} == {"c", "h"}
    values = {key for nm, (kind, key) in zip(spec.in_names, spec.inputs) if kind == "val" and nm in spec.read_inputs()}
    assert values <= kept_values(cell, nodes)
    assert "T d8 = 0;" in spec.body and "T d18 = gm18;" in spec.body      # add17: none arrives; c: its own
    fwd = stored_only(cell, nodes, "fwd", fused_forward_kernel(cell, nodes))
    assert {n for _, n in fwd.outputs} == kept_values(cell, nodes)


def test_the_gpu_runs_every_elementwise_group_storing_only_what_is_read():
    """rows.group_kernel: minGRU's gate group over all frames stores z, h̃, 1 − z and z ⊙ h̃ (not the gate sum,
    which only its sigmoid reads); its backward stores the two bias gradients and the linears' and loads only what the
    scan sends (1 − z's and z ⊙ h̃'s); a row group and the atomic backward are as before."""
    from rnngraph.run.backends.cuda.fused import fused_backward_kernel, fused_forward_kernel
    from rnngraph.run.backends.cuda.rows import group_kernel, row_backward_kernel, row_forward_kernel, row_group
    cell = load_cell("min_gru", 4, 8)
    (group,) = [it for it in build_schedule(cell, loop="scan").pre if isinstance(it, Fused)]
    fwd = group_kernel(cell, group.nodes, "fwd")
    assert {n for _, n in fwd.outputs} == kept_values(cell, group.nodes) == set(group.nodes) - {"add2"}
    assert len(fused_forward_kernel(cell, group.nodes).outputs) == len(group.nodes)
    bwd = group_kernel(cell, group.nodes, "bwd")
    assert {n for kind, n in bwd.outputs if kind == "grad"} == {"add2", "add4"}
    assert {key for kind, key in bwd.outputs if kind == "gext"} == {("linear1", 0, None), ("linear3", 0, None)}
    named = dict(zip(bwd.in_names + bwd.out_names, bwd.inputs + bwd.outputs))
    assert {named[nm][1] for nm in bwd.read_inputs() if nm.startswith("gm")} == {"one_minus5", "mul7"}
    atomic = group_kernel(cell, group.nodes, "bwd_atomic")
    assert atomic.source("float") == fused_backward_kernel(cell, group.nodes, set(cell.params), True).source("float")
    norm = load_cell("layernorm_lstm", 4, 8)
    rows = next(it for st in build_schedule(norm, loop="stages").loop for it in st
                if isinstance(it, Fused) and row_group(norm, it.nodes))
    assert group_kernel(norm, rows.nodes, "fwd").source("float") == row_forward_kernel(norm, rows.nodes).source("float")
    assert group_kernel(norm, rows.nodes, "bwd").source("float") == \
        row_backward_kernel(norm, rows.nodes, set(norm.params)).source("float")


def test_the_gpu_finite_check_skips_what_its_kernels_never_store():
    """CupyBackend.unstored (no GPU needed: it reads only the schedule): every elementwise group's dropped members,
    the loop's where it runs its groups (stages); the scan's own kernel stores its state but not its product
    a ⊙ h@t-1 (mul6), which only the state's sum reads; row groups keep all."""
    from rnngraph.run.backends.cuda.backend import CupyBackend
    gru = build_schedule(load_cell("min_gru", 4, 8), loop="scan")
    assert CupyBackend.unstored(None, gru) == {"add2", "mul6"}
    lstm = load_cell("lstm", 4, 8)
    (group,) = [it for st in build_schedule(lstm, loop="stages").loop for it in st if isinstance(it, Fused)]
    dropped = set(group.nodes) - kept_values(lstm, group.nodes)
    assert len(dropped) == 14 and CupyBackend.unstored(None, build_schedule(lstm, loop="stages")) == dropped
    ind = build_schedule(load_cell("indrnn", 4, 8), loop="elementwise")
    assert CupyBackend.unstored(None, ind) == CupyBackend.unstored(None, build_schedule(ind.cell, loop="stages")) - {
        n for st in ind.loop for it in st if isinstance(it, Fused) for n in it.nodes}
    from rnngraph.run.backends.cuda.rows import row_group
    norm = build_schedule(load_cell("layernorm_lstm", 4, 8), loop="stages")
    rows = {n for it in norm.items if isinstance(it, Fused) and row_group(norm.cell, it.nodes) for n in it.nodes}
    assert rows and not CupyBackend.unstored(None, norm) & rows
