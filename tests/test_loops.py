"""The loop strategies 'scan', 'elementwise' and 'persistent' on numpy against 'stages': values, gradients, errors."""
import numpy as np
import pytest

from numerics import close, directional
from rnngraph import Cell, RnnGraphError, build_schedule, load_cell
from rnngraph.plan.loops import STRATEGIES, ElementwiseLoop, ScanLoop, StagesLoop
from rnngraph.lab.cli import main
from rnngraph.nn.recurrent import Recurrent
from rnngraph.run.backends import get_backend
from rnngraph.plan.loops.scan import scan_forward
from rnngraph.run.backends.cuda.backend import CupyBackend
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.run.executor import Executor
from test_classify import LINEAR_FORMS, one_state

BUILTINS = [("min_gru", "scan"), ("min_gru", "elementwise"), ("indrnn", "elementwise"), ("sru", "elementwise")]
FORMS = [(form, d, loop) for form in LINEAR_FORMS for d in (1, 2, 3) for loop in ("scan", "elementwise")]


def layers(cell, loop, size, **options):
    """(stages layer, `loop` layer) with the same float64 parameters."""
    ref = Recurrent(cell, size, 4, dtype="float64", loop="stages", seed=1, **options)
    other = Recurrent(cell, size, 4, dtype="float64", loop=loop, **options)
    other.load_state_dict(ref.state_dict())
    assert (ref.loop_strategy, other.loop_strategy) == ("stages", loop)
    return ref, other


def calls(layer, xs, lengths):
    """Every array of a run over the chunks xs, the state carried across calls (every cell here has
    one): outputs, finals, and the gradients of inputs, initial state and parameters under random
    output and final gradients, from a random initial state."""
    rng = np.random.default_rng(7)
    state, out = rng.standard_normal(layer(xs[0])[1].shape), []
    for x in xs:
        y, fin = layer(x, state, lengths)
        gx, g0, grads = layer.backward(rng.standard_normal(y.shape), rng.standard_normal(fin.shape))
        out += [y.copy(), fin.copy(), gx.copy(), g0.copy(), *(grads[n].copy() for n in sorted(grads))]
        state = fin.copy()
    return out


def agree(ref, other, xs, lengths, loop):
    for a, b in zip(calls(other, xs, lengths), calls(ref, xs, lengths), strict=True):
        if loop == "elementwise":
            np.testing.assert_array_equal(a, b)         # the same operations in the same order
        else:
            close(a, b, rtol=1e-12)


@pytest.mark.parametrize("cell, loop", BUILTINS, ids=[f"{c}-{l}" for c, l in BUILTINS])
@pytest.mark.parametrize("ragged", [False, True])
def test_builtins_match_stages(cell, loop, ragged):
    ref, other = layers(cell, loop, 5, num_layers=2, bidirectional=True)
    x = np.random.default_rng(3).standard_normal((19, 3, 5))
    agree(ref, other, [x], np.array([19, 11, 1]) if ragged else None, loop)


@pytest.mark.parametrize("form, delay, loop", FORMS, ids=[f"{f}-d{d}-{l}" for f, d, l in FORMS])
def test_linear_forms_match_stages_ragged_and_chunked(form, delay, loop):
    cell = one_state(LINEAR_FORMS[form], delay)
    ref, other = layers(cell, loop, 3)
    x = np.random.default_rng(4).standard_normal((17, 3, 3))
    agree(ref, other, [x], np.array([17, 9, 2]), loop)
    agree(ref, other, [x[:5], x[5:7], x[7:8], x[8:]], None, loop)       # chunks shorter than the delay too


