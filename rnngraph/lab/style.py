"""One look for every rnngraph figure: the palette, fonts and rcParams (used through `context()`), the
log-axis tick labels, and the note an empty panel shows."""
from __future__ import annotations

import matplotlib
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

# Sections of a schedule; loop stages cycle through STAGES (warm colours: "runs every frame").
SECTION = {
    "input": "#d9d9d9",   # inputs and delayed state reads
    "pre": "#9ecae1",     # hoisted, once over all T·B rows
    "post": "#a1d99b",    # once over all frames, after the loop
}
STAGES = ("#fdae6b", "#fc9272", "#fdd0a2", "#fb6a4a", "#fee391", "#f4a582")
BAND_ALPHA = 0.18         # section background bands

INK = "#252525"           # text and node borders
EDGE = "#737373"          # same-frame dataflow
DELAY = "#cb181d"         # delayed (recurrent) edges
GEMM = "#3f007d"          # merged-GEMM outline
FUSED = "#00441b"         # fused elementwise group outline

# Qualitative series colours for line plots of later figures (colour-blind safe, Okabe–Ito).
SERIES = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000")

# Timing figures: one colour per implementation and per part of a frame's time, in every figure.
IMPL = {"naive": "#999999", "staged": "#e69f00", "graph": "#0072b2", "cudnn": "#000000", "torch_eager": "#cc79a7",
        "jax_scan": "#56b4e9", "torch_compile": "#009e73"}
IMPL_LABEL = {"naive": "naive (node by node)", "staged": "staged (eager)", "graph": "graph (CUDA-graph replay)",
              "cudnn": "cuDNN (torch)", "torch_eager": "torch eager loop", "jax_scan": "JAX associative_scan (jit)",
              "torch_compile": "torch.compile of the loop"}
LOOP = {"stages": "#0072b2", "elementwise": "#009e73", "scan": "#d55e00"}   # a mode's series, by loop strategy
PART = {"hoisted": "#6baed6", "per_frame_gemm": "#807dba", "fused_elementwise": "#74c476",
        "launch_overhead": "#bdbdbd"}   # blue, purple, green as the schedule diagram's pre, GEMM, fused
COLUMN, PAGE = 3.5, 7.16                # figure widths in inches: one column, both columns
FOOTNOTE = {"fontsize": 5.5, "color": "#636363"}

RC = {
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "axes.titlesize": 10,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": matplotlib.cycler(color=SERIES),
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
}


def stage_colour(k: int) -> str:
    return STAGES[k % len(STAGES)]


def context():
    """rcParams for one figure: ``with style.context(): fig = Figure(); ...; fig.savefig(path)``."""
    return matplotlib.rc_context(RC)


def note(ax, text: str):
    """A figure with no data says why, in the middle of its axes."""
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])


def log_axis(axis, fmt=lambda v: f"{v:g}"):
    """A log axis labelled at 1, 2, 5, 10, …, with `fmt` (a number -> its tick label)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    axis.set_minor_formatter(NullFormatter())


def si_label(v: float) -> str:
    """10000 -> '10k', 1e6 -> '1M'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"
