"""The catalogue of bad inputs (issue 10): each one line `rnngraph: error: ...` (exit 2) or, for Ctrl-C,
`rnngraph: interrupted; ...` (exit 130) on the command line, one-line RnnGraphError in Python, no traceback,
and no file in the working folder changed or added."""
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from rnngraph import Cell, RnnGraphError, build_schedule, load_cell, nn
from rnngraph.lab.cli import main
from rnngraph.nn.layers import Dense, Sequential

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ("--text", "small.txt", "--hidden", "16", "--streams", "2", "--bptt", "8", "--no-progress")

CELLS = '''from rnngraph import Cell
from rnngraph.ir.cells import lstm

def raises(input_size, hidden_size):
    return {}["no such key"]

def no_sizes():
    pass

not_a_function = 3

def zero_state(input_size, hidden_size):
    c = Cell("zero")
    x, h = c.input("x", input_size), c.state("h", 0)
    c.output(c.bind(h, c.tanh(c.linear(x, "W", 0)), name="h"))
    return c.build()

def half(input_size, hidden_size):
    return lstm(input_size, hidden_size // 2)

def bad_shapes(input_size, hidden_size):
    c = Cell("bad")
    x = c.input("x", input_size)
    c.output(c.add(x, c.linear(x, "W", hidden_size), name="z"))
    return c.build()
'''


@dataclass
class Row:
    expect: str                         # a fragment of the one line (CLI) and of the message (API)
    argv: tuple = ()                    # `rnngraph ARGV` in the working folder; () for an API-only row
    api: Callable | None = None         # raises RnnGraphError, run in the working folder
    status: int = 2
    interrupt: str | None = None        # "module:attr" made to raise KeyboardInterrupt, for a Ctrl-C row
    real: bool = False                  # in a real process (a real SIGINT for status 130)
    absent: str | None = None           # must not be in the message (a misleading hint)


def cell_api(spec):
    return lambda: load_cell(spec, 3, 4)


def builder(method, *args):
    return lambda: getattr(Cell("c"), method)(*args)


def linear_api(out):
    def fn():
        c = Cell("c")
        c.linear(c.input("x", 3), "W", out)
    return fn


def slice_api():
    c = Cell("c")
    c.slice(c.input("x", 3), 0.5, 2)


def draw_api(path):
    from rnngraph.lab.drawing import draw_schedule
    return lambda: draw_schedule(build_schedule(load_cell("lstm", 3, 4)), path)


def layer_call(x, **kw):
    return lambda: nn.LSTM(3, 4, **kw)(x)


def load_api(model, d):
    return lambda: model().load_state_dict(d)


def sequential():
    return Sequential(nn.LSTM(3, 4), Dense(4, 2))


