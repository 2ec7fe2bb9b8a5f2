"""Stored cell graphs: exact round trips, one clear error for bad data, and checkpoints that run the cell
they were trained with (never importing a user's module to load one)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_schedule import build as build_random_cell, recipes

from rnngraph import CELLS, Cell, RnnGraphError, build_schedule, load_cell, nn
from rnngraph.train import checkpoint as ck
from rnngraph.ir.cellio import cell_from_dict, cell_to_dict, first_difference
from rnngraph.lab.cli import main
from rnngraph.train.sample import generate, load_model
from rnngraph.train.loop import TrainConfig, read_log, train

ROOT = Path(__file__).resolve().parents[1]

MGU = '''from rnngraph import Cell


def mgu(input_size, hidden_size):
    c = Cell("mgu")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    f = c.sigmoid(c.linear(x, "W_f", hidden_size, bias="b_f") + c.linear(h, "U_f", hidden_size))
    n = c.tanh(c.linear(x, "W_n", hidden_size, bias="b_n") + c.linear(f * h, "U_n", hidden_size), name="n")
    c.output(c.bind(h, (1 - f) * h + f * n, name="h"))
    return c.build()
'''


def stored(cell):
    """The cell after a trip through JSON text, as a checkpoint stores it."""
    return cell_from_dict(json.loads(json.dumps(cell_to_dict(cell))))


def assert_same(a, b):
    assert str(b) == str(a)
    assert str(build_schedule(b)) == str(build_schedule(a))
    assert build_schedule(b).summary() == build_schedule(a).summary()
    assert list(b.graph.nodes(data="op")) == list(a.graph.nodes(data="op"))          # order and exact attrs
    assert list(b.graph.edges(keys=True, data=True)) == list(a.graph.edges(keys=True, data=True))
    assert (b.name, b.inputs, b.states, b.outputs, b.params, b.layout) == \
        (a.name, a.inputs, a.states, a.outputs, a.params, a.layout)
    assert list(b.states) == list(a.states) and list(b.layout) == list(a.layout)
    assert first_difference(a, b, "a", "b") is None


def delays_scale_slice():
    """h read 2 and 3 frames back, c 2 back, float scales that JSON must keep to the last bit, slice/concat."""
    c = Cell("odd")
    x, h, cs = c.input("x", 3), c.state("h", 4), c.state("c", 4)
    hx = c.concat(h.ago(2), c.scale(h.ago(3), 1 / 3), name="hx")
    a = c.slice(c.linear(c.concat(x, hx), "W", 8), 0, 4)
    c_new = c.bind(cs, c.scale(cs.ago(2), 0.1) + c.slice(hx, 4, 8), name="c")
    c.output(c.bind(h, c.tanh(a + c_new * -2.5e-17), name="h"))
    return c.build()


def plain(v) -> bool:
    """True when v is JSON's own data: dicts with str keys, lists, str, int, float, bool, None."""
    if isinstance(v, dict):
        return all(isinstance(k, str) and plain(x) for k, x in v.items())
    if isinstance(v, list):
        return all(map(plain, v))
    return v is None or type(v) in (str, int, float, bool)


# -- round trips ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CELLS))
def test_every_builtin_cell_round_trips(name):
    for size in (5, 16):                                        # layer 0 and an upper layer
        cell = load_cell(name, size, 16)
        assert plain(cell_to_dict(cell))
        assert_same(cell, stored(cell))


def test_delays_scale_and_slice_round_trip_exactly():
    cell = delays_scale_slice()
    back = stored(cell)
    assert_same(cell, back)
    scales = [cell.op(n).attrs[0] for n in cell.graph if cell.op(n).kind.value == "scale"]
    assert [float.hex(back.op(n).attrs[0]) for n in back.graph if back.op(n).kind.value == "scale"] == \
        [float.hex(s) for s in scales] and 1 / 3 in scales
    assert max(d for *_, d in back.graph.edges(data="delay")) == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes())
def test_random_cells_round_trip(recipe):
    cell = build_random_cell(recipe)
    assert_same(cell, stored(cell))


