"""The command line: `cells`, `schedule` (text, --json, --draw), --help everywhere, one-line errors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rnngraph as package
from rnngraph import CELLS, build_schedule, load_cell
from rnngraph.lab.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]


def rnngraph(*args, cwd=ROOT):
    """`python -m rnngraph ARGS` in a fresh process, with this checkout importable."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "rnngraph", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cells_lists_every_builtin_with_its_description(capsys):
    assert main(["cells"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(CELLS)
    for line, (_, description) in zip(lines, CELLS.values()):
        assert line.endswith("  " + description)


def test_schedule_prints_the_schedule(capsys):
    assert main(["schedule", "lstm", "--input-size", "8", "--hidden-size", "16"]) == 0
    out = capsys.readouterr().out
    assert out == str(build_schedule(load_cell("lstm", 8, 16))) + "\n"
    assert "x · [W_ii; W_if; W_ig; W_io]ᵀ   -> [64]" in out
    assert out.splitlines()[-1] == "  kernels per frame: forward 25 -> 2, backward 45 -> 2"


def test_schedule_json_keys(capsys):
    assert main(["schedule", "gru", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert {"cell", "hoisted", "per_frame_stages", "merged_gemms", "fused_groups",
            "kernels_per_frame"} <= set(s)
    assert s["cell"] == "gru"
    assert s["kernels_per_frame"] == {"forward": {"before_merge": 20, "after_merge": 2},
                                      "backward": {"before_merge": 36, "after_merge": 2}}
    assert all(isinstance(stage, list) for stage in s["per_frame_stages"])


def test_schedule_draw_writes_a_png(tmp_path, capsys):
    path = tmp_path / "lstm.png"
    assert main(["schedule", "lstm", "--draw", str(path)]) == 0
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert f"drew {path}" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(CELLS))
def test_every_builtin_draws(name, tmp_path, capsys):
    assert main(["schedule", name, "--draw", str(tmp_path / f"{name}.png"), "--json"]) == 0
    json.loads(capsys.readouterr().out)                       # --draw keeps stdout pure JSON
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_on_every_subcommand(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: rnngraph {command}")


def test_top_level_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_unknown_cell_exits_2_with_one_line():
    r = rnngraph("schedule", "no_such_cell")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("rnngraph: error: unknown cell 'no_such_cell'; built-in cells: lstm")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_invalid_user_cell_exits_2_with_one_line(tmp_path):
    (tmp_path / "badcells.py").write_text(
        "from rnngraph import Cell\n\n"
        "def bad(input_size, hidden_size):\n"
        "    c = Cell('bad')\n"
        "    x = c.input('x', input_size)\n"
        "    c.output(c.add(x, c.linear(x, 'W', hidden_size), name='z'))\n"
        "    return c.build()\n")
    r = rnngraph("schedule", "badcells:bad", "--input-size", "3", "--hidden-size", "5", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("rnngraph: error: shape mismatch in add op 'z'")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_user_cell_from_module_function(tmp_path):
    (tmp_path / "goodcells.py").write_text(
        "from rnngraph import Cell\n\n"
        "def elman(input_size, hidden_size):\n"
        "    c = Cell('elman')\n"
        "    x, h = c.input('x', input_size), c.state('h', hidden_size)\n"
        "    pre = c.linear(x, 'W', hidden_size) + c.linear(h, 'U', hidden_size)\n"
        "    c.output(c.bind(h, c.tanh(pre), name='h'))\n"
        "    return c.build()\n")
    r = rnngraph("schedule", "goodcells:elman", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cell"] == "elman"


def test_missing_module_exits_2(tmp_path):
    r = rnngraph("schedule", "nowhere:cell", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == "rnngraph: error: cannot import cell module 'nowhere': " \
                       "ModuleNotFoundError: No module named 'nowhere'\n"


def test_unwritable_draw_path_exits_2(tmp_path, capsys):
    assert main(["schedule", "lstm", "--draw", str(tmp_path / "missing" / "dir" / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rnngraph: error: cannot write ") and err.count("\n") == 1


def test_bad_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["schedule", "lstm", "--hidden-size", "0"])
    assert e.value.code == 2
    assert "must be a positive integer" in capsys.readouterr().err


def test_import_rnngraph_exposes_its_subpackages_without_heavy_imports():
    code = ("import sys, rnngraph\n"
            "assert not {'torch', 'cupy', 'matplotlib', 'rnngraph.nn'} & set(sys.modules), sys.modules.keys()\n"
            "print(rnngraph.nn.LSTM.__name__, rnngraph.optim.Adam.__name__, rnngraph.losses.MSELoss.__name__,\n"
            "      rnngraph.layers.Dense.__name__)\n"
            "from rnngraph.optim import Adam\n"
            "import rnngraph.layers, rnngraph.nn.layers\n"
            "assert rnngraph.layers.Dense is rnngraph.nn.layers.Dense and Adam is rnngraph.nn.optim.Adam\n"
            "assert not {'torch', 'cupy', 'matplotlib'} & set(sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "LSTM Adam MSELoss Dense\n"
    with pytest.raises(AttributeError, match="module 'rnngraph' has no attribute 'nope'"):
        package.nope


def test_a_user_cell_module_is_found_in_the_working_folder_without_staying_on_sys_path(tmp_path, monkeypatch):
    (tmp_path / "cwdcells.py").write_text("from rnngraph.ir.cells import gru as cell\n")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    assert package.load_cell("cwdcells:cell", 3, 4).name == "gru"
    assert sys.path == before


def test_a_signal_as_the_command_ends_only_counts():
    """A SIGTERM delivered while the command's handlers are being restored (a launcher stopping a rank that is
    already ending) raises nothing there: the command's own exit status stands."""
    import signal
    from rnngraph.lab.cli import _signals_as_ctrl_c
    with _signals_as_ctrl_c() as received:
        handler = signal.getsignal(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGTERM, None)           # while the command runs: as Ctrl-C
    handler(signal.SIGTERM, None)                   # after it ended: recorded, not raised
    assert received[-2:] == [signal.SIGTERM, signal.SIGTERM]
