"""Experiment sequence_length: cost per frame for T = 10 … 10,000, LSTM H = 512, one stream.

    python experiments/sequence_length.py [--quick] [--out DIR] [--repeats N]
    rnngraph experiment sequence_length [--quick] [--out DIR] [--repeats N]      (the same)

writes experiments/results/sequence_length.json, or with --quick the labelled CPU sample
experiments/results/quick/sequence_length.json. The grid and the measurement live in
rnngraph/experiments.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("sequence_length"))