@pytest.mark.parametrize("loop", ["scan", "elementwise"])
@pytest.mark.parametrize("form, delay", [("(1-a)*h + a*b", 1), ("parameter decay", 2), ("b + h*a", 3)])
def test_gradients_match_finite_differences(form, delay, loop):
    cell, rng = one_state(LINEAR_FORMS[form], delay), np.random.default_rng(5)
    ex = Executor(cell, get_backend("numpy"), loop=loop)
    params = {n: rng.uniform(-0.6, 0.6, shape) for n, shape in cell.params.items()}
    x, h0 = rng.standard_normal((13, 2, 3)), rng.standard_normal((delay, 2, 4))
    wy, wf = rng.standard_normal((13, 2, 4)), rng.standard_normal((delay, 2, 4) if delay > 1 else (2, 4))

    def loss(params, x, h0):
        outs, fins = ex.forward(params, {"x": x}, {"h": h0})
        return float((outs["h"] * wy).sum() + (fins["h"] * wf).sum())
    loss(params, x, h0)
    gx, gh, gp = (dict(g) for g in ex.backward({"h": wy}, {"h": wf}))
    gx, gh, gp = gx["x"].copy(), gh["h"].copy(), {n: g.copy() for n, g in gp.items()}
    directional(lambda v: loss(params, v, h0), x, gx, rng)
    directional(lambda v: loss(params, x, v), h0, gh, rng)
    for n in params:
        directional(lambda v: loss({**params, n: v}, x, h0), params[n], gp[n], rng)


def test_scan_fp32_error_against_sequential_fp64():
    """T = 4096, a in (0, 1), b ~ N(0, 1), d = 1: the fp32 scan's largest error is 1.4e-7 of the state's
    largest magnitude (seed 0; 1.0-1.5e-7 over seeds 0-3), as large as the sequential fp32 loop's own
    (1.3e-7): most of it is rounding a and b to fp32, which both share; the scan's 12 combine levels add
    a few ε = 6e-8 each, and a < 1 shrinks what earlier levels carry. Asserted: ≤ 1e-6 (7× what we see)
    and ≤ 2× the sequential fp32 error."""
    rng = np.random.default_rng(0)
    T, B, F = 4096, 2, 16
    a, b, h0 = rng.uniform(0, 1, (T, B, F)), rng.standard_normal((T, B, F)), rng.standard_normal((1, B, F))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    exact, sequential = np.empty((T, B, F)), np.empty((T, B, F), np.float32)
    s, s32 = h0[0], h0[0].astype(np.float32)
    for t in range(T):
        s = exact[t] = a[t] * s + b[t]
        s32 = sequential[t] = a32[t] * s32 + b32[t]
    scanned, m = np.concatenate([h0, np.zeros((T, B, F))]).astype(np.float32), np.empty((T, B, F), np.float32)
    scan_forward(np, a32, b32, scanned, m)
    err = np.abs(scanned[1:] - exact).max() / np.abs(exact).max()
    assert err <= 1e-6 and err <= 2 * np.abs(sequential - exact).max() / np.abs(exact).max(), err
    np.testing.assert_array_equal(m, a32 * scanned[:-1])       # the product node over all frames


class StagesOnly(NumpyBackend):
    name = "stub"
    loops = frozenset({"stages"})


@pytest.mark.parametrize("loop", ["scan", "elementwise"])
def test_a_backend_that_does_not_run_a_strategy_says_so(loop):
    message = rf"^backend 'stub' does not run loop strategy '{loop}'; it runs stages$"
    with pytest.raises(RnnGraphError, match=message):
        Executor(load_cell("min_gru", 4, 6), StagesOnly(), loop=loop)
    with pytest.raises(RnnGraphError, match=message):
        Recurrent("min_gru", 4, 6, backend=StagesOnly(), loop=loop)
    assert CupyBackend.loops | {"persistent"} == NumpyBackend.loops == {"stages", "elementwise", "scan", "persistent"}
    assert NumpyBackend().auto_loops == {"stages", "elementwise", "scan"}       # it runs 'persistent' as 'stages'
    assert Executor(load_cell("min_gru", 4, 6), StagesOnly()).sched.loop_strategy == "stages"     # auto


def test_naive_mode_runs_stages_only():
    with pytest.raises(RnnGraphError, match=r"^loop strategy 'scan' runs the staged schedule .* mode 'naive' runs "):
        Executor(load_cell("min_gru", 4, 6), get_backend("numpy", "naive"), loop="scan")


AUTO = {"min_gru": "scan", "min_lstm": "scan", "qrnn": "scan", "indrnn": "elementwise", "sru": "elementwise",
        "lstm": "stages", "gru": "stages"}      # on numpy; the plan's (no backend) is 'persistent' for lstm and gru


