"""`rnngraph bench` on the CPU, the measurement API, and the torch eager loops being the same cells."""
import json
import random

import numpy as np
import pytest

import rnngraph as rg
from rnngraph.lab import bench
from rnngraph.lab.bench_report import format_table
from rnngraph.run.backends.numpy_backend import NumpyBackend
from rnngraph.lab.cli import main
from rnngraph.run.backends import get_backend
from rnngraph.run.executor import Executor

torch = pytest.importorskip("torch")
from rnngraph.lab.references import STEPS, GraphLoop, HandWritten, eager_loop  # noqa: E402

RESULT_KEYS = {"impl", "cell", "T", "B", "H", "D", "layers", "dtype", "backend", "forward_ms", "train_ms",
               "forward_all", "train_all"}


# -- the command ------------------------------------------------------------------------------
def test_quick_bench_writes_every_measurement_and_says_gpu_rows_were_skipped(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    info = data["machine"]
    assert {"device", "cuda_runtime", "cuda_driver", "python", "numpy", "networkx", "cupy", "torch",
            "commit", "date", "command", "tf32"} <= set(info)
    assert out.splitlines()[1] == f"device: {info['device']}" or out.splitlines()[1].startswith("device: ")
    assert "TF32 off" in out
    rows = data["results"]
    assert {r["cell"] for r in rows} == {"lstm", "peephole_lstm", "layernorm_lstm", "min_gru", "mgu"}
    assert {r["impl"] for r in rows} == set(bench.DEFAULT_IMPLS)
    for r in rows:
        if "skipped" not in r:
            assert RESULT_KEYS <= set(r) and r["T"] == 8 and r["B"] == 2 and r["H"] == 16
            assert len(r["forward_all"]) == len(r["train_all"]) == 3
            assert r["forward_ms"] > 0 and r["train_ms"] > 0
    ran = {(r["cell"], r["impl"]) for r in rows if "skipped" not in r}
    assert {("lstm", "naive"), ("lstm", "staged"), ("mgu", "torch_eager")} <= ran
    if bench.gpu_problem():
        assert all("skipped" in r for r in rows if r["impl"] == "graph")
        assert "GPU rows were skipped" in out and bench.gpu_problem() in out
    lib = "cudnn" if bench.gpu_problem() is None else "torch_cpu"        # torch's own layer: cuDNN, or on the CPU
    assert f"fwd/{lib}" in out and "train/eager" in out
    assert "speed-up of staged over naive" in out
    assert ("lstm", "torch_cpu") in ran and "CPU: numpy BLAS " in out


def test_bench_options_lists_and_unknown_impl(capsys):
    assert main(["bench", "--cell", "gru", "-T", "3,5", "-T", "4", "-B", "1,2", "-H", "4", "--impls", "naive",
                 "--repeats", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[1:3] for line in out.splitlines() if line.startswith("gru ")]
    assert rows == [[T, B] for T in ("3", "5", "4") for B in ("1", "2")]
    assert main(["bench", "--quick", "--impls", "fast"]) == 2
    assert "unknown implementation" in capsys.readouterr().err


@pytest.mark.parametrize("path, message", [
    ("missing/bench.json", "missing does not exist; create it or pass another --json FILE"),
    ("file/bench.json", "file is not a folder; pass another --json FILE"),
    (".", "--json . is a folder; give a file, e.g. bench.json"),
    ("", "--json FILE is empty"),
])
def test_a_bad_json_path_is_one_line_before_measuring(tmp_path, monkeypatch, capsys, path, message):
    monkeypatch.setattr(bench, "measure", lambda *a, **k: pytest.fail("measured before checking --json"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    assert main(["bench", "--quick", "--json", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rnngraph: error: ") and message in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_ctrl_c_says_no_measurement_was_kept(tmp_path, monkeypatch, capsys):
    def interrupt(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "measure", interrupt)
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(path)]) == 130
    err = capsys.readouterr().err.strip().split("\n")[-1]     # after the progress bar
    assert err == f"rnngraph: interrupted; no measurements were kept; {path} was not written"
    assert list(tmp_path.iterdir()) == []


def test_table_ratios_against_cudnn_and_the_eager_loop():
    base = {"cell": "lstm", "T": 100, "B": 1, "H": 512, "D": 512, "layers": 1, "dtype": "float32"}
    rows = [dict(base, impl=i, backend="x", forward_ms=f, train_ms=t)
            for i, f, t in [("naive", 40.0, 120.0), ("graph", 0.5, 1.2), ("cudnn", 1.0, 4.0),
                            ("torch_eager", 10.0, 60.0)]]
    rows.append(dict(base, impl="staged", skipped="needs a usable GPU: none here"))
    lines = format_table(rows).splitlines()
    graph = next(line for line in lines if " graph " in line).split()
    assert graph[-4:] == ["0.50x", "0.30x", "0.05x", "0.02x"]
    assert "lstm B=1 H=512: speed-up of graph over naive: forward 80.00x, train 100.00x" in lines
    assert "skipped staged for lstm: needs a usable GPU: none here" in lines
    assert "GPU rows were skipped (staged): no usable GPU here" in lines


# -- the measurement API ----------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["naive", "staged"])
def test_measure_rnngraph_modes(impl):
    r = bench.measure("lstm", impl, T=4, B=2, H=8, D=3, layers=2, repeats=3, warmup=1)
    assert RESULT_KEYS <= set(r) and r["D"] == 3 and r["layers"] == 2
    assert r["backend"] == get_backend("auto").name      # cupy on a GPU, else the compiled cpu backend (or numpy)
    assert len(r["forward_all"]) == 3 and min(r["forward_all"] + r["train_all"]) > 0
    assert r["forward_ms"] == sorted(r["forward_all"])[1]


def test_measure_skips_what_cannot_run_and_rejects_unknown_impls():
    assert "no torch.nn layer" in bench.measure("peephole_lstm", "cudnn", T=2, B=1, H=4)["skipped"]
    if bench.gpu_problem():
        assert bench.measure("lstm", "graph", T=2, B=1, H=4)["skipped"].endswith(bench.gpu_problem())
    if not torch.cuda.is_available():
        assert "sees no GPU" in bench.measure("lstm", "cudnn", T=2, B=1, H=4)["skipped"]
    with pytest.raises(rg.RnnGraphError, match="unknown implementation"):
        bench.measure("lstm", "cublas")


def test_measure_torch_eager_forward_only():
    r = bench.measure("mgu", "torch_eager", T=3, B=1, H=4, repeats=2, warmup=0, what=("forward",))
    assert r["eager_loop"] == "hand-written" and r["train_ms"] is None and len(r["forward_all"]) == 2


def test_measure_torch_compile_is_the_same_loop_compiled():
    """The compiled loop is checked against the eager one when it is built; its compile time is reported."""
    r = bench.measure("mgu", "torch_compile", T=3, B=1, H=4, repeats=2, warmup=1)
    assert r["eager_loop"] == "hand-written" and r["compile_s"] > 0
    assert r["forward_ms"] > 0 and r["train_ms"] > 0 and len(r["train_all"]) == 2


@pytest.mark.filterwarnings("error::rnngraph.RnnGraphWarning")     # the hand-written step matches in bfloat16
def test_measure_in_bfloat16_on_the_cpu():
    pytest.importorskip("ml_dtypes")
    for impl in ("staged", "torch_eager"):
        r = bench.measure("mgu", impl, T=3, B=2, H=4, repeats=2, warmup=1, dtype="bfloat16")
        assert r["dtype"] == "bfloat16" and r["train_ms"] > 0
    assert r["eager_loop"] == "hand-written"


def test_time_ms_excludes_warmup():
    calls = []
    times = bench.time_ms(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(times) == 5 and len(calls) == 7 and all(t >= 0 for t in times)
    with pytest.raises(rg.RnnGraphError):
        bench.time_ms(lambda: None, device="tpu")


# -- the torch eager loops are the same cells -------------------------------------------------
def user_cell(D, H):
    """A cell no library ships: a delay-2 skip, a concat and slice, a scale."""
    c = rg.Cell("user")
    x, h = c.input("x", D), c.state("h", H)
    f = c.sigmoid(c.linear(x, "W_f", H, bias="b_f") + c.linear(h, "U_f", H) + c.diag(h.ago(2), "p"))
    n = c.tanh(c.slice(c.concat(c.linear(x, "W_n", H), f * h), 0, H) * 0.5)
    c.output(c.bind(h, (1 - f) * h + f * n - c.relu(n), name="h"))
    return c.build()


def random_cell(seed, D, H):
    r = random.Random(seed)
    c = rg.Cell(f"random{seed}")
    x, s = c.input("x", D), c.state("s", H)
    pool = [c.linear(x, "W", H, bias="b"), c.linear(s, "U", H), c.linear(s.ago(2), "V", H)]
    for k in range(6):
        a, b = r.choice(pool), r.choice(pool)
        pool.append(r.choice([lambda: a + b, lambda: a * c.tanh(b), lambda: 1 - c.sigmoid(a),
                              lambda: c.relu(a) - b, lambda: c.diag(a, f"d{k}")])())
    c.bind(s, c.tanh(pool[-1] + pool[0]))
    c.output(c.sigmoid(pool[-2]), name="y")
    return c.build()


def reference(cell, T=5, B=3, seed=0):
    """rnngraph's numpy float64 naive run (the spec): params, x, init, gy and (y, finals, grad_x)."""
    rng = np.random.default_rng(seed)
    params = {p: rng.uniform(-0.6, 0.6, s) for p, s in cell.params.items()}
    x = rng.standard_normal((T, B, cell.inputs["x"]))
    init = {s: rng.standard_normal((B, n)) * 0.5 for s, (_, n) in cell.states.items()}
    gy = rng.standard_normal((T, B, cell.op(cell.outputs[0]).size))
    ex = Executor(cell, NumpyBackend("naive"))
    outs, finals = ex.forward(params, {"x": x}, init)
    ref = (outs[cell.outputs[0]].copy(), {k: v.copy() for k, v in finals.items()})
    gx = ex.backward({cell.outputs[0]: gy}, {})[0]["x"].copy()
    return params, x, init, gy, ref + (gx,)


def assert_same_cell(loop_cls, cell, tol=1e-12):
    params, x, init, gy, (y_ref, fin_ref, gx_ref) = reference(cell)
    P = {k: torch.tensor(v) for k, v in params.items()}
    xt = torch.tensor(x, requires_grad=True)
    y, finals = loop_cls(cell, P)(xt, {k: torch.tensor(v) for k, v in init.items()})
    y.backward(torch.tensor(gy))
    pairs = [(y, y_ref), (xt.grad, gx_ref)] + [(finals[s], fin_ref[s]) for s in fin_ref]
    for got, want in pairs:
        err = np.linalg.norm(got.detach().numpy() - want) / np.linalg.norm(want)
        assert err <= tol, f"{cell.name} {loop_cls.__name__}: relative error {err:.1e}"


@pytest.mark.parametrize("name", sorted(STEPS))
def test_hand_written_step_is_the_same_cell(name):
    assert_same_cell(HandWritten, rg.load_cell(name, 5, 6))


@pytest.mark.parametrize("name", [*rg.CELLS, "user", "random0", "random1", "random2"])
def test_graph_interpreter_is_the_same_cell(name):
    cell = (user_cell(5, 6) if name == "user" else random_cell(int(name[6:]), 5, 6)
            if name.startswith("random") else rg.load_cell(name, 5, 6))
    assert_same_cell(GraphLoop, cell)


def test_graph_interpreter_carries_every_frame_a_cell_reads_across_calls():
    cell = user_cell(5, 6)                                          # reads h two frames back
    loop = GraphLoop(cell, {k: torch.tensor(v) for k, v in reference(cell)[0].items()})
    x = torch.randn(6, 2, 5, dtype=torch.float64)
    y, finals = loop(x)
    y1, mid = loop(x[:3])
    y2, end = loop(x[3:], mid)
    assert mid["h"].shape == (2, 2, 6)                              # [D, B, S], oldest first
    torch.testing.assert_close(torch.cat([y1, y2]), y, rtol=0, atol=1e-12)
    torch.testing.assert_close(end["h"], finals["h"], rtol=0, atol=1e-12)


def test_eager_loop_uses_the_graph_when_a_cell_only_shares_a_builtin_name():
    P = {k: torch.rand(s, dtype=torch.float64) for k, s in rg.load_cell("lstm", 3, 4).params.items()}
    assert isinstance(eager_loop(rg.load_cell("lstm", 3, 4), P), HandWritten)
    impostor = rg.load_cell("lstm", 3, 4)
    g = impostor.graph.copy()
    g.nodes["f"]["op"] = rg.Op(rg.OpKind.TANH, 4)       # same parameters, different equations
    impostor = rg.CellGraph("lstm", g, impostor.inputs, impostor.states, impostor.outputs, impostor.params)
    with pytest.warns(rg.RnnGraphWarning, match="differs from rnngraph's built-in"):
        assert isinstance(eager_loop(impostor, P), GraphLoop)


@pytest.mark.parametrize("name", ["min_gru", "min_lstm", "qrnn"])
def test_the_jax_peer_computes_the_same_cell(name):
    """The JAX program bench times is the same cell: same weights (rnngraph's layout), same outputs."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from rnngraph.lab.jax_refs import jax_forward
    layer = rg.nn.Recurrent(name, 5, 6, seed=3)                     # float32, torch's U(±1/√H) init
    x = np.random.default_rng(4).standard_normal((9, 2, 5)).astype(np.float32)
    want, _ = layer(x)
    P = layer.parameters()
    with jax.default_matmul_precision("highest"):          # no TF32 on a GPU: fp32 against fp32
        got = jax_forward(name, 6)({"W": jnp.asarray(P["weight_ih_l0"]), "b": jnp.asarray(P["bias_ih_l0"])},
                                   jnp.asarray(x))
    scale = float(np.abs(want).max())
    assert float(np.abs(np.asarray(got) - want).max()) <= 1e-5 * scale      # float32 on both sides: reduction order
    r = bench.measure(name, "jax_scan", T=8, B=2, H=4, repeats=1, warmup=0)
    assert r["backend"].startswith("jax-") and r["train_ms"] > 0
    assert "skipped" in bench.measure("lstm", "jax_scan", T=8, B=2, H=4, repeats=1, warmup=0)


def test_several_loop_strategies_in_one_run(capsys):
    """--loop takes a list: rnngraph's rows per strategy (labelled mode:strategy), a cell skipping the
    strategies it does not admit, naive running stages only; an unknown strategy is one line, exit 2."""
    argv = ["bench", "--quick", "--cell", "min_gru,lstm", "--impls", "naive,staged,rnngraph_torch",
            "--loop", "scan,stages"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [r for r in (line.split() for line in out.splitlines()) if r[:1] in (["min_gru"], ["lstm"]) and r[1] == "8"]
    assert [(r[0], r[4]) for r in rows] == [("min_gru", "naive"), ("min_gru", "staged:scan"), ("min_gru", "staged"),
                                            ("min_gru", "rnngraph_torch"), ("lstm", "naive"), ("lstm", "staged"),
                                            ("lstm", "rnngraph_torch")]
    assert "skipped staged for lstm: loop scan: the cell admits persistent, stages" in out
    assert main(["bench", "--quick", "--loop", "scan,bogus"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("rnngraph: error: unknown loop strategy ['bogus']; choose from auto, scan, elementwise, "
                           "persistent, stages")
