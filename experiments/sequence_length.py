"""Experiment sequence_length, as `rnngraph experiment sequence_length`: cost per frame for T = 10 …
10,000, LSTM H = 512, one stream; --help says where it writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.lab.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("sequence_length"))
