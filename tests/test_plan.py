"""The plan as data: the backward plan and the loop strategy, exact for LSTM and MGU, printed and in JSON,
and the executor's one dispatch table covering every item kind the planner emits."""
import json

import numpy as np
import pytest

import rnngraph.nn as rnn
from rnngraph import CELLS, Cell, RnnGraphError, build_schedule, load_cell
from rnngraph.plan.items import FusedGrad, GemmGrad, ParamSum, SharedWeight, WeightGrad
from rnngraph.plan.loops import STRATEGIES, PersistentLoop, StagesLoop
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.run.executor import HANDLERS, Executor

LSTM_FUSED = ("add2, add4, add6, add8, add10, add12, add14, add16, add17, i, add18, f, add19, g, add20, o, mul21, "
              "mul22, c, tanh24, h")      # the input biases' adds too (sunk): no pre pass of their own
EXPECTED = {
    "lstm": {
        "forward_loop": [f"stages 0+1: pair   linear3, linear7, linear11, linear15 -> {{{LSTM_FUSED}}}   "
                         "(one kernel where the backend can)"],
        "backward": [
            ("post", []),
            ("loop", [f"stage 1: dfused {{{', '.join(reversed(LSTM_FUSED.split(', ')))}}}",
                      "stage 0: dgemm  dh@t-1 += d[linear3, linear7, linear11, linear15] · [W_hi; W_hf; W_hg; W_ho]"]),
            ("reduce", ["dW_hi; dW_hf; dW_hg; dW_ho <- gemm over T", "db_ii <- sum over T", "db_hi <- sum over T",
                        "db_if <- sum over T", "db_hf <- sum over T", "db_ig <- sum over T", "db_hg <- sum over T",
                        "db_io <- sum over T", "db_ho <- sum over T"]),
            ("pre", ["dgemm  dx += d[linear1, linear5, linear9, linear13] · [W_ii; W_if; W_ig; W_io]",
                     "dW_ii; dW_if; dW_ig; dW_io <- gemm over T"]),
            ("shared", [])]},
    "mgu": {
        "forward_loop": ["stages 0+1: pair   linear3 -> {add2, add4, f, mul7, one_minus10, mul11}   "
                         "(one kernel where the backend can)",
                         "stages 2+3: pair   linear8 -> {add6, add9, n, mul12, h}   (one kernel where the backend can)"],
        "backward": [
            ("post", []),
            ("loop", ["stage 3: dfused {h, mul12, n, add9, add6}", "stage 2: dgemm  dmul7 += d[linear8] · [U_n]",
                      "stage 1: dfused {mul11, one_minus10, mul7, f, add4, add2}",
                      "stage 0: dgemm  dh@t-1 += d[linear3] · [U_f]"]),
            ("reduce", ["dU_f <- gemm over T", "db_f <- sum over T", "dU_n <- gemm over T", "db_n <- sum over T"]),
            ("pre", ["dgemm  dx += d[linear1, linear5] · [W_f; W_n]", "dW_f; dW_n <- gemm over T"]),
            ("shared", [])]},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_backward_plan_exact_in_json(name):
    s = json.loads(json.dumps(build_schedule(load_cell(name, 8, 16), loop="stages").summary()))
    assert s["loop_strategy"] == "stages"
    assert s["forward_loop"] == EXPECTED[name]["forward_loop"]
    assert [(sec["section"], sec["items"]) for sec in s["backward"]] == EXPECTED[name]["backward"]
    default = json.loads(json.dumps(build_schedule(load_cell(name, 8, 16)).summary()))      # auto: persistent
    assert default == {**s, "loop_strategy": "persistent"}                                   # the same stages


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_backward_plan_printed_in_order(name):
    lines = str(build_schedule(load_cell(name, 8, 16), loop="stages")).splitlines()
    assert f"  loop (per frame, strategy stages): {4 if name == 'mgu' else 2} stages" in lines
    assert [f"    runs {line}" for line in EXPECTED[name]["forward_loop"]] == [ln for ln in lines if "runs " in ln]
    start = lines.index("  backward:")
    stop = next(k for k in range(start + 1, len(lines)) if not lines[k].startswith("    "))     # its sections
    printed = [ln.strip() for ln in lines[start + 1:stop] if ln.startswith("      ")]
    assert printed == [item for _, items in EXPECTED[name]["backward"] for item in items]
    titles = [ln.strip().split(":")[0] for ln in lines[start + 1:stop] if not ln.startswith("      ")]
    assert titles == ["post reversed, over all frames", "loop in reverse time, stages reversed",
                      "parameter gradients of loop and post, reduced once over all frames",
                      "pre reversed, over all T·B rows", "weights shared by several ops"]
    default = str(build_schedule(load_cell(name, 8, 16))).splitlines()        # auto: persistent, the same stages
    assert "    runs all stages as one cooperative kernel a direction on the GPU" in default.pop(
        default.index("  post (once over all frames): 0 kernels") - 1)
    n = 4 if name == "mgu" else 2
    assert default == [ln.replace(f"strategy stages): {n}", f"strategy persistent): {n}")
                       .replace(f"{STRATEGIES['stages'].title}: {n} stage", f"{STRATEGIES['persistent'].title}: {n} stage")
                       for ln in lines]


def test_backward_items_carry_the_decisions():
    lstm = build_schedule(load_cell("lstm", 8, 16), loop="stages")
    post, loop, reduce, pre, shared = lstm.backward
    (bwd_loop,) = loop.items
    assert isinstance(bwd_loop, StagesLoop) and bwd_loop.reverse and loop.per_frame
    assert [type(it) for st in bwd_loop.stages for it in st.items] == [FusedGrad, GemmGrad]
    assert not any(it.params for st in bwd_loop.stages for it in st.items)      # reduced once, after the loop
    assert [type(r) for r in reduce.items] == [WeightGrad] + [ParamSum] * 8      # both biases of each gate
    assert reduce.items[2].terms == (("add4", 1),)                               # b_hi read by add4, slot 1
    assert lstm.capture_problem is None and post.items == () == shared.items
    (persistent,) = build_schedule(load_cell("lstm", 8, 16)).backward[1].items             # auto's: the same stages
    assert isinstance(persistent, PersistentLoop) and persistent.reverse and persistent.stages == bwd_loop.stages


def test_post_item_reading_a_node_at_two_delays_adds_atomically():
    sru = build_schedule(load_cell("sru", 8, 16))
    (post,) = sru.backward[0].items
    assert isinstance(post, FusedGrad) and post.one_kernel and post.atomic      # c at t and t-1
    assert sru.capture_problem is None and "(atomic adds: reads a node at several delays)" in str(sru)
    assert [r.param for r in sru.backward[2].items] == ["b_f", "v_f", "v_r"]   # loop's (b_f sunk), then post's
    assert sru.summary()["param_grad_reductions"] == ["db_f <- sum over T", "dv_f <- sum over T"]   # the loop's


def test_naive_plan_takes_parameter_gradients_frame_by_frame():
    s = build_schedule(load_cell("lstm", 8, 16), optimize=False)
    (loop,) = s.backward[1].items
    steps = [it for st in loop.stages for it in st.items]
    assert all(it.params for it in steps) and not s.backward[2].items
    assert [len(st.items) for st in loop.stages] == [1] * 29


def test_shared_weights_are_accumulated_last():
    c = Cell("tied")
    x, h = c.input("x", 3), c.state("h", 4)
    c.output(c.bind(h, c.tanh(c.linear(x, "W", 4) + c.linear(h, "U", 4) + c.linear(c.tanh(h), "U", 4)), name="h"))
    s = build_schedule(c.build())
    assert s.backward[-1].items == tuple(SharedWeight(it, "U", 0, 4) for st in s.loop for it in st
                                         if getattr(it, "weights", None) == ("U",))


def every_plan():
    for name in CELLS:
        for optimize in (True, False):
            yield build_schedule(load_cell(name, 4, 6), optimize)


def kinds(items):
    for it in items:
        yield type(it)
        for st in getattr(it, "stages", ()):
            yield from kinds(st.items)


def test_dispatch_table_covers_every_item_kind_the_planner_emits():
    emitted = {k for s in every_plan() for sec in s.forward + s.backward for k in kinds(sec.items)}
    assert emitted <= set(HANDLERS) and len(emitted) >= 8


# -- the loop strategy -------------------------------------------------------------------------------
def test_loop_strategy_is_a_field_chosen_by_auto():
    cell = load_cell("gru", 4, 6)
    assert build_schedule(cell).loop_strategy == "persistent" == build_schedule(cell, loop="persistent").loop_strategy
    assert build_schedule(cell).summary() == build_schedule(cell, loop="persistent").summary()
    assert build_schedule(cell).summary() == {**build_schedule(cell, loop="stages").summary(), "loop_strategy": "persistent"}
    assert build_schedule(cell, optimize=False).summary()["loop_strategy"] == "stages"
    assert Executor(cell, get_backend("numpy")).sched.loop_strategy == "stages"    # numpy's auto: not persistent


LOOP_ERRORS = [("gru", "bogus", r"^unknown loop strategy 'bogus'; choose one of auto, scan, elementwise, persistent, stages$"),
               ("gru", "scan", r"^cell 'gru' does not admit loop strategy 'scan': it needs a linear_diagonal state; "
                               r"state h is general \(its "
                               r"recurrence has cross-feature ops \(linear3, linear7, linear11\)\); it admits persistent, stages$"),
               ("indrnn", "scan", r"^cell 'indrnn' does not admit loop strategy 'scan': it needs a linear_diagonal "
                                  r"state; state h is elementwise \(its "
                                  r"recurrence is elementwise: each feature on its own\); it admits elementwise, stages$")]


@pytest.mark.parametrize("cell, loop, message", LOOP_ERRORS, ids=[f"{c}-{l}" for c, l, _ in LOOP_ERRORS])
@pytest.mark.parametrize("where", ["build_schedule", "Executor", "Recurrent"])
def test_a_loop_strategy_that_cannot_run_is_one_clear_error(cell, loop, message, where):
    make = {"build_schedule": lambda: build_schedule(load_cell(cell, 4, 6), loop=loop),
            "Executor": lambda: Executor(load_cell(cell, 4, 6), get_backend("numpy"), loop=loop),
            "Recurrent": lambda: rnn.Recurrent(cell, 4, 6, loop=loop)}[where]
    with pytest.raises(RnnGraphError, match=message):
        make()


def test_an_executor_without_a_runner_for_the_plan_says_so(monkeypatch):
    monkeypatch.delitem(HANDLERS, StagesLoop)
    with pytest.raises(RnnGraphError, match="loop strategy 'stages' has no runner"):
        Executor(load_cell("gru", 4, 6), get_backend("numpy"))


def test_loop_override_runs_the_same_numbers():
    x = np.random.default_rng(0).standard_normal((5, 2, 4))
    auto = rnn.LSTM(4, 6, num_layers=2, dtype="float64")
    stages = rnn.LSTM(4, 6, num_layers=2, dtype="float64", loop="stages")
    (ya, _), (yb, _) = auto(x), stages(x)
    np.testing.assert_array_equal(ya, yb)
    assert stages.loop == "stages" and stages._stack.runs[0][0].ex.sched.loop_strategy == "stages"


# -- the mode is resolved once, into the backend ---------------------------------------------------
def test_the_mode_lives_in_the_backend():
    with pytest.raises(RnnGraphError, match=r"^mode 'graph' runs on the cupy backend, not on numpy; use 'staged'"):
        get_backend("numpy", "graph")
    with pytest.raises(RnnGraphError, match=r"^the numpy backend runs mode 'naive' or 'staged', not 'graph'$"):
        NumpyBackend("graph")
    assert get_backend("numpy").mode == "staged" and get_backend("numpy").records is None
    naive = Executor(load_cell("gru", 4, 6), get_backend("numpy", "naive"))
    assert not naive.sched.hoist_param_grads and not naive.sched.pre          # the naive schedule
    assert Executor(load_cell("gru", 4, 6), get_backend("numpy")).sched.hoist_param_grads
    with pytest.raises(RnnGraphError, match=r"^the backend object was made for mode 'staged', not 'graph': pass one "
                                            r"made for it, get_backend\(name, 'graph'\), or leave mode out$"):
        rnn.GRU(4, 6, backend=get_backend("numpy"), mode="graph")
    assert rnn.GRU(4, 6, backend=get_backend("numpy", "naive")).mode == "naive"      # the object's own mode
    with pytest.raises(RnnGraphError, match=r"get_backend takes the mode, not capture=: get_backend\('cupy', 'graph'\)"):
        get_backend("cupy", capture=True)
    with pytest.raises(RnnGraphError, match=r"^the numpy backend takes no option lanes; it takes none$"):
        get_backend("numpy", lanes=2)
    assert get_backend("auto", lanes=2).name in ("numpy", "cpu", "cupy")     # auto passes each backend only its options
