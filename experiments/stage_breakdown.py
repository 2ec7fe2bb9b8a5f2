"""Experiment stage_breakdown, as `rnngraph experiment stage_breakdown`: forward time per frame split into
hoisted GEMMs, per-frame GEMM, fused elementwise and launch/host overhead, by variants that leave one
part out; --help says where it writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.lab.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("stage_breakdown"))
