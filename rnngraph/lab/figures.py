"""Every figure of the evaluation, redrawn on the CPU from stored results (nothing is measured): `rnngraph figures`."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from . import style
from .options import writable_folder
from ..errors import Interrupted, RnnGraphError
from .experiments import EXPERIMENTS, FIGURES, PARTS, RESULTS, SCRATCH, load_results
from .outputs import check_replaceable, write_output, write_text_output

NAMES = {"lstm": "LSTM", "peephole_lstm": "peephole LSTM", "gru": "GRU", "min_gru": "minGRU",
         "mgu": "MGU", "cifg_lstm": "CIFG LSTM", "rnn_tanh": "RNN tanh", "rnn_relu": "RNN ReLU",
         "indrnn": "IndRNN", "sru": "SRU", "min_lstm": "minLSTM", "qrnn": "QRNN", "wavefront_lstm": "wavefront LSTM"}
WHAT = {"forward": "forward", "train": "training step"}
PART_LABEL = {"hoisted": "hoisted (pre/post)", "per_frame_gemm": "per-frame GEMM",
              "fused_elementwise": "fused elementwise", "launch_overhead": "launch/host overhead"}


def run_figures(args) -> None:
    """`rnngraph figures`: every figure, each file named as it is written; Ctrl-C says which were."""
    written = []
    try:
        for path in draw_figures(args.results, args.out, args.runs, args.overwrite):
            written.append(path)
            print(f"wrote {path}", flush=True)
    except KeyboardInterrupt:
        names = ", ".join(dict.fromkeys(p.stem for p in written))
        raise Interrupted(f"wrote {len(written)} files to {written[0].parent} ({names}); the others are unchanged"
                          if written else "no figure was written") from None


def build_figures(results=None, out=None, runs="runs", overwrite: bool = False) -> list:
    """Draws every figure from the results in `results` (default: the committed RESULTS) into `out`
    (default, in the working directory: figures/ for the committed results, else runs/figures); returns the
    paths written. Missing or malformed results, an unwritable `out` and a file there that rnngraph did not
    write (unless overwrite; outputs.py) raise an RnnGraphError before drawing."""
    return list(draw_figures(results, out, runs, overwrite))


def draw_figures(results=None, out=None, runs="runs", overwrite: bool = False):
    """build_figures, yielding each path once it is written (whole: files are written, then renamed)."""
    if results is None and not RESULTS.is_dir():
        raise RnnGraphError(f"no results found: searched {RESULTS}; point at a folder of NAME.json files with "
                            "--results DIR")
    default_out = FIGURES if results is None else SCRATCH[False].parent / "figures"
    results = Path(RESULTS if results is None else results)
    missing = [f"{name}.json" for name in EXPERIMENTS if not (results / f"{name}.json").is_file()]
    if missing:
        samples = f", or draw the committed CPU samples: --results {RESULTS / 'quick'}" \
            if (RESULTS / "quick").is_dir() else ""
        raise RnnGraphError(f"missing results file(s) in {results.resolve()}: {', '.join(missing)}; run "
                            f"`rnngraph experiment NAME` for each{samples}")
    docs = {name: load_results(results / f"{name}.json") for name in EXPERIMENTS}
    out = writable_folder(default_out if out is None else out, "--out DIR", missing=None if out is None else 1, raw=out)
    curves = training_curve_logs(runs, results)
    names = [f"{stem}.{ext}" for stem in (*DRAW, "lstm_schedule") for ext in ("png", "pdf")]
    for name in (*names, *(f"{c}.png" for c in curves), "headline.md"):
        check_replaceable(out / name, overwrite)                 # every file, before the first is drawn
    out.mkdir(parents=True, exist_ok=True)
    with style.context(), _reproducible():
        for name, draw in DRAW.items():
            fig = draw(docs[name])
            fig.text(0.0, 0.0, _footnote(docs[name]), ha="left", va="top", wrap=True, **style.FOOTNOTE)
            yield from (write_output(out / f"{name}.{ext}", fig.savefig, overwrite) for ext in ("png", "pdf"))
        yield from _schedule_diagram(out, overwrite)
        yield from _training_curves(out, curves, overwrite)
        yield write_text_output(out / "headline.md", headline_table(docs["single_stream_speedup"]), overwrite)


@contextlib.contextmanager
def _reproducible():
    """The same inputs give the same bytes: PDFs are dated from SOURCE_DATE_EPOCH (0 unless it is set), not now."""
    old = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = old or "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["SOURCE_DATE_EPOCH"]


def _schedule_diagram(out: Path, overwrite: bool = False):
    """The LSTM's schedule, as `rnngraph schedule lstm --draw` draws it (D = 32, H = 64)."""
    from ..ir.loading import load_cell
    from ..plan.schedule import build_schedule
    from .drawing import draw_schedule
    schedule = build_schedule(load_cell("lstm", 32, 64))
    for ext in ("png", "pdf"):
        yield write_output(out / f"lstm_schedule.{ext}", lambda tmp: draw_schedule(schedule, tmp), overwrite)


