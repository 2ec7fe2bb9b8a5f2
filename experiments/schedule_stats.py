"""Experiment schedule_stats, as `rnngraph experiment schedule_stats`: per cell: ops, stages per frame,
kernels per frame before and after merging, share of FLOPs hoisted out of the loop (D = H = 512; pure
analysis); --help says where it writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not
from rnngraph.lab.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("schedule_stats"))
