"""Experiment cuda_lanes, as `rnngraph experiment cuda_lanes`: 2–4 LSTM layers: stacked on one CUDA stream,
against the wavefront cell (all layers' recurrent GEMMs in one stage) on one stream and on k lanes;
--help says where it writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.lab.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("cuda_lanes"))
