"""Probe: graph mode fed calls of random shapes (issue 18's load probe), with and without shape buckets.

An LSTM layer (graph mode, float32) runs forward and backward on `--calls` batches whose T is drawn
uniformly from [--tmin, --tmax) (and B from [--bmin, --bmax] when they differ). It prints, every tenth of
the run, the recorded graphs, the device memory in use (driver) and the layer's arenas, then the mean time
per call against the same layer replaying one fixed T (the mean T, unpadded), and checks a sample of
calls against staged mode. A probe, not an experiment: it prints, it writes no results file.

    python experiments/graph_shapes_probe.py [--calls 300] [--tmin 5 --tmax 400] [--bmin 8 --bmax 8] [--H 256] [--chunk K]

--chunk K records chunks of K frames (run/chunks.py; default: the backend's, RNNGRAPH_CHUNK_FRAMES or 128;
0: whole calls). The fixed-T replay it compares with runs whole calls, as graph mode did before chunks.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in (("calls", 300), ("tmin", 5), ("tmax", 400), ("bmin", 8), ("bmax", 8), ("H", 256), ("check", 5),
                 ("chunk", None)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--no-buckets", action="store_true", help="buckets=False: one recording per distinct shape "
                    "(default: the automatic policy, padding after 8 distinct shapes)")
    args = ap.parse_args(argv)
    import cupy

    from rnngraph.lab.bench import machine_info
    from rnngraph.nn.recurrent import Recurrent
    H, rng = args.H, np.random.default_rng(0)
    layer = Recurrent("lstm", H, H, backend="cupy", mode="graph", buckets=False if args.no_buckets else None)
    if args.chunk is not None:
        layer.backend.chunk_frames = args.chunk
    staged = Recurrent("lstm", H, H, backend="cupy", mode="staged")
    staged.load_state_dict(layer.state_dict())
    ex = layer._stack.runs[0][0].ex

    def used() -> int:
        free, total = cupy.cuda.runtime.memGetInfo()
        return total - free

    pool = cupy.asarray(rng.standard_normal((args.tmax, args.bmax, H), dtype=np.float32))

    def call(T, B, layer=layer):
        x = pool[:T, :B]
        y, _ = layer(x)
        return x, y, layer.backward(cupy.ones_like(y))

    print(" ".join(f"{k}={v}" for k, v in machine_info().items() if k in ("gpu", "cupy", "commit")))
    print(f"LSTM H={H}, graph mode, buckets {'off' if args.no_buckets else 'automatic'}, chunks of "
          f"{layer.backend.chunk_frames or 'no'} frames: {args.calls} calls, T in [{args.tmin}, {args.tmax}), "
          f"B in [{args.bmin}, {args.bmax}]")
    print(f"{'calls':>6s} {'graphs':>7s} {'graph MB':>9s} {'arenas MB':>10s} {'device MB':>10s} {'ms/call':>8s}")

    def arenas() -> int:        # the workspaces' arenas and the chunks' buffers (outputs, values set aside)
        return ex.arenas.nbytes + (ex.chunks.bufs.nbytes if ex.chunks else 0)
    shapes = [(int(rng.integers(args.tmin, args.tmax)), int(rng.integers(args.bmin, args.bmax + 1)))
              for _ in range(args.calls)]
    worst, sample = 0.0, set(np.linspace(0, args.calls - 1, args.check).astype(int))
    t0, last = time.perf_counter(), 0
    for k, (T, B) in enumerate(shapes):
        x, y, (gx, _, grads) = call(T, B)
        if k in sample:
            ys, _ = staged(x)
            gs = staged.backward(cupy.ones_like(ys))
            for a, b in [(y, ys), (gx, gs[0])] + [(grads[n], gs[2][n]) for n in grads]:
                worst = max(worst, float(cupy.abs(a - b).max() / max(float(cupy.abs(b).max()), 1e-30)))
        if (k + 1) % max(args.calls // 10, 1) == 0:
            cupy.cuda.get_current_stream().synchronize()
            now = time.perf_counter()
            info = layer.backend.cache_info()
            print(f"{k + 1:6d} {info['graphs']:7d} {info['graph_bytes'] / 2**20:9.1f} {arenas() / 2**20:10.1f} "
                  f"{used() / 2**20:10.0f} {1e3 * (now - t0) / (k + 1 - last):8.2f}")
            t0, last = now, k + 1
    late = shapes[args.calls // 2:]          # the second half: after warm-up
    start = time.perf_counter()
    for T, B in late:
        call(T, B)
    cupy.cuda.get_current_stream().synchronize()
    mean_call = (time.perf_counter() - start) / len(late) * 1e3
    fixed = Recurrent("lstm", H, H, backend="cupy", mode="graph", buckets=False)
    fixed.backend.chunk_frames = 0
    Tm, Bm = round(np.mean([s[0] for s in late])), round(np.mean([s[1] for s in late]))
    for _ in range(3):
        call(Tm, Bm, fixed)
    cupy.cuda.get_current_stream().synchronize()
    start = time.perf_counter()
    for _ in range(len(late)):
        call(Tm, Bm, fixed)
    cupy.cuda.get_current_stream().synchronize()
    fixed_call = (time.perf_counter() - start) / len(late) * 1e3
    print(f"second half again: {mean_call:.2f} ms/call; fixed T={Tm} B={Bm} replay: {fixed_call:.2f} ms/call "
          f"(ratio {mean_call / fixed_call:.2f}); staged check on {len(sample)} calls: worst relative error {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
