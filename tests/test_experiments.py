"""The experiments: every --quick run writes well-formed results outside the committed ones; bad paths,
no GPU and Ctrl-C end in one line before (or without) writing; the analyses count exactly."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dataclasses import replace

from rnngraph import RnnGraphError, build_schedule, load_cell

from rnngraph.lab import bench
from rnngraph.run.backends import get_backend
from rnngraph.lab.cli import main
from rnngraph.run.executor import Executor
from rnngraph.lab.experiments import (EXPERIMENTS, QUICK_LABEL, RESULTS, SCRATCH, load_results, run_experiment,
                                  schedule_flops, schedule_variants, wavefront_lstm)
from rnngraph.plan.schedule import Gemm

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
    assert res.stderr == ""                                          # no progress bar when stderr is piped
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
    assert RESULTS == ROOT / "experiments" / "results"              # found from the package, not the working dir
    for path in sorted((RESULTS / "quick").glob("*.json")):
        _check(load_results(path), path.stem)
    stats = load_results(RESULTS / "schedule_stats.json")
    exp = EXPERIMENTS["schedule_stats"]
    assert stats["records"] == json.loads(json.dumps([dict(cfg, **exp.run(cfg, {})) for cfg in exp.grid(False)]))


def _committed():
    return {p: p.read_bytes() for p in RESULTS.rglob("*.json")}


def test_runs_go_to_a_scratch_folder_by_default(tmp_path, monkeypatch, capsys):
    before = _committed()
    monkeypatch.chdir(ROOT)                                         # even from the checkout itself
    monkeypatch.setattr("rnngraph.lab.experiments.SCRATCH", {q: tmp_path / p for q, p in SCRATCH.items()})
    assert main(["experiment", "schedule_stats", "--quick"]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / SCRATCH[True] / 'schedule_stats.json'}\n"
    _check(load_results(tmp_path / SCRATCH[True] / "schedule_stats.json"), "schedule_stats")
    assert main(["experiment", "schedule_stats"]) == 0              # analysis: a full run needs no GPU
    assert (tmp_path / SCRATCH[False] / "schedule_stats.json").is_file()
    assert _committed() == before
    assert SCRATCH == {False: Path("runs/experiments"), True: Path("runs/experiments-quick")}
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/experiments-quick/x.json"], cwd=ROOT)
    assert ignored.returncode in (0, 128)                           # 128: not a git checkout


def _stub(monkeypatch, name, run):
    """Experiment `name` with its quick grid cut to three configurations and `run` as its measurement."""
    exp = EXPERIMENTS[name]
    monkeypatch.setitem(EXPERIMENTS, name, replace(exp, grid=lambda quick: exp.grid(True)[:3], run=run))


def _one_line(capsys, start):
    """The one line on stderr after the progress bar (tqdm redraws it with \\r), which must start with `start`."""
    *bar, line = capsys.readouterr().err.strip().split("\n")
    assert line.startswith(start) and all("config/s" in b for b in bar), bar + [line]
    return line


def test_a_full_timed_run_without_a_gpu_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "gpu_problem", lambda: "no GPU in this test")
    _stub(monkeypatch, "single_stream_speedup", lambda cfg, opts: pytest.fail("measured without a GPU"))
    assert main(["experiment", "single_stream_speedup", "--out", str(tmp_path)]) == 2
    err = _one_line(capsys, "rnngraph: error: no usable GPU (no GPU in this test)")
    assert "--quick" in err and "--allow-cpu" in err
    assert list(tmp_path.iterdir()) == []
    _stub(monkeypatch, "single_stream_speedup", lambda cfg, opts: {"forward_ms": 1.0, "train_ms": 2.0})
    assert main(["experiment", "single_stream_speedup", "--out", str(tmp_path), "--allow-cpu"]) == 0
    doc = load_results(tmp_path / "single_stream_speedup.json")
    assert doc["quick"] is False and len(doc["records"]) == 3


@pytest.mark.parametrize("out, message", [
    ("missing/folder", "missing does not exist; create it or pass another --out DIR"),
    ("file/folder", "file is not a folder; pass another --out DIR"),
    ("", "--out DIR is empty"),
])
def test_a_bad_out_folder_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, out, message):
    _stub(monkeypatch, "schedule_stats", lambda cfg, opts: pytest.fail("ran before checking --out"))
    (tmp_path / "file").write_text("")
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", "schedule_stats", "--quick", "--out", out]) == 2
    assert message in _one_line(capsys, "rnngraph: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("existing", [False, True])
@pytest.mark.parametrize("script", [False, True])
def test_ctrl_c_writes_nothing_and_says_so(tmp_path, monkeypatch, capsys, existing, script):
    from rnngraph.lab.experiments import main as script_main
    measure = EXPERIMENTS["schedule_stats"].run

    def run(cfg, opts):
        if cfg["cell"] != "lstm":
            raise KeyboardInterrupt
        return measure(cfg, opts)
    _stub(monkeypatch, "schedule_stats", run)
    path = tmp_path / "schedule_stats.json"
    if existing:
        path.write_text("the previous results")           # not rnngraph's: replaced only with --overwrite
    argv = ["--quick", "--out", str(tmp_path), *(["--overwrite"] if existing else [])]
    assert (script_main("schedule_stats", argv) if script else main(["experiment", "schedule_stats", *argv])) == 130
    err = _one_line(capsys, "schedule_stats: interrupted; " if script else "rnngraph: interrupted; ")
    assert err.endswith(f"schedule_stats stopped after 1 of 3 configurations; nothing was written "
                                 f"({path} {'is unchanged' if existing else 'was not created'})")
    assert [p.name for p in tmp_path.iterdir()] == (["schedule_stats.json"] if existing else [])
    assert not existing or path.read_text() == "the previous results"


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
    """rnn_tanh, D = H = 512: pre = x·W_ihᵀ (2·512·512 a row); loop = h·W_hhᵀ, + b_ih (sunk), + b_hh, sum, tanh."""
    s = build_schedule(load_cell("rnn_tanh", 512, 512))
    gemm, H = 2 * 512 * 512, 512
    assert schedule_flops(s) == {
        "forward": {"hoisted": gemm, "per_frame": gemm + 4 * H},
        # hoisted: pre's dx and dW_ih, dW_hh, and the two biases' reductions;
        # per frame: dh, each bias add's frame slot, the sum's two slots, tanh
        "backward": {"hoisted": 3 * gemm + 2 * H, "per_frame": gemm + 5 * H}}


def test_schedule_stats_of_the_lstm():
    r = EXPERIMENTS["schedule_stats"].run({"cell": "lstm", "D": 512, "H": 512}, {})
    assert r["stages_per_frame"] == 2 and r["pre_kernels"] == 1 and r["post_kernels"] == 0     # biases sunk
    assert r["kernels_per_frame"] == {"forward": {"before_merge": 25, "after_merge": 2},
                                      "backward": {"before_merge": 45, "after_merge": 2}}
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
    want = Executor(cell, be).forward(params, x, {})[0]["h"].copy()
    got = Executor(cell, be, schedule=build_schedule(cell)).forward(params, x, {})[0]["h"]
    np.testing.assert_array_equal(got, want)
    no_gemm = schedule_variants(build_schedule(cell))["no_per_frame_gemm"]
    ex = Executor(cell, be, schedule=no_gemm)
    assert ex.sched is no_gemm
    ex.forward(params, x, {})


def test_wavefront_cell_puts_every_layer_in_two_stages():
    s = build_schedule(load_cell(wavefront_lstm(3), 8, 16))
    assert [len(st) for st in s.loop] == [3, 1]                     # 3 independent GEMMs, 1 fused kernel
    assert [it.operand for it in s.loop[0]] == ["h0", "h1", "h2"] and all(it.delay == 1 for it in s.loop[0])


def test_the_word_lm_probe_runs_each_engine_to_the_same_losses():
    """experiments/word_lm_cpu.py: torch.nn.LSTM, rnngraph.torch as it ships and held to numpy, a few windows each."""
    pytest.importorskip("torch")
    out = _run("experiments/word_lm_cpu.py", "--hidden", "16", "--vocab", "200", "--batches", "3", "--bptt", "5")
    assert out.returncode == 0, out.stderr[-2000:]
    ends = [line.split("loss ")[1] for line in out.stdout.splitlines() if "s/epoch" in line]
    assert len(ends) == 3
    first = {float(e.split(" -> ")[0]) for e in ends}
    assert max(first) - min(first) <= 1e-4 * max(first)      # the same initial weights and data: the same first loss