CATALOGUE = {
    # -- issue 10, "Tracebacks where one line is promised" ------------------------------------
    "cell function raises": Row("cell function 'mycells:raises' raised KeyError: 'no such key', at ",
                                ("schedule", "mycells:raises"), cell_api("mycells:raises")),
    "cell function wrong signature": Row("cell function 'mycells:no_sizes' must take (input_size, hidden_size",
                                         ("schedule", "mycells:no_sizes"), cell_api("mycells:no_sizes")),
    "cell function not callable": Row("'mycells:not_a_function' is not callable (type int)",
                                      ("schedule", "mycells:not_a_function"), cell_api("mycells:not_a_function")),
    "os:getcwd": Row("cell function 'os:getcwd' must take (input_size, hidden_size", ("schedule", "os:getcwd"),
                     cell_api("os:getcwd")),
    "returns a non-cell": Row("cell function 'operator:add' returned int, not a CellGraph",
                              ("schedule", "operator:add"), cell_api("operator:add")),
    "train --cell raises": Row("cell function 'mycells:raises' raised KeyError",
                               ("train", "--cell", "mycells:raises", "--out", "new", *TRAIN), real=True),
    "bench --cell raises": Row("cell function 'mycells:raises' raised KeyError",
                               ("bench", "--quick", "--impls", "staged", "--cell", "mycells:raises")),
    "missing cell file": Row("cell file 'nothere.py' not found (in ", ("schedule", "nothere.py:half"),
                             cell_api("nothere.py:half")),
    "hidden size 0 in a layer": Row("size of state 'h' of cell 'zero' must be a positive integer, got 0",
                                    ("schedule", "mycells:zero_state"),
                                    lambda: nn.Recurrent("mycells:zero_state", 3, 4)),
    "train builds size 0": Row("size of state 'h' of cell 'lstm' must be a positive integer, got 0",
                               ("train", "--cell", "mycells:half", "--out", "new", *TRAIN[:2], "--hidden", "1")),
    "build() float size": Row("size of input 'x' of cell 'c' must be a positive integer, got 2.5",
                              api=builder("input", "x", 2.5)),
    "build() negative size": Row("size of state 'h' of cell 'c' must be a positive integer, got -1",
                                 api=builder("state", "h", -1)),
    "build() bool size": Row("shape of parameter 'W' of cell 'c' must be a positive integer, got True",
                             api=builder("param", "W", (True, 3))),
    "build() zero out_features": Row("out_features of linear 'W' in cell 'c' must be a positive integer, got 0",
                                     api=linear_api(0)),
    "build() float slice": Row("slice start in cell 'c' must be an integer ≥ 0, got 0.5", api=slice_api),
    "--draw x.txt": Row("cannot draw to 'x.txt': the file name must end in an image format",
                        ("schedule", "lstm", "--draw", "x.txt"), draw_api("x.txt")),
    "--draw ''": Row("cannot draw to '': the file name must end in an image format",
                     ("schedule", "lstm", "--draw", ""), draw_api("")),
    "bench --json unwritable": Row("--json", ("bench", "--quick", "--impls", "staged", "--json",
                                              "/nonexistent/x.json")),
    "experiment --out unwritable": Row("existing.txt", ("experiment", "schedule_stats", "--quick", "--out",
                                                        "existing.txt/results")),
    "figures --out unwritable": Row("existing.txt", ("figures", "--out", "existing.txt/figures")),
    "train --hidden 1000000": Row("out of memory: Unable to allocate 14.6 TiB for an array with shape (4000000, "
                                  "1000000)", ("train", "--hidden", "1000000", "--out", "new")),
    "Ctrl-C in schedule": Row("interrupted; nothing was written", ("schedule", "lstm"), status=130,
                              interrupt="rnngraph.lab.cli:build_schedule"),
    "Ctrl-C in demo": Row("interrupted; nothing was saved in new", ("demo", "--quick", "--out", "new",
                                                                    "--backend", "numpy"),
                          status=130, interrupt="rnngraph.lab.demo:train"),
    "Ctrl-C in sample": Row("interrupted; kept the 0 of --length 50 characters", ("sample", "run/checkpoint.npz",
                                                                                 "--length", "50"),
                            status=130, interrupt="rnngraph.train.sample:generate"),
    "Ctrl-C in experiment": Row("interrupted; schedule_stats stopped after", ("experiment", "schedule_stats",
                                                                              "--quick", "--out", "new"),
                                status=130, interrupt="rnngraph.lab.bench:machine_info"),
    "Ctrl-C in figures": Row("interrupted; no figure was written", ("figures", "--out", "new"), status=130,
                             interrupt="rnngraph.lab.figures:draw_figures"),
    "Ctrl-C in bench": Row("interrupted; no measurements were kept", ("bench", "--quick", "--impls", "staged"),
                           status=130, interrupt="rnngraph.lab.bench:machine_info"),
    "real SIGINT in sample": Row("interrupted; kept the ", ("sample", "run/checkpoint.npz", "--length", "100000",
                                                            "--backend", "numpy"), status=130, real=True),
    "load_state_dict(None)": Row("cannot load state dict into LSTM: expected a dict of name -> array",
                                 api=load_api(lambda: nn.LSTM(3, 4), None)),
    "load_state_dict(list)": Row("cannot load state dict into Sequential: expected a dict of name -> array "
                                 "(as state_dict() returns), got list", api=load_api(sequential, [1])),
    "load_state_dict non-array": Row("values must be arrays (numpy, cupy or torch), got str for weight_ih_l0",
                                     api=load_api(lambda: nn.LSTM(3, 4), {"weight_ih_l0": "W"})),
    "int64 x": Row("x has dtype int64 but the layer is float32; convert with x.astype('float32')",
                   api=layer_call(np.zeros((2, 1, 3), np.int64)), absent="dtype='int64'"),
    "float16 x": Row("convert with x.astype('float64') (layers take only float32 or float64 arrays)",
                     api=layer_call(np.zeros((2, 1, 3), np.float16), dtype="float64"), absent="dtype='float16'"),
    # -- already handled before issue 10 ----------------------------------------------------------
    "unknown cell": Row("unknown cell 'no_such_cell'; built-in cells: lstm", ("schedule", "no_such_cell"),
                        cell_api("no_such_cell")),
    "missing cell module": Row("cannot import cell module 'nowhere': ModuleNotFoundError",
                               ("schedule", "nowhere:cell"), cell_api("nowhere:cell")),
    "user cell shape mismatch": Row("shape mismatch in add op 'z'", ("schedule", "mycells:bad_shapes"),
                                    cell_api("mycells:bad_shapes")),
    "--draw unwritable": Row("cannot write missing/x.png", ("schedule", "lstm", "--draw", "missing/x.png")),
    "resume into another run": Row("other/checkpoint.npz holds a checkpoint of another run",
                                   ("train", "--resume", "run/checkpoint.npz", "--out", "other")),
    "demo into a training run": Row("run/checkpoint.npz holds a checkpoint of a training run",
                                    ("demo", "--quick", "--out", "run", "--backend", "numpy")),
    "train --out ''": Row("--out is empty", ("train", "--out", "", *TRAIN)),
    "train into another run": Row("run/checkpoint.npz already holds a checkpoint",
                                  ("train", "--out", "run", "--max-steps", "1", *TRAIN)),
    "resume with another model": Row("does not match the requested model",
                                     ("train", "--resume", "run/checkpoint.npz", "--hidden", "64")),
    "resume missing checkpoint": Row("checkpoint", ("train", "--resume", "none.npz")),
    "sample missing checkpoint": Row("checkpoint none.npz not found", ("sample", "none.npz")),
    "truncated checkpoint": Row("checkpoint truncated.npz is truncated or corrupt", ("sample", "truncated.npz")),
    "empty text": Row("text file", ("train", "--out", "new", *TRAIN[2:], "--text", "empty.txt")),
    "text not UTF-8": Row("text file latin.txt is not UTF-8: byte 0xe9 at offset 3",
                          ("train", "--out", "new", *TRAIN[2:], "--text", "latin.txt")),
    "dropout 1.5": Row("--dropout must lie in [0, 1), got 1.5",
                       ("train", "--out", "new", "--dropout", "1.5", *TRAIN)),
    "bptt too large": Row("--bptt 20000 is larger than the data allows",
                          ("train", "--out", "new", *TRAIN[:-3], "--bptt", "20000")),
    "x of rank 2": Row("x must be 3-D [T, B, D] (batch_first=False), got 2-D shape [2, 3]",
                       api=layer_call(np.zeros((2, 3), np.float32))),
    "layer hidden_size 0": Row("hidden_size must be a positive integer, got 0", api=lambda: nn.GRU(3, 0)),
    "layer of an unknown cell": Row("unknown cell 'nope'", api=lambda: nn.Recurrent("nope", 3, 4)),
    "Dense size 0": Row("Dense needs positive sizes", api=lambda: Dense(0, 3)),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The working folder every row starts from: user cells, texts, a trained run, a truncated checkpoint."""
    from rnngraph.train.data import read_text
    d = tmp_path_factory.mktemp("catalogue")
    (d / "mycells.py").write_text(CELLS)
    (d / "small.txt").write_text(read_text()[:6000])
    (d / "empty.txt").write_text("")
    (d / "latin.txt").write_bytes(b"caf\xe9\n")
    (d / "existing.txt").write_text("a file, not a folder\n")
    (d / "x.txt").write_text("not an image\n")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        for run in ("run", "other"):
            assert main(["train", "--out", run, "--max-steps", "2", *TRAIN]) == 0
    finally:
        os.chdir(cwd)
    (d / "truncated.npz").write_bytes((d / "run" / "checkpoint.npz").read_bytes()[:3000])
    return d


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def run_cli(row: Row, monkeypatch, capsys):
    if row.interrupt:
        module, attr = row.interrupt.split(":")

        def ctrl_c(*args, **kw):
            raise KeyboardInterrupt
        monkeypatch.setattr(f"{module}.{attr}", ctrl_c)
    status = main(list(row.argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_real(row: Row, cwd: Path):
    """`python -m rnngraph ARGV`; for status 130 a real SIGINT once the command has printed something."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-m", "rnngraph", *row.argv], cwd=cwd, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if row.status == 130:
        p.stdout.read(20)                 # the command is running, past its imports
        p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_catalogue(name, template, tmp_path, monkeypatch, capsys):
    row = CATALOGUE[name]
    shutil.copytree(template, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mycells", raising=False)
    before = snapshot(tmp_path)
    if row.argv:
        status, out, err = run_real(row, tmp_path) if row.real else run_cli(row, monkeypatch, capsys)
        start = "rnngraph: interrupted; " if row.status == 130 else "rnngraph: error: "
        assert err.startswith(start) and err.count("\n") == 1, f"stderr must be one line {start}...; got {err!r}"
        assert row.expect in err, err
        assert status == row.status, (status, err)
        assert "Traceback" not in out + err
    if row.api:
        with pytest.raises(RnnGraphError) as e:
            row.api()
        assert row.expect in str(e.value) and "\n" not in str(e.value), str(e.value)
        err = str(e.value)
    assert row.absent is None or row.absent not in err
    after = snapshot(tmp_path)
    changed = sorted(str(k) for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"files changed or added in the working folder: {changed}"
