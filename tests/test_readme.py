"""README.md cannot drift: its custom cell is executed and every transcript in it is re-run."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from numerics import needs_torch
from rnngraph import CELLS, CellGraph, build_schedule

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def transcripts():
    """(command, expected stdout) for every `$ command` line of the README's console blocks."""
    out = []
    for block in blocks("console"):
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = chunk.partition("\n")
            out.append((command, output))
    return out


@pytest.fixture
def mycells(tmp_path):
    """The README's custom-cell example, saved as mycells.py as the README says."""
    (tmp_path / "mycells.py").write_text(blocks("python")[0])
    return tmp_path


def test_custom_cell_example_builds_the_builtin_mgu():
    namespace = {"__name__": "readme"}
    exec(blocks("python")[0], namespace)
    cell = namespace["mgu"](32, 64)
    assert isinstance(cell, CellGraph) and "mgu" in CELLS
    s = build_schedule(cell)
    assert s.summary() == build_schedule(CELLS["mgu"][0](32, 64)).summary()
    assert [len(stage) for stage in s.loop] == [1, 1, 1, 1]         # the four stages the README explains
    assert s.pre[0].weights == ("W_f", "W_n")


@needs_torch
def test_layers_example_runs_matches_torch_and_learns():
    namespace = {"__name__": "readme"}
    exec(blocks("python")[1], namespace)          # asserts y == torch's y itself
    assert float(namespace["loss"]) < 1.0         # from about ln 5 = 1.61 after 20 Adam steps


@pytest.mark.parametrize("command, expected", transcripts(), ids=[c for c, _ in transcripts()])
def test_readme_transcript(command, expected, mycells):
    program, *args = shlex.split(command)
    argv = {"rnngraph": [sys.executable, "-m", "rnngraph"], "python": [sys.executable]}[program]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(argv + args, cwd=mycells, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected


def test_quick_start_matches_ci():
    (setup,) = [b for b in blocks("bash") if "pip install" in b]
    install = re.search(r'pip install -e "\.\[test\]"', setup).group(0)
    assert "rnngraph demo" in setup and "\npytest -q" in "\n" + setup
    ci = (ROOT / ".ci" / "run").read_text()
    assert install in ci and re.search(r"^pytest -q\b", ci, re.M)


def test_readme_figure_exists():
    for path in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README):
        assert (ROOT / path).stat().st_size > 10_000


def test_cpu_training_numbers_come_from_the_committed_log():
    from rnngraph.train.loop import read_log
    log = read_log(ROOT / "experiments" / "results" / "training_cpu_default")
    text = " ".join(README.split())
    ends = [k for k, v in enumerate(log["val_bpc"]) if v == v]               # the epoch ends
    for k in ends:
        row = (f"| {log['step'][k]:.0f} | {log['epoch'][k]:.0f} | {log['bpc'][k]:.3f} | {log['val_bpc'][k]:.3f} "
               f"| {log['frames_per_s'][k]:,.0f} | {log['elapsed_s'][k]:.0f} s |")
        assert row in text, row
    steps, seconds, val = log["step"][-1], log["elapsed_s"][-1], log["val_bpc"][-1]
    chars = steps * 32 * 32                                                    # the default streams × bptt
    assert (f"validation bpc of {val:.3f}** after {steps:,.0f} steps and {seconds:.0f} s of training "
            f"({log['val_bpc'][ends[0]]:.3f} after the first epoch), about {round(chars / seconds, -2):,.0f} "
            "characters per second") in text
    assert f"{val:.3f} in {seconds:.0f} s for the CPU default" in text


def test_demo_numbers_come_from_its_committed_output():
    out = (ROOT / "experiments" / "results" / "demo_cpu" / "output.txt").read_text()
    seconds = re.search(r"rnngraph demo: done in (\d+) s", out).group(1)
    val = re.search(r"validation bpc (\d\.\d{3}) after", out).group(1)
    assert f"It took {seconds} s on two CPU cores, reaching a validation bpc of {val}" in " ".join(README.split())