@pytest.mark.parametrize("cell", AUTO)
def test_auto_runs_the_best_strategy_admitted(cell):
    plan = "persistent" if cell in ("lstm", "gru") else AUTO[cell]
    assert build_schedule(load_cell(cell, 4, 6)).loop_strategy == plan
    numpy = Executor(load_cell(cell, 4, 6), get_backend("numpy")).sched.loop_strategy
    assert Recurrent(cell, 4, 6).loop_strategy == AUTO[cell] == numpy
    assert Recurrent(cell, 4, 6, mode="naive").loop_strategy == "stages"


def test_schedule_prints_each_strategy(capsys):
    assert main(["schedule", "min_gru", "--input-size", "4", "--hidden-size", "8", "--loop", "stages"]) == 0
    out = capsys.readouterr().out
    assert "strategy stages" in out and "runs" not in out and "dscan" not in out
    assert main(["schedule", "min_gru", "--input-size", "4", "--hidden-size", "8"]) == 0
    scan = capsys.readouterr().out.rstrip("\n")
    assert scan == str(build_schedule(load_cell("min_gru", 4, 8), loop="scan"))
    assert "  loop (per frame, strategy scan): 1 stages" in scan
    assert "    runs scan   h = one_minus5 ⊙ h@t-1 + mul7 (mul6 too), over all frames" in scan
    assert "      dscan  dh += one_minus5@t+1 ⊙ dh@t+1, reverse scan; done_minus5, dmul7, dh@t-1" in scan
    sru, elementwise = (build_schedule(load_cell("sru", 4, 8), loop=loop) for loop in ("stages", "elementwise"))
    assert "strategy elementwise" in str(elementwise)
    assert f"    {STRATEGIES['scan'].title}: 1 stage items" in scan
    same = str(elementwise).replace("strategy elementwise)", "strategy stages)").replace(
        STRATEGIES["elementwise"].title, STRATEGIES["stages"].title)
    assert same == str(sru)     # the same items, one loop


def test_bench_and_train_take_a_loop_strategy(tmp_path, small_text, capsys):
    from rnngraph.lab import bench
    r = bench.measure("min_gru", "staged", T=6, B=2, H=4, repeats=1, warmup=0, loop="scan")
    assert r["loop_strategy"] == "scan" and r["train_ms"] > 0
    assert bench.measure("min_gru", "staged", T=6, B=2, H=4, repeats=1, warmup=0, loop="stages")["loop_strategy"] \
        == "stages"
    assert bench.measure("min_gru", "staged", T=6, B=2, H=4, repeats=1, warmup=0)["loop_strategy"] == "scan"
    with pytest.raises(RnnGraphError, match="cell 'lstm' does not admit loop strategy 'scan'"):
        bench.measure("lstm", "staged", T=6, B=2, H=4, repeats=1, warmup=0, loop="scan")
    argv = ["train", "--text", str(small_text), "--cell", "min_gru", "--hidden", "8", "--streams", "2", "--bptt", "4",
            "--max-steps", "2", "--backend", "numpy", "--no-progress"]
    runs = {}
    for loop in ("stages", "scan"):
        assert main([*argv, "--loop", loop, "--out", str(tmp_path / loop)]) == 0
        runs[loop] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("done:")]
    assert runs["scan"][0].split("validation bpc ")[1][:5] == runs["stages"][0].split("validation bpc ")[1][:5]


def mixed_cell(kind: str):
    """Two states: c = f ⊙ c@t-1 + (1-f) ⊙ g (linear-diagonal, scanned) and h, which reads c and itself
    through W·h (general: the rest runs frame by frame) or u ⊙ h (elementwise: the rest walks features)."""
    c = Cell(f"mixed_{kind}")
    x, cs, h = c.input("x", 3), c.state("c", 4), c.state("h", 4)
    f, g = c.sigmoid(c.linear(x, "W_f", 4, bias="b_f")), c.tanh(c.linear(x, "W_g", 4))
    cn = c.bind(cs, f * cs + (1 - f) * g, name="c")
    rec = c.linear(h, "U", 4) if kind == "general" else c.diag(h, "u")
    c.output(c.bind(h, c.tanh(rec + cn + c.linear(x, "W_h", 4)), name="h"))
    return c.build()


