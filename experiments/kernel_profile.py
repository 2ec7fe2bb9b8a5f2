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


MIX = {"FFMA": "fma", "HMMA": "mma", "LDS": "lds", "LDG": "ldg", "LDGSTS": "cp.async", "STG": "stg", "MUFU": "mufu",
       "BAR": "bar"}        # SASS opcodes a region's instruction mix counts, by the name it prints


def stall_regions(path) -> dict:
    """Per kernel of ncu's source page (`ncu -i R --page source --csv --print-source sass`): its regions, runs of
    consecutive SASS lines executed equally often (the code one set of warps runs together: a GEMM, a fused body, a
    barrier's wait), in address order, each {address, lines, executed, samples, stalls {reason: samples}, mix}."""
    kernels, rows = {}, None
    for line in csv.reader(open(path)):
        if line[:1] == ["Kernel Name"]:
            regions = kernels.setdefault(line[1], [])
            rows = None
        elif rows is None and "Address" in line:
            rows = line
        elif rows is not None and len(line) == len(rows):
            r = dict(zip(rows, line))
            n, samples = int(r["Instructions Executed"] or 0), int(r["Warp Stall Sampling (All Samples)"] or 0)
            if not regions or regions[-1]["executed"] != n:
                regions.append({"address": r["Address"], "lines": 0, "executed": n, "samples": 0,
                                "stalls": defaultdict(int), "mix": defaultdict(int)})
            g = regions[-1]
            g["lines"] += 1
            g["samples"] += samples
            for k, v in r.items():
                if k.startswith("stall_") and "Not Issued" not in k and v and int(v):
                    g["stalls"][k[6:]] += int(v)
            op = next((w for w in r["Source"].split() if not w.startswith("@")), "").split(".")[0]
            if op in MIX:
                g["mix"][MIX[op]] += 1
    return kernels


def summarise_stalls(path, share: float = 0.02):
    """Each kernel's samples and main stall reasons, then its regions holding at least `share` of its samples."""
    for name, regions in stall_regions(path).items():
        total = sum(g["samples"] for g in regions) or 1
        reasons = defaultdict(int)
        for g in regions:
            for k, v in g["stalls"].items():
                reasons[k] += v
        top = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:5])
        print(f"{name}: {total} samples; {top}")
        for g in regions:
            if g["samples"] >= share * total:
                why = ", ".join(f"{k} {v / g['samples']:.0%}" for k, v in
                                sorted(g["stalls"].items(), key=lambda kv: -kv[1])[:2])
                mix = " ".join(f"{k} {v}" for k, v in g["mix"].items())
                print(f"  {g['address'][-6:]} {g['lines']:4d} lines x{g['executed']:<9d} {g['samples'] / total:4.0%}"
                      f"  ({why})  {mix}")


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
    p.add_argument("--stalls", metavar="CSV", help="summarise ncu's source page (gpu_checks.sh stalls writes it)")
    a = p.parse_args()
    summarise(a.summarise) if a.summarise else summarise_stalls(a.stalls) if a.stalls else step(a)
