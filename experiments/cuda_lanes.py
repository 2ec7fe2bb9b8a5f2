"""Experiment cuda_lanes: 2–4 LSTM layers: stacked on one CUDA stream, against the wavefront cell (all
layers' recurrent GEMMs in one stage) on one stream and on k lanes.

    python experiments/cuda_lanes.py [--quick] [--out DIR] [--repeats N]
    rnngraph experiment cuda_lanes [--quick] [--out DIR] [--repeats N]      (the same)

writes experiments/results/cuda_lanes.json, or with --quick the labelled CPU sample
experiments/results/quick/cuda_lanes.json. The grid and the measurement live in
rnngraph/experiments.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("cuda_lanes"))
