"""`rnngraph figures`: every figure from the committed CPU samples, byte for byte the same each time, found
from any working directory; clear one-line errors for bad results or --out, notes for empty logs, and Ctrl-C.

The tests draw from experiments/results/quick (quick CPU samples, committed for this purpose); the
default, experiments/results, holds the GPU results the figures in figures/ are made from.
"""
import csv
import json
import shutil
from pathlib import Path

import pytest

from rnngraph.lab import figures
from rnngraph.lab.cli import main
from rnngraph.lab.experiments import EXPERIMENTS
from rnngraph.lab.figures import _training_curves, build_figures, draw_figures, headline_table, training_curve_logs
from rnngraph.lab.outputs import MANIFEST
from rnngraph.train.logs import LOG_COLUMNS

QUICK = Path(__file__).resolve().parents[1] / "experiments" / "results" / "quick"
PNG, PDF = b"\x89PNG\r\n\x1a\n", b"%PDF"


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Every figure drawn once from the committed samples: (output folder, paths written)."""
    out = tmp_path_factory.mktemp("figures")
    return out, build_figures(QUICK, out, runs=out / "no_runs")


def test_every_figure_is_written_as_png_and_pdf(drawn):
    out, paths = drawn
    stems = [*EXPERIMENTS, "lstm_schedule"]
    want = [out / f"{s}.{e}" for s in stems for e in ("png", "pdf")] + [out / "headline.md"]
    assert sorted(paths) == sorted(want)
    for s in stems:
        png, pdf = (out / f"{s}.png").read_bytes(), (out / f"{s}.pdf").read_bytes()
        assert png.startswith(PNG) and len(png) > 20_000, s
        assert pdf.startswith(PDF) and len(pdf) > 5_000, s


def test_the_committed_results_are_found_from_any_working_directory_and_others_drawn_aside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = next(draw_figures(out=tmp_path / "out"))                # draws only the first figure
    assert first == tmp_path / "out" / "single_stream_speedup.png" and first.read_bytes().startswith(PNG)
    assert next(draw_figures(QUICK)) == Path("runs/figures/single_stream_speedup.png")   # not the committed figures/


def _one_line(capsys):
    err = capsys.readouterr().err
    assert err.startswith("rnngraph: ") and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_no_results_found_names_the_folder_searched(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(figures, "RESULTS", tmp_path / "nowhere")
    assert main(["figures", "--out", str(tmp_path / "out")]) == 2
    assert _one_line(capsys) == (f"rnngraph: error: no results found: searched {tmp_path / 'nowhere'}; point at a "
                                 "folder of NAME.json files with --results DIR")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("out, message", [
    ("missing/out", "missing does not exist; create it or pass another --out DIR"),
    ("file/out", "file is not a folder; pass another --out DIR"),
])
def test_a_bad_out_folder_is_one_line_before_drawing(tmp_path, monkeypatch, capsys, out, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    assert main(["figures", "--results", str(QUICK), "--out", out]) == 2
    assert message in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_ctrl_c_says_which_figures_were_written(tmp_path, monkeypatch, capsys):
    def interrupt(doc):
        raise KeyboardInterrupt
    monkeypatch.setitem(figures.DRAW, "multi_stream_throughput", interrupt)   # the second figure
    assert main(["figures", "--results", str(QUICK), "--out", str(tmp_path)]) == 130
    assert _one_line(capsys) == (f"rnngraph: interrupted; wrote 2 files to {tmp_path} (single_stream_speedup); "
                                 "the others are unchanged")
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "single_stream_speedup.pdf",
                                                          "single_stream_speedup.png"]


def test_headline_table_says_what_it_shows(drawn):
    out, _ = drawn
    text = (out / "headline.md").read_text()
    assert text.startswith("| cell | H | graph vs naive, forward |")
    assert "graph mode was not measured" in text or "×" in text
    assert "Reproduce: `" in text


def test_headline_table_ratios():
    rec = {"cell": "lstm", "H": 512, "T": 100, "B": 1}
    doc = {"label": "measured on X", "metadata": {"gpu": "X", "date": "2026-11-30", "command": "c"},
           "records": [dict(rec, impl="naive", forward_ms=60.0, train_ms=200.0),
                       dict(rec, impl="graph", forward_ms=0.5, train_ms=2.0),
                       dict(rec, impl="cudnn", forward_ms=1.5, train_ms=5.0)]}
    assert "| LSTM | 512 | 120.0× | 100.0× | 3.0× | 2.5× |" in headline_table(doc)


def test_cli_draws_the_same_bytes_again_and_skips_an_empty_log(drawn, tmp_path, capsys):
    _write_log(tmp_path / "runs" / "good" / "log.csv")
    _write_log(tmp_path / "runs" / "stopped" / "log.csv", rows=0)   # a run stopped before its first step
    out = tmp_path / "out"
    assert main(["figures", "--results", str(QUICK), "--out", str(out), "--runs", str(tmp_path / "runs")]) == 0
    cap = capsys.readouterr()
    assert cap.out.splitlines() == [f"wrote {out / p.name}" for p in drawn[1][:-1]] + [
        f"wrote {out / 'training_curves.png'}", f"wrote {out / 'headline.md'}"]
    stopped = tmp_path / "runs" / "stopped" / "log.csv"
    assert cap.err == f"rnngraph: note: skipped {stopped}: the training log has no rows yet\n"
    for p in drawn[1]:                                              # the same results give the same bytes
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name
    assert b"CreationDate (D:1970" in (out / "cuda_lanes.pdf").read_bytes()     # not "now"
    assert [p.name for p in out.glob(".*")] == [MANIFEST]                      # no temporary file left


def _write_log(log, rows=5):
    log.parent.mkdir(parents=True)
    with open(log, "w", newline="") as f:
        w = csv.DictWriter(f, LOG_COLUMNS)
        w.writeheader()
        for step in range(1, rows + 1):
            w.writerow({c: step for c in LOG_COLUMNS} | {"bpc": 4.0 / step, "val_bpc": "" if step % 2 else 3.0})


def test_training_curves_are_drawn_when_there_are_logs(tmp_path):
    _write_log(tmp_path / "runs" / "small" / "log.csv")
    assert list(_training_curves(tmp_path, training_curve_logs(tmp_path / "runs", tmp_path / "no_results"))) == [
        tmp_path / "training_curves.png"]
    assert (tmp_path / "training_curves.png").read_bytes().startswith(PNG)
    assert training_curve_logs(tmp_path / "no_runs", tmp_path / "no_results") == {}


def test_stored_training_logs_get_a_figure_each_and_empty_ones_a_note(tmp_path, capsys):
    _write_log(tmp_path / "results" / "training_gpu" / "log.csv")
    _write_log(tmp_path / "results" / "training_stopped" / "log.csv", rows=0)
    assert list(_training_curves(tmp_path, training_curve_logs(tmp_path / "no_runs", tmp_path / "results"))) == [
        tmp_path / "training_gpu.png"]
    assert (tmp_path / "training_gpu.png").read_bytes().startswith(PNG)
    assert "skipped" in _one_line(capsys) and not (tmp_path / "training_stopped.png").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.unlink(), "missing results file(s) in"),
    (lambda p: p.write_text("{oops"), "not JSON"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "records": [{"cell": "lstm"}]})),
     "record 0 lacks forward_ms, train_ms"),
])
def test_a_missing_or_malformed_results_file_is_named(tmp_path, capsys, damage, message):
    results = tmp_path / "results"
    shutil.copytree(QUICK, results)
    bad = results / "sequence_length.json"
    damage(bad)
    assert main(["figures", "--results", str(results), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rnngraph: error: ") and message in err
    assert str(bad) in err or f"{bad.parent}: {bad.name}" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()                          # checked before anything is drawn


def test_stored_runs_in_subfolders_share_one_figure(tmp_path, monkeypatch):
    """results/training_x/{bfloat16,float32}/log.csv: one figure, a curve per subfolder, labelled by it."""
    import rnngraph.lab.curves as curves
    drawn = []

    def draw(logs, tmp, labels=None):
        drawn.append(([p.parent.name for p in logs], labels))
        tmp.write_bytes(PNG)
    monkeypatch.setattr(curves, "draw_training_curves", draw)
    for run in ("bfloat16", "float32"):
        _write_log(tmp_path / "results" / "training_x" / run / "log.csv")
    assert list(_training_curves(tmp_path, training_curve_logs(tmp_path / "no_runs", tmp_path / "results"))) == [
        tmp_path / "training_x.png"]
    assert drawn == [(["bfloat16", "float32"], ["bfloat16", "float32"])]
