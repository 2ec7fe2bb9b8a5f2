"""Probe: what chunks of time cost in graph mode, per loop strategy: a training step (forward and backward) with
the strategy's default chunks, with chunks off (whole calls, one recording per T), and in the ladder of chunks
that calls of many lengths run in (buckets=True), timed side by side in one process with CUDA events, the
three interleaved round by round, the median of each.

    python experiments/chunk_overhead.py [--T 1000,4096] [--B 1,64] [--H 512] [--rounds 5] [--repeats 5] [--json PATH]
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

CASES = (("lstm", "persistent"), ("lstm", "stages"), ("min_gru", "scan"), ("min_gru", "elementwise"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="1000,4096")
    ap.add_argument("--B", default="1,64")
    ap.add_argument("--H", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import cupy

    from rnngraph.lab.bench import machine_info, time_ms
    from rnngraph.nn.recurrent import Recurrent
    from rnngraph.run.backends.cuda.backend import CupyBackend
    info, rows = machine_info(), []
    print(" ".join(f"{k}={v}" for k, v in info.items() if k in ("gpu", "cupy", "commit")))
    print(f"{'cell':8s} {'loop':12s} {'T':>5s} {'B':>3s} {'K':>5s} {'chunks ms':>10s} {'whole ms':>9s} {'ladder ms':>10s}"
          f" {'chunks/whole':>12s} {'ladder/whole':>12s}")
    for cell, loop in CASES:
        for T in map(int, args.T.split(",")):
            for B in map(int, args.B.split(",")):
                rng = np.random.default_rng(0)
                x = cupy.asarray(rng.standard_normal((T, B, args.H)).astype(np.float32))
                gy = cupy.asarray(rng.standard_normal((T, B, args.H)).astype(np.float32))
                kinds = {"chunks": (CupyBackend("graph"), False), "whole": (CupyBackend("graph", chunk_frames=0), False),
                         "ladder": (CupyBackend("graph"), True)}
                layers = {k: Recurrent(cell, args.H, args.H, backend=be, loop=loop, seed=1, buckets=b)
                          for k, (be, b) in kinds.items()}

                def step(layer):
                    layer(x)
                    layer.backward(gy)
                times = {k: [] for k in layers}
                for _ in range(args.rounds):
                    for k, layer in layers.items():
                        times[k] += time_ms(lambda: step(layer), repeats=args.repeats, warmup=1, device="gpu")
                ms = {k: float(np.median(v)) for k, v in times.items()}
                ex = layers["chunks"]._stack.runs[0][0].ex
                rows.append(dict(cell=cell, loop=loop, T=T, B=B, H=args.H, K=ex.chunk_frames, ran=layers["chunks"].loop_strategy,
                                 **{f"{k}_ms": v for k, v in ms.items()},
                                 **{f"{k}_recomputed": bool(layer.recomputed) for k, layer in layers.items()}))
                print(f"{cell:8s} {loop:12s} {T:5d} {B:3d} {ex.chunk_frames:5d} {ms['chunks']:10.3f} {ms['whole']:9.3f} "
                      f"{ms['ladder']:10.3f} {ms['chunks'] / ms['whole']:12.3f} {ms['ladder'] / ms['whole']:12.3f}")
                del layers
    if args.json:               # as `rnngraph bench --json` writes: machine (with the command), settings, results
        Path(args.json).write_text(json.dumps(dict(machine=info, settings=vars(args), results=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
