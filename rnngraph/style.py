"""One look for every rnngraph figure: the palette, fonts and rcParams, used through `context()`."""
from __future__ import annotations

import matplotlib

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
