"""Experiment multi_stream_throughput, as `rnngraph experiment multi_stream_throughput`: training frames
per second against parallel streams S = 1 … 256 (the batch), LSTM H = 512; --help says where it writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.lab.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("multi_stream_throughput"))