MIXED = {"general": (("scan", "persistent", "stages"), StagesLoop), "elementwise": (("scan", "elementwise", "stages"), ElementwiseLoop)}


def run_executor(ex, params, x, init, gy, gf, lengths=None):
    outs, fins = ex.forward(params, {"x": x}, init, lengths)
    got = [outs["h"].copy(), *(fins[s].copy() for s in sorted(fins))]
    gx, g0, gp = ex.backward({"h": gy}, gf)
    return got + [gx["x"].copy(), *(g0[s].copy() for s in sorted(g0)), *(gp[n].copy() for n in sorted(gp))]


@pytest.mark.parametrize("kind", MIXED)
def test_a_scanned_state_beside_other_states(kind):
    """The linear-diagonal state is scanned, the rest of the loop runs after it, reading it; values and
    every gradient equal 'stages' to 1e-12, ragged too, and the scan's gradients match finite differences."""
    cell, rng = mixed_cell(kind), np.random.default_rng(6)
    admits, rest = MIXED[kind]
    sched = build_schedule(cell, loop="scan")
    assert sched.loop_strategies == admits and build_schedule(cell).loop_strategy == "scan"
    assert [type(it) for it in sched.forward[1].items] == [ScanLoop, rest]
    assert [type(it) for it in sched.backward[1].items] == [rest, ScanLoop]
    text = str(sched)
    assert "    runs scan   c = sigmoid3 ⊙ c@t-1 + mul8" in text and "    runs stage" in text     # then the rest
    params = {n: rng.uniform(-0.6, 0.6, shape) for n, shape in cell.params.items()}
    x, init = rng.standard_normal((11, 3, 3)), {s: rng.standard_normal((3, 4)) for s in ("c", "h")}
    gy, gf = rng.standard_normal((11, 3, 4)), {s: rng.standard_normal((3, 4)) for s in ("c", "h")}
    ref, ex = (Executor(cell, get_backend("numpy"), loop=loop) for loop in ("stages", "scan"))
    for lengths in (None, np.array([11, 6, 1])):
        for a, b in zip(run_executor(ex, params, x, init, gy, gf, lengths),
                        run_executor(ref, params, x, init, gy, gf, lengths), strict=True):
            close(a, b, rtol=1e-12)

    def loss(params, x):
        outs, fins = ex.forward(params, {"x": x}, init)
        return float((outs["h"] * gy).sum() + sum((fins[s] * gf[s]).sum() for s in gf))
    loss(params, x)
    gx, _, gp = (dict(g) for g in ex.backward({"h": gy}, gf))
    gx, gp = gx["x"].copy(), {n: g.copy() for n, g in gp.items()}
    directional(lambda v: loss(params, v), x, gx, rng)
    for n in params:
        directional(lambda v: loss({**params, n: v}, x), params[n], gp[n], rng)


def test_persistent_runs_as_stages_on_numpy_bit_for_bit():
    """On numpy 'persistent' walks the stages frame by frame: the same numbers, and the layer says so."""
    ref = Recurrent("lstm", 4, 6, dtype="float64", loop="stages", num_layers=2, bidirectional=True, seed=1)
    pers = Recurrent("lstm", 4, 6, dtype="float64", loop="persistent", num_layers=2, bidirectional=True)
    pers.load_state_dict(ref.state_dict())
    assert pers.loop_strategy == "persistent" and pers.loop_note is None        # the plan's, before any call
    rng = np.random.default_rng(8)
    x, h0, c0 = rng.standard_normal((9, 3, 4)), rng.standard_normal((4, 3, 6)), rng.standard_normal((4, 3, 6))
    gy, gh, gc = rng.standard_normal((9, 3, 12)), rng.standard_normal((4, 3, 6)), rng.standard_normal((4, 3, 6))
    got = []
    for layer in (pers, ref):
        y, (h, c) = layer(x, (h0, c0))
        gx, (gh0, gc0), grads = layer.backward(gy, (gh, gc))
        got.append([y.copy(), h.copy(), c.copy(), gx.copy(), gh0.copy(), gc0.copy(),
                    *(grads[n].copy() for n in sorted(grads))])
    for a, b in zip(*got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert pers.loop_strategy == "stages" and "numpy" in pers.loop_note
