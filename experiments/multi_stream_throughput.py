"""Experiment multi_stream_throughput: training frames per second against parallel streams S = 1 … 256
(the batch), LSTM H = 512.

    python experiments/multi_stream_throughput.py [--quick] [--out DIR] [--repeats N]
    rnngraph experiment multi_stream_throughput [--quick] [--out DIR] [--repeats N]      (the same)

writes experiments/results/multi_stream_throughput.json, or with --quick the labelled CPU sample
experiments/results/quick/multi_stream_throughput.json. The grid and the measurement live in
rnngraph/experiments.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("multi_stream_throughput"))
