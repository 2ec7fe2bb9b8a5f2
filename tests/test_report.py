"""`rnngraph report` and the stored results it reads: docs/performance.md and the README's headline table are
byte for byte what experiments/results gives; every stored file carries its machine, command and date and is
named by the page (or read by a test); a stale page or a malformed file is one clear line."""
import json
import shlex
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest

from rnngraph.lab import report
from rnngraph.lab.bench import DEFAULT_IMPLS
from rnngraph.lab.cli import build_parser, main
from rnngraph.lab.report import README, with_headline
from rnngraph.lab.report_bench import headline
from rnngraph.lab.report_data import Results
from rnngraph.lab.report_page import render_page

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
STORED = sorted(p for p in RESULTS.rglob("*") if p.is_file())


def test_the_pages_are_what_the_stored_results_give():
    results = Results(RESULTS)
    assert (ROOT / "docs" / "performance.md").read_text() == render_page(results), "run `rnngraph report`"
    readme = README.read_text()
    assert readme == with_headline(readme, headline(results)), "run `rnngraph report`"


def test_check_passes_here_and_names_a_stale_page(tmp_path, capsys):
    assert main(["report", "--check"]) == 0
    changed = tmp_path / "results"
    shutil.copytree(RESULTS, changed)
    path = changed / "bench" / "norm.json"
    doc = json.loads(path.read_text())
    doc["results"][0]["train_ms"] *= 2
    path.write_text(json.dumps(doc))
    assert main(["report", "--check", "--results", str(changed)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"rnngraph: {p} is out of date (stored results: {changed}); run `rnngraph report`"
                   for p in ("docs/performance.md", "README.md")]


def test_report_rewrites_only_stale_pages(tmp_path, monkeypatch, capsys):
    page, readme = tmp_path / "performance.md", tmp_path / "README.md"
    page.write_text("old\n")
    readme.write_text(README.read_text())
    monkeypatch.setattr(report, "PAGE", page)
    monkeypatch.setattr(report, "README", readme)
    assert main(["report"]) == 0
    assert capsys.readouterr().out == f"wrote {page}\n"
    assert page.read_text() == (ROOT / "docs" / "performance.md").read_text()
    assert main(["report"]) == 0 and capsys.readouterr().out == "rnngraph: the pages are current\n"


def test_a_malformed_results_file_is_one_line(tmp_path, capsys):
    broken = tmp_path / "results"
    shutil.copytree(RESULTS, broken)
    (broken / "bench" / "torch.json").write_text(json.dumps({"results": []}))
    assert main(["report", "--check", "--results", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err == f"rnngraph: error: {broken / 'bench' / 'torch.json'} is not a bench result: it lacks machine, settings\n"


def test_the_readme_needs_its_markers():
    with pytest.raises(report.RnnGraphError, match="needs one <!-- headline:begin --> line"):
        with_headline("no markers\n", "table")


# -- the stored files ------------------------------------------------------------------------------

def test_at_most_45_files_each_named_by_the_page_or_read_by_a_test():
    assert len(STORED) <= 45, [str(p.relative_to(RESULTS)) for p in STORED]
    page = (ROOT / "docs" / "performance.md").read_text()
    for p in STORED:
        name = str(p.relative_to(ROOT))
        assert name in page or p.parent.name == "quick", f"{name} is named nowhere"   # quick/: test_figures.py


def _layer_bench(path) -> bool:
    """A layer's `rnngraph bench` (not a model's, nor a probe's: experiments/*.py writing the bench format)."""
    command = json.loads(path.read_text())["machine"]["command"]
    return command.startswith("rnngraph bench ") and " --model " not in command


@pytest.mark.parametrize("path", [p for p in sorted((RESULTS / "bench").glob("*.json")) if _layer_bench(p)],
                         ids=lambda p: p.name)
def test_a_bench_file_is_what_its_command_measures(path):
    """The stored settings and the records' grid are what the stored command asks for (converted logs included)."""
    doc = json.loads(path.read_text())
    m = doc["machine"]
    assert m["gpu"] and m["date"] and m["cuda_runtime"] and m["command"].startswith("rnngraph bench ")
    args = build_parser().parse_args(shlex.split(m["command"])[1:])
    st = doc["settings"]
    asked = {"cells": args.cell, "T": args.T or [100], "B": args.B or [1], "H": args.H or [512], "dtype": args.dtype,
             "impls": args.impls or list(DEFAULT_IMPLS), "repeats": args.repeats or 20}
    assert {k: st[k] for k in asked} == asked
    loops = args.loop or ["auto"]
    grid = sorted((c, t, b, h, i) for c in asked["cells"] for t in asked["T"] for b in asked["B"] for h in asked["H"]
                  for i in asked["impls"] for _ in (loops if i.split("@")[0] in ("staged", "graph") else ["auto"]))
    assert sorted((r["cell"], r["T"], r["B"], r["H"], r["impl"]) for r in doc["results"]) == grid


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_an_experiment_or_run_file_says_where_and_how(path):
    doc = json.loads(path.read_text())
    if path.name == "training_runs.json":
        for run in doc["runs"]:
            assert {"name", "folder", "log", "command", "machine", "date"} <= set(run), run
            assert (RESULTS / run["folder"] / run["log"]).is_file()
        return
    m = doc["metadata"]
    assert m["date"] and m["command"] and (m["gpu"] or doc["experiment"] == "schedule_stats")


def test_each_training_command_gives_the_config_its_log_holds():
    from rnngraph.train.loop import TrainConfig
    runs = json.loads((RESULTS / "training_runs.json").read_text())["runs"]
    checked = 0
    for run in (r for r in runs if r["log"] == "log.json"):
        args = vars(build_parser().parse_args(shlex.split(run["command"])[1:]))
        config = replace(TrainConfig(), **{f.name: args[f.name] for f in fields(TrainConfig)
                                           if args.get(f.name) is not None})
        stored = json.loads((RESULTS / run["folder"] / "log.json").read_text())["config"]
        want = {k: v for k, v in vars(config).items() if k in stored and k != "run_id"}
        assert want == {k: stored[k] for k in want}, run["name"]
        checked += 1
    assert checked == 3


def test_the_model_bench_file_is_what_its_command_measures():
    """charlm.json: every (B, precision, impl) the command asks for, each with its losses checked."""
    doc = json.loads((RESULTS / "bench" / "charlm.json").read_text())
    args = build_parser().parse_args(shlex.split(doc["machine"]["command"])[1:])
    st = doc["settings"]
    assert args.model == st["model"] == "charlm" and args.B == st["B"] and args.impls == st["impls"]
    grid = sorted((b, p, i) for b in st["B"] for p in st["precisions"] for i in st["impls"])
    assert sorted((r["B"], r["precision"], r["impl"]) for r in doc["results"]) == grid
    assert all(r["losses_agree"] for r in doc["results"] if r["impl"] != "torch")


def test_the_memory_file_is_what_its_script_measures():
    """memory.json: the long-sequence step of experiments/long_sequence_memory.py at its defaults."""
    doc = json.loads((RESULTS / "bench" / "memory.json").read_text())
    assert doc["machine"]["command"].startswith("python experiments/long_sequence_memory.py")
    (r,) = doc["results"]
    assert (r["T"], r["B"], r["H"], r["device"]) == (100_000, 8, 512, "gpu") and r["recomputed"] and r["finite"]
    assert r["peak_gb"] > r["inputs_outputs_gradients_gb"]      # what it measured is at least what it must hold


def test_the_summary_takes_a_configuration_from_its_later_run():
    """heads.json and heads_b16.json both measure B = 16 at FlashRNN's shape: where heads_b16 is the later run, the
    summary of where rnngraph is slower takes B = 16 from it alone, and the heads section says so; where it is the
    earlier, from heads.json too."""
    from rnngraph.lab.report_data import Findings
    from rnngraph.lab.report_models import heads
    results, findings = Results(RESULTS), Findings()
    text = heads(results, findings)
    assert results.bench("heads_b16")["machine"]["date"] > results.bench("heads")["machine"]["date"]
    assert "B = 16 is measured again below" in text
    said = [what for _, what in findings.slower]
    assert not [w for w in said if "(B = 16, T = 1024" in w or "same size, B = 16" in w]
    rows = {r["impl"]: r for r in results.bench("heads_b16")["results"] if r["cell"] == "lstm"}
    slower = any(rows["graph"][f"{w}_ms"] > rows["cudnn@float16"][f"{w}_ms"] for w in ("forward", "train"))
    assert bool([w for w in said if "at B = 16 against cuDNN's single-head LSTM" in w]) == slower   # from heads_b16
    earlier = Results(RESULTS)
    doc = earlier.bench("heads_b16")
    doc["machine"] = dict(doc["machine"], date="2000-01-01T00:00:00+00:00")
    findings = Findings()
    assert "B = 16 is measured again below" not in heads(earlier, findings)
    assert [what for _, what in findings.slower if "(B = 16, T = 1024" in what]


def test_the_wider_section_says_where_auto_beats_cudnn_and_by_how_much_elsewhere():
    from rnngraph.lab.report_tensor import _against
    assert _against([("H = 768, B = 32", 1.02), ("H = 768, B = 64", 0.95), ("H = 1024, B = 32", 1.76)]) == (
        "`auto`'s training step takes 0.95× cuDNN float16's time at H = 768, B = 64, and 1.02–1.76× elsewhere here.")
    assert _against([("H = 1024, B = 64", 1.1)]) == \
        "At these widths neither loop reaches cuDNN float16: its training step takes 1.10× cuDNN's here."
    assert _against([("H = 768, B = 64", 0.95)]).endswith("at H = 768, B = 64.")


def test_the_b_curve_says_how_the_ungrouped_batches_ran():
    from rnngraph.lab.report_shapes import _ungrouped
    loop = "persistent (tensor cores in 3xTF32, weights in registers{})"
    runs = {16: ", 4 groups of 4 rows", 17: "", 31: "", 32: ", 4 groups of 8 rows"}
    at = {("graph", B): {"gpu_loop": loop.format(g), "train_ms": ms} for (B, g), ms in
          zip(runs.items(), (7.8, 12.0, 17.2, 8.0))}
    assert _ungrouped(at, 8.0, 32) == ("at their exact size B = 17, 31 do not, run one group of B rows, and take "
                                       "1.50×, 2.15× the time of B = 32, so a call of such a B runs padded to the "
                                       "next multiple of 8 rows (24, 32), which splits")
    at[("graph", 17)] = {"gpu_loop": loop.format(", 3 groups of 8 rows, B padded to 24 rows"), "train_ms": 7.4}
    at[("graph", 31)] = {"gpu_loop": loop.format(", 4 groups of 8 rows, B padded to 32 rows"), "train_ms": 8.2}
    assert _ungrouped(at, 8.0, 32) == ("B = 17, 31 do not, so they run padded to the next multiple of 8 rows (24, "
                                       "32), which splits, and take 0.93×, 1.02× the time of B = 32")
    del at[("graph", 17)], at[("graph", 31)]
    assert _ungrouped(at, 8.0, 32) == "every B measured here does"