def training_curve_logs(runs, results) -> dict:
    """The training-curve figures to draw, name -> (logs, labels or None): one per stored folder
    RESULTS/training*/ of its run's log (log.csv, else log.json), or of the runs in its subfolders side by side
    (e.g. one run per dtype), and 'training_curves' for the local runs RUNS/*/log.csv together, if there are
    any. A log without rows is skipped, with a note."""
    from .curves import with_rows
    figures = {}
    for folder in sorted(Path(results).glob("training*/")):
        own = _run_log(folder)
        logs = with_rows([own] if own else [log for d in sorted(folder.glob("*/")) if (log := _run_log(d))])
        if logs:
            figures[folder.name] = (logs, None if own else [log.parent.name for log in logs])
    logs = with_rows(sorted(Path(runs).glob("*/log.csv")))
    if logs:
        figures["training_curves"] = (logs, None)
    return figures


def _training_curves(out: Path, figures: dict, overwrite: bool = False):
    """Draws training_curve_logs' figures (lab/curves.py) into `out`, yielding each path."""
    from .curves import draw_training_curves
    for name, (logs, labels) in figures.items():
        yield write_output(out / f"{name}.png", lambda tmp, logs=logs, labels=labels:
                           draw_training_curves(logs, tmp, labels), overwrite)


def _run_log(folder: Path) -> Path | None:
    """A stored run's log in `folder`: log.csv, else log.json, else None."""
    return next((p for p in (folder / "log.csv", folder / "log.json") if p.exists()), None)


# -- reading records ---------------------------------------------------------------------------

def _measured(doc, **match) -> list:
    """Records that were measured (not skipped or failed) and match every key=value given."""
    return [r for r in doc["records"] if "skipped" not in r and "failed" not in r
            and all(r.get(k) == v for k, v in match.items())]


def _unmeasured(doc) -> str:
    """'graph, cudnn' style list of implementations that were skipped or failed everywhere."""
    impls = dict.fromkeys(r.get("impl") for r in doc["records"] if r.get("impl"))
    gone = [i for i in impls if not _measured(doc, impl=i)]
    return f"not measured here: {', '.join(gone)} (skipped; see the records)" if gone else ""


def _footnote(doc) -> str:
    """Where and when the results were measured (keys of bench.machine_info()), and what has no data."""
    m = doc["metadata"]
    if not EXPERIMENTS[doc["experiment"]].timed:
        where = [doc["label"]]
    elif doc["quick"] or not m.get("gpu"):
        where = [doc["label"], m.get("device") or "CPU", f"numpy {m.get('numpy')}"]
    else:
        where = [m["gpu"], f"CUDA driver {m.get('cuda_driver')}, runtime {m.get('cuda_runtime')}",
                 f"CuPy {m.get('cupy')}", f"numpy {m.get('numpy')}"]
    where += [f"rnngraph {str(m.get('commit'))[:12]}", str(m.get("date"))[:10]]
    return "\n".join(filter(None, [" · ".join(where), _unmeasured(doc)]))


# -- the figures -------------------------------------------------------------------------------

