"""The experiments: every --quick run writes well-formed results; the analyses count exactly."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rnngraph import RnnGraphError, build_schedule, load_cell
from rnngraph.backends import get_backend
from rnngraph.executor import Executor
from rnngraph.experiments import (EXPERIMENTS, QUICK_LABEL, load_results, run_experiment, schedule_flops,
                                  schedule_variants, wavefront_lstm)
from rnngraph.schedule import Gemm

ROOT = Path(__file__).resolve().parents[1]
META = ("gpu", "cuda_driver", "cuda_runtime", "cupy", "numpy", "commit", "date", "command")


def _run(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _check(doc, name):
    """Well-formed quick results: metadata, a record per configuration, measured or skipped with a reason."""
    exp = EXPERIMENTS[name]
    assert doc["experiment"] == name and doc["quick"] is True
    assert doc["label"] == (QUICK_LABEL if exp.timed else "schedule analysis: no timing, the same on any machine")
    assert set(META) <= set(doc["metadata"])
    grid = exp.grid(True)
    assert len(doc["records"]) == len(grid)
    for cfg, r in zip(grid, doc["records"]):
        assert {k: r[k] for k in cfg} == json.loads(json.dumps(cfg))
        assert "failed" not in r, r
        if "skipped" in r:
            assert isinstance(r["skipped"], str) and r["skipped"]
        else:
            assert set(exp.fields) <= set(r)
    assert any("skipped" not in r for r in doc["records"])    # something was measured on the CPU


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n != "single_stream_speedup"])
def test_quick_run_writes_well_formed_results(name, tmp_path):
    path, failed = run_experiment(name, quick=True, out=tmp_path, command="test")
    assert path == tmp_path / f"{name}.json" and failed == 0
    doc = load_results(path)
    _check(doc, name)
    assert doc["metadata"]["command"] == "test"


def test_script_runs_quick_and_records_its_command(tmp_path):
    res = _run("experiments/single_stream_speedup.py", "--quick", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "single_stream_speedup" in res.stderr                    # the progress bar
    doc = load_results(tmp_path / "single_stream_speedup.json")
    _check(doc, "single_stream_speedup")
    assert doc["metadata"]["command"] == f"python experiments/single_stream_speedup.py --quick --out {tmp_path}"
    graph = [r for r in doc["records"] if r["impl"] == "graph"]
    if doc["metadata"]["gpu"] is None:                              # CPU numbers are never GPU numbers
        assert all("skipped" in r for r in graph)
    staged = [r for r in doc["records"] if r["impl"] == "staged"]
    assert all(r["forward_ms"] > 0 and r["train_ms"] > 0 and len(r["train_all"]) == 3 for r in staged)


def test_cli_runs_an_experiment(tmp_path):
    res = _run("-m", "rnngraph", "experiment", "schedule_stats", "--quick", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"wrote {tmp_path / 'schedule_stats.json'}"
    assert load_results(tmp_path / "schedule_stats.json")["metadata"]["command"].startswith(
        "python -m rnngraph experiment schedule_stats --quick")
    bad = _run("-m", "rnngraph", "experiment", "no_such_experiment")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_committed_results_are_well_formed():
    for path in sorted((ROOT / "experiments" / "results" / "quick").glob("*.json")):
        _check(load_results(path), path.stem)
    stats = load_results(ROOT / "experiments" / "results" / "schedule_stats.json")
    exp = EXPERIMENTS["schedule_stats"]
    assert stats["records"] == json.loads(json.dumps([dict(cfg, **exp.run(cfg, {})) for cfg in exp.grid(False)]))


@pytest.mark.parametrize("change, message", [
    (None, "missing results file"),
    ("{not json", "not JSON"),
    ('{"experiment": "schedule_stats"}', "no quick, label, metadata, records"),
    ('{"experiment": "x", "quick": 1, "label": "", "metadata": {}, "records": [{"cell": "lstm"}]}',
     "non-empty list of records"),
    ('{"experiment": "schedule_stats", "quick": 1, "label": "", "metadata": {}, "records": [{"cell": "lstm"}]}',
     "record 0 lacks ops, stages_per_frame"),
])
def test_load_results_names_the_bad_file(tmp_path, change, message):
    path = tmp_path / "schedule_stats.json"
    if change is not None:
        path.write_text(change)
    with pytest.raises(RnnGraphError, match=message) as e:
        load_results(path)
    assert str(path) in str(e.value) and "rerun `rnngraph experiment schedule_stats`" in str(e.value)


# -- the analyses ----------------------------------------------------------------------------------

def test_flops_of_an_elman_rnn_exactly():
    """rnn_tanh, D = H = 512: pre = x·W_ihᵀ (2·512·512 a row) + b_ih; loop = h·W_hhᵀ + b_hh, sum, tanh."""
    s = build_schedule(load_cell("rnn_tanh", 512, 512))
    gemm, H = 2 * 512 * 512, 512
    assert schedule_flops(s) == {
        "forward": {"hoisted": gemm + H, "per_frame": gemm + 3 * H},
        # hoisted: pre's dx and dW_ih and both slots of its bias add, then dW_hh and b_hh's reduction;
        # per frame: dh, the bias add's other slot, the sum's two slots, tanh
        "backward": {"hoisted": 3 * gemm + 3 * H, "per_frame": gemm + 4 * H}}


def test_schedule_stats_of_the_lstm():
    r = EXPERIMENTS["schedule_stats"].run({"cell": "lstm", "D": 512, "H": 512}, {})
    assert r["stages_per_frame"] == 2 and r["pre_kernels"] == 2 and r["post_kernels"] == 0
    assert r["kernels_per_frame"] == {"forward": {"before_merge": 21, "after_merge": 2},
                                      "backward": {"before_merge": 37, "after_merge": 2}}
    assert 0.49 < r["hoisted_flop_fraction"]["forward"] < 0.5 < r["hoisted_flop_fraction"]["training"] < 0.67
    assert EXPERIMENTS["schedule_stats"].run({"cell": "min_gru", "D": 512, "H": 512}, {})[
        "hoisted_flop_fraction"]["forward"] > 0.99                  # minGRU's products read only x


def test_schedule_variants_leave_one_part_out():
    s = build_schedule(load_cell("lstm", 8, 16))
    v = schedule_variants(s)
    assert v["full"] is s
    assert v["no_hoisted"].pre == () and v["no_hoisted"].loop == s.loop
    assert [type(it) for st in v["no_per_frame_gemm"].loop for it in st] == [type(s.loop[1][0])]
    assert [type(it) for st in v["no_fused_elementwise"].loop for it in st] == [Gemm]
    assert all(x.pre == s.pre for k, x in v.items() if k != "no_hoisted")


def test_executor_runs_a_given_schedule():
    cell = load_cell("gru", 8, 16)
    rng = np.random.default_rng(0)
    params = {p: rng.standard_normal(shape) * 0.3 for p, shape in cell.params.items()}
    x = {"x": rng.standard_normal((5, 2, 8))}
    be = get_backend("numpy")
    want = Executor(cell, be, "staged").forward(params, x, {})[0]["h"].copy()
    got = Executor(cell, be, "staged", schedule=build_schedule(cell)).forward(params, x, {})[0]["h"]
    np.testing.assert_array_equal(got, want)
    no_gemm = schedule_variants(build_schedule(cell))["no_per_frame_gemm"]
    ex = Executor(cell, be, "staged", schedule=no_gemm)
    assert ex.sched is no_gemm
    ex.forward(params, x, {})


def test_wavefront_cell_puts_every_layer_in_two_stages():
    s = build_schedule(load_cell(wavefront_lstm(3), 8, 16))
    assert [len(st) for st in s.loop] == [3, 1]                     # 3 independent GEMMs, 1 fused kernel
    assert [it.operand for it in s.loop[0]] == ["h0", "h1", "h2"] and all(it.delay == 1 for it in s.loop[0])
