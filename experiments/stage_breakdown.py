"""Experiment stage_breakdown: forward time per frame split into hoisted GEMMs, per-frame GEMM, fused
elementwise and launch/host overhead, by variants that leave one part out.

    python experiments/stage_breakdown.py [--quick] [--out DIR] [--repeats N]
    rnngraph experiment stage_breakdown [--quick] [--out DIR] [--repeats N]      (the same)

writes experiments/results/stage_breakdown.json, or with --quick the labelled CPU sample
experiments/results/quick/stage_breakdown.json. The grid and the measurement live in
rnngraph/experiments.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("stage_breakdown"))
