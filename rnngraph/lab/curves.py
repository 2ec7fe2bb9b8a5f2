"""Training-curve figures from the logs `rnngraph train` writes (log.csv or log.json per run)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from . import style
from ..errors import RnnGraphError
from ..train.logs import read_log


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over `window` steps (shorter at the start), so early steps stay visible."""
    c = np.cumsum(np.insert(y, 0, 0.0))
    n = np.arange(1, len(y) + 1)
    lo = np.maximum(n - window, 0)
    return (c[n] - c[lo]) / (n - lo)


def draw_training_curves(log_paths, out_png, labels=None) -> Path:
    """Draws bits per character against step (left) and wall-clock seconds (right) for each run:
    training bpc as a thin smoothed line, validation bpc as markers joined by a line.

    log_paths: run folders, log.csv or log.json files; labels: one per run (default: the run folder's
    name). Returns the path written.

    Example::

        draw_training_curves(["runs/train", "runs/gpu"], "figures/training_curves.png")
    """
    paths = [Path(p) for p in ([log_paths] if isinstance(log_paths, (str, Path)) else log_paths)]
    if not paths:
        raise RnnGraphError("draw_training_curves needs at least one log")
    labels = labels or [(p if p.is_dir() else p.parent).resolve().name for p in paths]
    logs = [read_log(p) for p in paths]
    with style.context():
        fig = Figure(figsize=(8.0, 3.2))
        axes = fig.subplots(1, 2, sharey=True)
        for (log, label), colour in zip(zip(logs, labels), _colours(len(logs))):
            if len(log["step"]) == 0:
                raise RnnGraphError(f"the training log of {label} has no rows yet")
            smooth = _smooth(log["bpc"], max(1, len(log["bpc"]) // 50))
            val = ~np.isnan(log["val_bpc"])
            for ax, x in zip(axes, (log["step"], log["elapsed_s"])):
                ax.plot(x, smooth, color=colour, lw=0.9, alpha=0.75, label=f"{label} train")
                ax.plot(x[val], log["val_bpc"][val], "o-", color=colour, ms=3.5, lw=1.4,
                        label=f"{label} validation")
        axes[0].set_xlabel("step")
        axes[1].set_xlabel("seconds")
        axes[0].set_ylabel("bits per character")
        axes[0].legend(loc="upper right")
        fig.suptitle("Character-level training curves", x=0.02, ha="left", fontsize=10)
        out = Path(out_png)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(out)
        except OSError as e:
            raise RnnGraphError(f"cannot write {out}: {e.strerror or e}") from None
    return out


def with_rows(logs: list) -> list:
    """The logs that hold rows; each one that does not (a run stopped before its first logged step) is
    named in a note on stderr."""
    keep = [log for log in logs if len(read_log(log)["step"])]
    for log in (log for log in logs if log not in keep):
        print(f"rnngraph: note: skipped {log}: the training log has no rows yet", file=sys.stderr)
    return keep


def _colours(n: int):
    return [style.SERIES[i % len(style.SERIES)] for i in range(n)]
