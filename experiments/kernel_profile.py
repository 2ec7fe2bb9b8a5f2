"""One training step's kernels, each timed alone by Nsight Compute: run it under
    ncu --nvtx --nvtx-include "step/" --metrics gpu__time_duration.sum --csv python3 experiments/kernel_profile.py ...
and pass the CSV to --summarise (`experiments/gpu_checks.sh profile ...` does both; `gpu_checks.sh stalls ...`
keeps the persistent kernels' warp stall reasons, per SASS line, instead). It warms an implementation of
`rnngraph bench` up (recordings, autotuning), then runs one forward and backward inside the NVTX range "step", so
ncu times that step's kernels and nothing else.
"""
import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not


def step(args):
    import cupy
    from cupyx.profiler import time_range
    from rnngraph.lab import bench
    from rnngraph.lab.jax_refs import jax_fns
    if args.impl == "jax_scan":
        fns = jax_fns(args.cell, args.T, args.B, args.H, args.H, args.dtype, 0, False)[0]
    else:
        options = {"heads": args.heads} if args.heads else None
        fns = bench._rnngraph_fns(args.cell, args.impl, args.T, args.B, args.H, args.H, 1, args.dtype, 0, args.loop,
                                  options)[0]
    for _ in range(3):
        fns["train"]()
    cupy.cuda.Device().synchronize()
    with time_range("step"):
        fns["train"]()
        cupy.cuda.Device().synchronize()


UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}    # ncu's -> µs


def kernel_times(path) -> list:
    """(kernel name, launches, total µs), largest first, from ncu's CSV (its log lines, unquoted, are skipped)."""
    rows = csv.DictReader(line for line in open(path) if line.startswith('"'))
    total = defaultdict(lambda: [0, 0.0])
    for r in rows:
        if r.get("Metric Name") == "gpu__time_duration.sum":
            t = total[r["Kernel Name"][:90]]
            t[0] += 1
            t[1] += float(r["Metric Value"].replace(",", "")) * UNITS[r["Metric Unit"]]
    return sorted(((name, n, us) for name, (n, us) in total.items()), key=lambda row: -row[2])


def summarise(path):
    times = kernel_times(path)
    for name, n, us in times:
        print(f"{us:10.1f} us {n:4d}x  {name}")
    print(f"{sum(us for *_, us in times):10.1f} us in all, {sum(n for _, n, _ in times)} kernels")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cell", default="min_gru")
    p.add_argument("--impl", default="staged", help="staged, graph or jax_scan")
    p.add_argument("--loop", default="auto")
    p.add_argument("-T", type=int, default=4096)
    p.add_argument("-B", type=int, default=1)
    p.add_argument("-H", type=int, default=512)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--heads", type=int, help="the cell's heads (slstm, mh_lstm)")
    p.add_argument("--summarise", metavar="CSV")
    a = p.parse_args()
    summarise(a.summarise) if a.summarise else step(a)