def test_a_stored_cell_runs_as_the_original():
    cell = delays_scale_slice()
    layers = [nn.Recurrent(c, 3, 4, dtype="float64", seed=1) for c in (cell, stored(cell))]
    x = np.random.default_rng(0).standard_normal((6, 2, 3))
    assert np.array_equal(layers[0](x)[0], layers[1](x)[0])


# -- bad data -------------------------------------------------------------------------------------

def _node(d, name):
    return next(n for n in d["nodes"] if n["name"] == name)


BAD = {   # case: (spoil: a replacement for d, or None after editing d in place; what the error says)
    "not a dict": (lambda d: "gru", "not a stored cell graph (no format 'rnngraph-cell')"),
    "other format": (lambda d: {**d, "format": "x"}, "not a stored cell graph"),
    "newer version": (lambda d: {**d, "version": 2}, "stored cell graph 'gru' has format version 2; this rnngraph "
                                                    "reads version 1; upgrade rnngraph"),
    "unknown op": (lambda d: _node(d, "n").update(op="gelu"), "unknown op 'gelu'"),
    "missing key": (lambda d: {k: v for k, v in d.items() if k != "edges"}, "stored cell graph 'gru' is malformed: KeyError: 'edges'"),
    "string size": (lambda d: _node(d, "n").update(size="16"), "size of node 'n' must be an integer ≥ 1, got '16'"),
    "size off": (lambda d: _node(d, "n").update(size=15), "tanh node 'n': its inputs make 16 features, not 15"),
    "weight shape": (lambda d: _node(d, "W_ir").update(attrs=[16, 6]),
                     "linear node 'linear1': input has 5 features but the weight is [16, 6] (expects 6 inputs)"),
    "edge to nowhere": (lambda d: d["edges"][0].update(dst="ghost"), "joins a node that is not listed"),
    "slot gap": (lambda d: next(e for e in d["edges"] if e["dst"] == "r" and e["slot"] == 0).update(slot=3),
                 "sigmoid node 'r' reads slots [3]"),
    "delay from a non-state": (lambda d: next(e for e in d["edges"] if e["src"] == "x").update(delay=1),
                               "reads 'x' 1 frames back, but 'x' is no state"),
    "algebraic loop": (lambda d: any(e.update(delay=0) for e in d["edges"]),
                       "algebraic loop in cell 'gru'"),
    "wrong producer": (lambda d: d["states"][0].update(producer="r", size=7), "state 'h' [7] names producer 'r'"),
    "params": (lambda d: d["params"].update(W_ir=[16, 6]), "its params"),
    "layout": (lambda d: d["layout"].update(weight_ih=["W_xx"]), "layout names unknown parameters ['W_xx']"),
    "duplicate node": (lambda d: d["nodes"].append(dict(d["nodes"][0])), "node 'x' is listed twice"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_data_is_one_clear_error(case):
    spoil, message = BAD[case]
    d = cell_to_dict(load_cell("gru", 5, 16))
    with pytest.raises(RnnGraphError) as e:
        cell_from_dict(spoil(d) or d)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_first_difference_names_the_first_changed_node():
    def mgu(act):
        c = Cell("mgu")
        x, h = c.input("x", 3), c.state("h", 4)
        n = getattr(c, act)(c.linear(x, "W", 4) + c.linear(h, "U", 4), name="n")
        c.output(c.bind(h, n * 0.5, name="h"))
        return c.build()
    assert first_difference(mgu("relu"), mgu("tanh"), "mycells:mgu", "the checkpoint") == \
        "node 'n' is relu in mycells:mgu but tanh in the checkpoint"
    assert first_difference(load_cell("lstm", 5, 8), load_cell("lstm", 5, 16), "a", "b") == \
        "node 'W_ii' has 8 features in a but 16 in b"
    assert first_difference(small_rnn(2), small_rnn(3), "a", "b") == "node 'mix' reads (h@t-2) in a but (h@t-3) in b"


def small_rnn(delay):
    c = Cell("tiny")
    x, h = c.input("x", 3), c.state("h", 4)
    m = c.identity(h.ago(delay), name="mix")
    c.output(c.bind(h, c.tanh(c.linear(x, "W", 4) + m), name="h"))
    return c.build()


def test_recurrent_takes_one_cell_per_layer():
    cells = [load_cell("gru", 5, 8), load_cell("gru", 8, 8)]
    x = np.random.default_rng(0).standard_normal((4, 2, 5)).astype(np.float32)
    assert np.array_equal(nn.Recurrent(cells, 5, 8, num_layers=2)(x)[0], nn.Recurrent("gru", 5, 8, num_layers=2)(x)[0])
    with pytest.raises(RnnGraphError, match=r"a list of cells needs one cell per layer: got 2 for num_layers=3"):
        nn.Recurrent(cells, 5, 8, num_layers=3)


# -- checkpoints ----------------------------------------------------------------------------------

def tiny(small_text, out, **kw):
    return TrainConfig(**{**dict(text=str(small_text), hidden=8, streams=2, bptt=4, max_steps=3, backend="numpy",
                                 progress=False, out=str(out)), **kw})


def start(*args, cwd, path=()) -> subprocess.Popen:
    """`python -m rnngraph ARGS` started in `cwd`, with `path` (and rnngraph) importable."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, path), str(ROOT)]))
    return subprocess.Popen([sys.executable, "-m", "rnngraph", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def rnngraph(*args, cwd, path=()) -> subprocess.CompletedProcess:
    p = start(*args, cwd=cwd, path=path)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_a_changed_user_cell_runs_the_stored_graph_and_imports_nothing(small_text, tmp_path):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    (work / "small.txt").write_text(small_text.read_text())
    (work / "mycells.py").write_text(MGU)
    run = ["train", "--cell", "mycells:mgu", "--hidden", "8", "--streams", "2", "--bptt", "4", "--text", "small.txt",
           "--backend", "numpy", "--no-progress"]
    runs = [start(*run, "--out", out, "--max-steps", steps, cwd=work) for out, steps in (("run", "3"), ("full", "4"))]
    for p in runs:
        p.communicate(timeout=120)
    assert [p.returncode for p in runs] == [0, 0]
    ckpt = str(work / "run" / "checkpoint.npz")
    sample = ["sample", ckpt, "--length", "40", "--backend", "numpy"]
    before = rnngraph(*sample, cwd=work)
    assert before.returncode == 0 and len(before.stdout) == 41

    # tanh -> relu, and importing the module now fails loudly: nothing below may import it
    (work / "mycells.py").write_text("raise ImportError('mycells was imported')\n" + MGU.replace("c.tanh", "c.relu"))
    after = rnngraph(*sample, cwd=elsewhere, path=[work])
    assert after.returncode == 0 and after.stdout == before.stdout
    assert after.stderr == f"rnngraph: running the graph of mycells:mgu stored in checkpoint {ckpt} (its module " \
                           "is not imported)\n"
    resumed = rnngraph("train", "--resume", ckpt, "--max-steps", "4", cwd=elsewhere, path=[work])   # relative --text
    assert resumed.returncode == 0, resumed.stderr
    assert np.array_equal(read_log(work / "run")["loss"], read_log(work / "full")["loss"])           # steps 1-4

    (work / "mycells.py").write_text(MGU.replace("c.tanh", "c.relu"))
    kept = Path(ckpt).read_bytes()
    for cmd in (["train", "--resume", ckpt, "--max-steps", "5"], sample):
        refused = rnngraph(*cmd, "--cell", "mycells:mgu", cwd=work)
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr == (f"rnngraph: error: cell mycells:mgu differs from the one checkpoint {ckpt} was "
                                  "trained with: node 'n' is relu in mycells:mgu but tanh in the checkpoint; drop "
                                  "--cell to continue with the stored graph, or train the new cell in a new run\n")
    assert Path(ckpt).read_bytes() == kept


def test_the_checkpoint_stores_the_graphs_as_plain_json(small_text, tmp_path):
    train(tiny(small_text, tmp_path, layers=2, cell="gru"), echo=lambda *a: None)
    got = ck.load_checkpoint(tmp_path / "checkpoint.npz")       # arrays read with allow_pickle=False
    graphs = got.config["model"]["graphs"]
    assert got.config["version"] == 2 and plain(got.config)
    assert [next(iter(g["inputs"].values())) for g in graphs] == [got.config["model"]["vocab_size"], 8]
    assert_same(load_cell("gru", 8, 8), cell_from_dict(graphs[1]))
    assert got.config["train"]["text"] == str(small_text.resolve())


def test_a_changed_builtin_cell_is_noted_and_the_stored_graph_runs(small_text, tmp_path, monkeypatch, capsys):
    train(tiny(small_text, tmp_path), echo=lambda *a: None)
    ckpt = tmp_path / "checkpoint.npz"
    expected = generate(*load_model(ckpt, "numpy"), "Th", 30)

    def changed(input_size, hidden_size, bias=True):           # the lstm of some other rnngraph version
        c = Cell("lstm")
        x, h, cs = c.input("x", input_size), c.state("h", hidden_size), c.state("c", hidden_size)
        g = c.relu(c.linear(x, "W", hidden_size) + c.linear(h, "U", hidden_size), name="i")
        c.bind(cs, g * cs, name="c")
        c.output(c.bind(h, g, name="h"))
        return c.build()

    monkeypatch.setitem(CELLS, "lstm", (changed, "changed"))
    capsys.readouterr()
    assert generate(*load_model(ckpt, "numpy"), "Th", 30) == expected
    assert capsys.readouterr().err == (f"rnngraph: the built-in cell lstm now builds another graph than checkpoint "
                                       f"{ckpt} stores (node 1 is 'W' (param) in lstm but 'W_ii' (param) in the "
                                       "checkpoint); running the stored graph\n")


def version_1(ckpt, path):
    """A copy of checkpoint `ckpt` as rnngraph wrote it before cell graphs were stored."""
    got = ck.load_checkpoint(ckpt)
    del got.config["model"]["graphs"]
    return ck.save_checkpoint(path, {**got.config, "version": 1}, got.arrays)


def test_version_1_checkpoints(small_text, tmp_path, monkeypatch, capsys):
    train(tiny(small_text, tmp_path / "lstm"), echo=lambda *a: None)
    old = version_1(tmp_path / "lstm" / "checkpoint.npz", tmp_path / "old.npz")
    capsys.readouterr()
    assert main(["sample", str(old), "--length", "5", "--backend", "numpy"]) == 0
    assert capsys.readouterr().err == (f"rnngraph: checkpoint {old} predates stored cell graphs; building the cell "
                                       "lstm from rnngraph\n")

    (tmp_path / "v1cells.py").write_text(MGU)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    train(tiny(small_text, tmp_path / "user", cell="v1cells:mgu"), echo=lambda *a: None)
    old = version_1(tmp_path / "user" / "checkpoint.npz", tmp_path / "user" / "checkpoint.npz")
    capsys.readouterr()
    for argv in (["sample", str(old)], ["train", "--resume", str(old)]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (f"rnngraph: error: checkpoint {old} predates stored cell graphs: it names "
                                           "the cell v1cells:mgu but does not hold it, and loading a checkpoint imports "
                                           "no module by itself; if v1cells still holds the cell this run was trained "
                                           "with, pass --cell v1cells:mgu to build it from there\n")
    assert main(["sample", str(old), "--cell", "gru"]) == 2
    assert capsys.readouterr().err == (f"rnngraph: error: --cell gru is not the cell of checkpoint {old} (v1cells:mgu); "
                                       "drop --cell to run the cell the checkpoint stores\n")
    assert main(["sample", str(old), "--cell", "v1cells:mgu", "--length", "5", "--backend", "numpy"]) == 0
    assert main(["train", "--resume", str(old), "--cell", "v1cells:mgu", "--max-steps", "4", "--no-progress"]) == 0
    assert ck.load_checkpoint(old).config["version"] == 2 and read_log(tmp_path / "user")["step"][-1] == 4


def test_resume_from_another_directory_with_a_relative_text(small_text, tmp_path, monkeypatch, capsys):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    (tmp_path / "a" / "small.txt").write_text(small_text.read_text())
    monkeypatch.chdir(tmp_path / "a")
    assert main(["train", "--text", "small.txt", "--hidden", "8", "--streams", "2", "--bptt", "4", "--max-steps", "2",
                 "--backend", "numpy", "--out", "run", "--no-progress"]) == 0
    monkeypatch.chdir(tmp_path / "b")
    assert main(["train", "--resume", str(tmp_path / "a" / "run" / "checkpoint.npz"), "--max-steps", "3"]) == 0
    assert "done: 3 steps" in capsys.readouterr().out