def fig_single_stream_speedup(doc) -> Figure:
    """Bars: speed-up over naive of staged and graph (cuDNN as a tick) per H; a panel per cell and pass."""
    cells = list(dict.fromkeys(r["cell"] for r in doc["records"]))
    Hs = sorted({r["H"] for r in doc["records"]})
    modes = [m for m in ("staged", "graph") if _measured(doc, impl=m)]
    fig = Figure(figsize=(style.PAGE, 3.3), layout="constrained")
    axes = fig.subplots(2, len(cells), sharex=True, sharey=True, squeeze=False)
    x, width = np.arange(len(Hs)), 0.8 / max(len(modes), 1)
    for row, what in enumerate(("forward", "train")):
        for col, cell in enumerate(cells):
            ax = axes[row][col]
            naive = {r["H"]: r[f"{what}_ms"] for r in _measured(doc, cell=cell, impl="naive")}
            for j, mode in enumerate(modes):
                t = {r["H"]: r[f"{what}_ms"] for r in _measured(doc, cell=cell, impl=mode)}
                hs = [k for k, H in enumerate(Hs) if H in t and H in naive]
                up = np.array([naive[Hs[k]] / t[Hs[k]] for k in hs])
                ax.bar(x[hs] + (j - (len(modes) - 1) / 2) * width, up - 1.0, width, bottom=1.0,
                       color=style.IMPL[mode], label=style.IMPL_LABEL[mode])   # from 1×, up or down
            ref = {r["H"]: r[f"{what}_ms"] for r in _measured(doc, cell=cell, impl="cudnn")}
            hs = [k for k, H in enumerate(Hs) if H in ref and H in naive]
            ax.scatter(x[hs], [naive[Hs[k]] / ref[Hs[k]] for k in hs], marker="_", s=120, lw=1.6,
                       color=style.IMPL["cudnn"], zorder=3, label=style.IMPL_LABEL["cudnn"])
            ax.axhline(1.0, color=style.INK, lw=0.6, ls=":")
            ax.set_yscale("log")
            ax.grid(axis="y", which="major", lw=0.3, alpha=0.5)
            if row == 0:
                ax.set_title(NAMES.get(cell, cell), fontsize=8)
            if col == 0:
                ax.set_ylabel(f"{WHAT[what]}\nspeed-up over naive")
    style.log_axis(axes[0][0].yaxis, lambda v: f"{v:g}×")
    axes[0][0].set_xticks(x, [str(H) for H in Hs])
    for ax in axes[-1]:
        ax.tick_params(axis="x", labelrotation=45 if len(Hs) > 3 else 0)
    fig.supxlabel(f"hidden size H (one stream B = 1, T = {doc['records'][0]['T']} frames, D = H)", fontsize=8)
    handles = [Patch(color=style.IMPL[m], label=style.IMPL_LABEL[m]) for m in modes]
    if _measured(doc, impl="cudnn"):
        handles.append(Line2D([], [], color=style.IMPL["cudnn"], marker="_", ls="", ms=10, mew=1.6,
                              label=f"{style.IMPL_LABEL['cudnn']}, LSTM and GRU"))
    handles.append(Line2D([], [], color=style.INK, ls=":", lw=0.6, label="naive = 1×"))
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles))
    return fig


def fig_multi_stream_throughput(doc) -> Figure:
    """Lines: training frames per second against parallel streams S, log-log."""
    fig = Figure(figsize=(style.COLUMN, 2.6), layout="constrained")
    ax = fig.subplots()
    r0 = doc["records"][0]
    for impl in dict.fromkeys(r["impl"] for r in doc["records"]):
        rs = sorted(_measured(doc, impl=impl), key=lambda r: r["B"])
        if rs:
            ax.plot([r["B"] for r in rs], [r["B"] * r["T"] / (r["train_ms"] / 1e3) for r in rs], marker="o", ms=3,
                    lw=1.2, color=style.IMPL[impl], label=style.IMPL_LABEL[impl])
    Ss = sorted({r["B"] for r in doc["records"]})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(Ss, [str(s) for s in Ss])
    ax.xaxis.set_minor_formatter(NullFormatter())
    style.log_axis(ax.yaxis, style.si_label)
    ax.grid(which="major", lw=0.3, alpha=0.5)
    ax.set_xlabel("parallel training streams S (batch size)")
    ax.set_ylabel("training throughput (frames/s)")
    ax.set_title(f"{NAMES[r0['cell']]}, H = {r0['H']}, T = {r0['T']}: training steps", fontsize=8)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside upper center", ncol=2)
    return fig


