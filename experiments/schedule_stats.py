"""Experiment schedule_stats: per cell: ops, stages per frame, kernels per frame before and after
merging, share of FLOPs hoisted out of the loop (D = H = 512; pure analysis).

    python experiments/schedule_stats.py [--quick] [--out DIR] [--repeats N]
    rnngraph experiment schedule_stats [--quick] [--out DIR] [--repeats N]      (the same)

writes experiments/results/schedule_stats.json, or with --quick the labelled CPU sample
experiments/results/quick/schedule_stats.json. The grid and the measurement live in
rnngraph/experiments.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("schedule_stats"))
