"""Experiment single_stream_speedup, as `rnngraph experiment single_stream_speedup`: staged and graph modes
against naive at one stream (B = 1): LSTM, peephole LSTM, GRU, minGRU and a user-defined MGU, H = 128 …
2048, forward and training step; --help says where it writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.lab.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("single_stream_speedup"))