def fig_stage_breakdown(doc) -> Figure:
    """Stacked bars of a frame's forward time: all parts of an eager run (◆ its measured total) and,
    where CUDA graphs ran, the device-side parts of a replayed run (◆ its measured total)."""
    recs = _measured(doc)
    replay = bool(recs) and recs[0]["parts_from"] == "graph"
    fig = Figure(figsize=(style.COLUMN, 1.0 + 0.22 * max(len(recs), 2)), layout="constrained")
    axes = fig.subplots(1, 2 if replay else 1, squeeze=False, sharey=True)[0]
    if not recs:
        style.note(axes[0], "no measurements: every configuration was skipped")
        return fig
    y, clipped = np.arange(len(recs)), False
    panels = [("eager (staged)", PARTS if replay else PARTS[:3], "total_us_per_frame")]
    if replay:
        panels.append(("CUDA-graph replay", PARTS[:3], "replay_us_per_frame"))
    for ax, (title, parts, total) in zip(axes, panels):
        left = np.zeros(len(recs))
        for part in parts:
            vals = np.array([r["parts_us_per_frame"][part] or 0.0 for r in recs])
            clipped |= bool((vals < 0).any())
            vals = np.clip(vals, 0.0, None)
            ax.barh(y, vals, left=left, height=0.62, color=style.PART[part], label=PART_LABEL[part])
            left += vals
        tot = [r[total] for r in recs]
        ax.scatter(tot, y, marker="D", s=10, color=style.INK, zorder=3, label="measured total")
        ax.set_title(title, fontsize=7)
        ax.grid(axis="x", lw=0.3, alpha=0.5)
        ax.set_xlim(0, max(tot + [1e-9]) * 1.08)
    axes[0].set_yticks(y, [f"{NAMES.get(r['cell'], r['cell'])}, H={r['H']}" for r in recs], fontsize=7)
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles[1:] + handles[:1], labels[1:] + labels[:1], loc="outside upper center", ncol=3,
               columnspacing=1.0)
    r0 = recs[0]
    notes = [f"T = {r0['T']}, B = {r0['B']}; each part = full run − run without it"]
    if not replay:
        notes.append("launch overhead: not separable without CUDA graphs")
    if clipped:
        notes.append("negative differences (noise) drawn as 0")
    fig.supxlabel("\n".join(["forward time per frame (µs)"] + notes), fontsize=7, linespacing=1.5)
    return fig


