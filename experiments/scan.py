"""Experiment scan, as `rnngraph experiment scan`: minGRU's cost per frame for T = 100 … 16,384 with
each loop strategy (stages, elementwise, scan) and JAX's associative scan; --help says where it writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.lab.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("scan"))
