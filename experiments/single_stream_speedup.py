"""Experiment single_stream_speedup: staged and graph modes against naive at one stream (B = 1): LSTM,
peephole LSTM, GRU, minGRU and a user-defined MGU, H = 128 … 2048, forward and training step.

    python experiments/single_stream_speedup.py [--quick] [--out DIR] [--repeats N]
    rnngraph experiment single_stream_speedup [--quick] [--out DIR] [--repeats N]      (the same)

writes experiments/results/single_stream_speedup.json, or with --quick the labelled CPU sample
experiments/results/quick/single_stream_speedup.json. The grid and the measurement live in
rnngraph/experiments.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("single_stream_speedup"))