def fig_sequence_length(doc) -> Figure:
    """Lines: cost per frame against T, log-log, forward and training step side by side; a series per
    implementation, and per loop strategy where the records name one (the scan experiment)."""
    fig = Figure(figsize=(style.COLUMN, 2.5), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    r0 = doc["records"][0]
    for ax, what in zip(axes, ("forward", "train")):
        for impl, loop in dict.fromkeys((r["impl"], r.get("loop")) for r in doc["records"]):
            rs = sorted(_measured(doc, impl=impl, **({"loop": loop} if loop else {})), key=lambda r: r["T"])
            if rs:
                ax.plot([r["T"] for r in rs], [1e3 * r[f"{what}_ms"] / r["T"] for r in rs], marker="o", ms=3,
                        lw=1.2, color=style.LOOP[loop] if loop else style.IMPL[impl],
                        label=style.IMPL_LABEL[impl] + (f", loop {loop}" if loop else ""))
        ax.set_xscale("log")
        ax.set_yscale("log")
        Ts = [r["T"] for r in doc["records"]]
        ax.set_xticks([10 ** k for k in range(len(str(min(Ts))) - 1, len(str(max(Ts))))])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: style.si_label(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        style.log_axis(ax.yaxis)
        ax.grid(which="major", lw=0.3, alpha=0.5)
        ax.set_title(WHAT[what], fontsize=8)
    axes[0].set_ylabel("time per frame (µs)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncol=2)
    fig.supxlabel(f"sequence length T (frames)\n{NAMES[r0['cell']]}, H = {r0['H']}, one stream; flat = constant "
                  "cost per frame", fontsize=7, linespacing=1.5)
    return fig


def fig_schedule_stats(doc) -> Figure:
    """Horizontal bars per cell: kernels per frame before and after merging (forward, backward) and
    the share of FLOPs hoisted out of the time loop (forward, training step)."""
    recs = doc["records"]
    fig = Figure(figsize=(style.PAGE, 1.1 + 0.2 * len(recs)), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    y = np.arange(len(recs))
    for ax, d in zip(axes[:2], ("forward", "backward")):
        before = [r["kernels_per_frame"][d]["before_merge"] for r in recs]
        after = [r["kernels_per_frame"][d]["after_merge"] for r in recs]
        ax.barh(y, before, height=0.7, color="#d9d9d9", label="one kernel per op (backward: per op input)")
        ax.barh(y, after, height=0.7, color=style.IMPL["graph"], label="scheduled: merged GEMMs, fused groups")
        for k, (b, a) in enumerate(zip(before, after)):
            ax.text(b, k, f" {b} → {a}", va="center", fontsize=6)
        ax.set_xlim(0, max(before) * 1.25)
        ax.set_xlabel(f"{d} kernels per frame")
    for key, colour, offset in (("forward", style.PART["hoisted"], -0.19), ("training", "#08519c", 0.19)):
        share = [100 * r["hoisted_flop_fraction"][key] for r in recs]
        axes[2].barh(y + offset, share, height=0.38, color=colour, label=f"FLOPs hoisted, {WHAT.get(key, key)}")
        for k, v in enumerate(share):
            axes[2].text(v, k + offset, f" {v:.0f}", va="center", fontsize=5.5)
    axes[2].set_xlim(0, 112)
    axes[2].set_xticks([0, 25, 50, 75, 100])
    axes[2].set_xlabel("FLOPs hoisted out of the loop (%)")
    axes[0].set_yticks(y, [f"{NAMES.get(r['cell'], r['cell'])} ({r['stages_per_frame']} st.)" for r in recs])
    axes[0].invert_yaxis()
    handles = [h for ax in (axes[0], axes[2]) for h in ax.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="outside upper center", ncol=2)
    r0 = recs[0]
    fig.supxlabel(f"schedules at D = {r0['D']}, H = {r0['H']}; st. = loop stages per frame; linear ops count "
                  "2·in·out FLOPs per row, elementwise ops 1 per element", fontsize=6)
    return fig


def fig_cuda_lanes(doc) -> Figure:
    """Bars per layer count: the stacked LSTM on one stream, the wavefront cell on 1, 2, 4 lanes."""
    impls = [i for i in ("graph", "staged") if _measured(doc, impl=i)]
    fig = Figure(figsize=(style.COLUMN, 0.9 + 1.3 * max(len(impls), 1)), layout="constrained")
    axes = fig.subplots(max(len(impls), 1), 2, squeeze=False, sharex=True)
    if not impls:
        why = next(r.get("skipped") or r.get("failed") for r in doc["records"])
        for ax in axes[0]:
            style.note(ax, f"no measurements:\n{why}")
        return fig
    series = list(dict.fromkeys((r["cell"], r["lanes"]) for r in _measured(doc)))
    Ls = sorted({r["layers"] for r in doc["records"]})
    width, colours = 0.8 / len(series), ["#636363", "#c6dbef", "#6baed6", "#08519c", "#08306b"]
    for row, impl in enumerate(impls):
        for col, what in enumerate(("forward", "train")):
            ax = axes[row][col]
            for j, (cell, k) in enumerate(series):
                rs = _measured(doc, impl=impl, cell=cell, lanes=k)
                t = {r["layers"]: 1e3 * r[f"{what}_ms"] / r["T"] for r in rs}
                xs = [i for i, L in enumerate(Ls) if L in t]
                if not xs:
                    continue
                ax.bar(np.array(xs) + (j - (len(series) - 1) / 2) * width, [t[Ls[i]] for i in xs], width,
                       color=colours[j % len(colours)],
                       label=f"{'stacked' if cell == 'lstm' else 'wavefront'}, {k} stream{'s' if k > 1 else ''}")
            if row == 0:
                ax.set_title(WHAT[what], fontsize=8)
            ax.grid(axis="y", lw=0.3, alpha=0.5)
            ax.set_xticks(range(len(Ls)), [str(L) for L in Ls])
        axes[row][0].set_ylabel(f"{impl}\nµs per frame")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncol=2)
    r0 = doc["records"][0]
    fig.supxlabel(f"LSTM layers (H = {r0['H']}, T = {r0['T']}, B = {r0['B']})", fontsize=8)
    return fig


DRAW = {"single_stream_speedup": fig_single_stream_speedup, "multi_stream_throughput": fig_multi_stream_throughput,
        "stage_breakdown": fig_stage_breakdown, "sequence_length": fig_sequence_length, "scan": fig_sequence_length,
        "schedule_stats": fig_schedule_stats, "cuda_lanes": fig_cuda_lanes}


def headline_table(doc) -> str:
    """Markdown: per cell and H, graph mode's speed-up over naive and over cuDNN (forward, training)."""
    rows = ["| cell | H | graph vs naive, forward | graph vs naive, training | graph vs cuDNN, forward "
            "| graph vs cuDNN, training |", "|---|---|---|---|---|---|"]
    for cell in dict.fromkeys(r["cell"] for r in doc["records"]):
        for H in sorted({r["H"] for r in doc["records"]}):
            got = {i: (_measured(doc, cell=cell, H=H, impl=i) or [None])[0] for i in ("naive", "graph", "cudnn")}
            if got["graph"] is None:
                continue
            ratio = [f"{got[ref][f'{w}_ms'] / got['graph'][f'{w}_ms']:.1f}×" if got[ref] else "–"
                     for ref in ("naive", "cudnn") for w in ("forward", "train")]
            rows.append(f"| {NAMES.get(cell, cell)} | {H} | " + " | ".join(ratio) + " |")
    if len(rows) == 2:
        rows.append("| (graph mode was not measured in these results) | | | | | |")
    m = doc["metadata"]
    rows += ["", f"{doc['label']}; {m.get('gpu') or m.get('device') or ''}, {str(m.get('date'))[:10]}. "
             f"Times are medians; ratios above 1 mean graph mode is faster. Reproduce: `{m.get('command')}`."]
    return "\n".join(rows) + "\n"
