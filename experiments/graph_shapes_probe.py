"""Probe: graph mode fed calls of random shapes, forward and backward: what it records and holds, and its speed.

An LSTM layer (graph mode, float32, the automatic shape policy: the first 4 shapes exact, then B padded to its
step of a ladder and T run in the executor's ladder of chunks) runs forward and backward on `--calls` batches whose
T is drawn uniformly from [--tmin, --tmax) and B from [--bmin, --bmax]. It prints, every tenth of the run, the
recorded graphs, the layer's arenas, the memory pool's bytes in use and held, and the device memory in use
(driver); then the graphs recorded after the first --warm calls, the mean time per call of the second half (as
it ran) against the same layer's weights replaying one fixed shape of the mean size (exact); --pairs calls of the
second half timed three ways, interleaved: as the policy runs them, at their exact shapes, and at their exact T
with B padded to the policy's step (so the ladder of chunks and the padding of B each show their cost); and the
worst relative error of a sample of calls against staged mode (their results kept on the host and checked after the
run, so that staged mode's memory stays out of the rows). A probe, not an experiment: it prints, and writes
JSON where --json says.

    python experiments/graph_shapes_probe.py [--calls 10000] [--tmin 1 --tmax 2001] [--bmin 1 --bmax 64] [--H 256]
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in (("calls", 10000), ("tmin", 1), ("tmax", 2001), ("bmin", 1), ("bmax", 64), ("H", 256), ("check", 8),
                 ("warm", 200)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--pairs", type=int, default=32,
                    help="calls timed as the policy runs them, exact, and at exact T with B padded")
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args(argv)
    import cupy

    from rnngraph.lab.bench import machine_info
    from rnngraph.nn.buckets import bucket
    from rnngraph.nn.recurrent import Recurrent
    from rnngraph.run.settings import store_limit
    H, rng = args.H, np.random.default_rng(0)
    layer = Recurrent("lstm", H, H, backend="cupy", mode="graph")
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

    info = machine_info()
    print(" ".join(f"{k}={v}" for k, v in info.items() if k in ("gpu", "cupy", "commit")))
    print(f"LSTM H={H}, graph mode, the automatic shape policy: {args.calls} calls, T in [{args.tmin}, {args.tmax}), "
          f"B in [{args.bmin}, {args.bmax}]")
    print(f"{'calls':>6s} {'graphs':>7s} {'graph MB':>9s} {'arenas MB':>10s} {'pool MB':>8s} {'held MB':>8s} "
          f"{'device MB':>10s} {'ms/call':>8s}")

    def arenas() -> int:        # the workspaces' arenas and the chunks' own buffers (outputs, input gradients)
        return ex.arenas.nbytes + (ex.chunks.bufs.nbytes if ex.chunks else 0)
    shapes = [(int(rng.integers(args.tmin, args.tmax)), int(rng.integers(args.bmin, args.bmax + 1)))
              for _ in range(args.calls)]
    sample, recomputed, kept = set(np.linspace(0, args.calls - 1, args.check).astype(int)), 0, []
    t0, last, at_warm, rows = time.perf_counter(), 0, None, []
    for k, (T, B) in enumerate(shapes):
        x, y, (gx, _, grads) = call(T, B)
        recomputed += layer.recomputed          # the call's values exceeded RNNGRAPH_STORE_BYTES
        if k in sample:             # kept on the host, checked after the run; the copy's time left out of the row's
            cupy.cuda.get_current_stream().synchronize()
            aside = time.perf_counter()
            kept.append((T, B, [cupy.asnumpy(a) for a in [y, gx] + [grads[n] for n in sorted(grads)]]))
            t0 += time.perf_counter() - aside
        if k + 1 == args.warm:
            cupy.cuda.get_current_stream().synchronize()
            at_warm = (layer.backend.cache_info()["graphs"], used())
        if (k + 1) % max(args.calls // 10, 1) == 0:
            cupy.cuda.get_current_stream().synchronize()
            now = time.perf_counter()
            g = layer.backend.cache_info()
            mempool = cupy.get_default_memory_pool()
            rows.append(dict(calls=k + 1, graphs=g["graphs"], graph_mb=g["graph_bytes"] / 2**20,
                             arenas_mb=arenas() / 2**20, pool_used_mb=mempool.used_bytes() / 2**20,
                             pool_held_mb=mempool.total_bytes() / 2**20, device_mb=used() / 2**20,
                             ms_per_call=1e3 * (now - t0) / (k + 1 - last)))
            print("{calls:6d} {graphs:7d} {graph_mb:9.1f} {arenas_mb:10.1f} {pool_used_mb:8.0f} {pool_held_mb:8.0f} "
                  "{device_mb:10.0f} {ms_per_call:8.2f}".format(**rows[-1]))
            t0, last = now, k + 1
    cupy.cuda.get_current_stream().synchronize()
    end = (layer.backend.cache_info()["graphs"], used())     # before the layers timed beside it take memory
    late = shapes[args.calls // 2:]          # the second half: after warm-up, timed as it ran (the last tenths)
    halves = [r["ms_per_call"] for r in rows[len(rows) // 2:]]
    mean_call = float(np.mean(halves))
    fixed = Recurrent("lstm", H, H, backend="cupy", mode="graph", buckets=False)
    fixed.load_state_dict(layer.state_dict())
    Tm, Bm = round(np.mean([s[0] for s in late])), round(np.mean([s[1] for s in late]))
    for _ in range(3):
        call(Tm, Bm, fixed)
    cupy.cuda.get_current_stream().synchronize()
    start, n_fixed = time.perf_counter(), min(len(late), 300)
    for _ in range(n_fixed):
        call(Tm, Bm, fixed)
    cupy.cuda.get_current_stream().synchronize()
    fixed_call = (time.perf_counter() - start) / n_fixed * 1e3
    paired = [late[i] for i in np.linspace(0, len(late) - 1, args.pairs).astype(int)]
    policy_ms, padded_ms, exact_ms = timed_pairs(call, [(layer, None), (fixed, bucket), (fixed, None)], paired)
    worst = 0.0                 # the sample against staged mode, after the run (its memory outside the run's rows)
    for T, B, got in kept:
        x = pool[:T, :B]
        ys, _ = staged(x)
        gs = staged.backward(cupy.ones_like(ys))
        for a, b in zip(got, [ys, gs[0]] + [gs[2][n] for n in sorted(gs[2])], strict=True):
            b = cupy.asnumpy(b)
            worst = max(worst, float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30)))
    summary = dict(graphs_after_warm_up=end[0] - at_warm[0], graphs=end[0], graphs_at_warm_up=at_warm[0],
                   recomputed_calls=recomputed, store_limit_bytes=store_limit(layer.backend),
                   chunk_frames=ex.chunk_frames,
                   device_mb_at_warm_up=at_warm[1] / 2**20, device_mb_at_end=end[1] / 2**20, ms_per_call=mean_call,
                   fixed_shape=[Tm, Bm], fixed_ms_per_call=fixed_call, ratio=mean_call / fixed_call,
                   paired_calls=len(paired), paired_policy_ms=policy_ms, paired_exact_ms=exact_ms,
                   paired_ratio=policy_ms / exact_ms, paired_padded_ms=padded_ms, fixed_loop=loop_at(layer, Bm),
                   padded_loop=loop_at(layer, bucket(Bm + 1)),
                   staged_check_calls=len(sample), worst_relative_error=worst)
    print(f"{recomputed} of {args.calls} calls recomputed (their values over RNNGRAPH_STORE_BYTES)")
    print(f"after call {args.warm}: {summary['graphs_after_warm_up']} graphs recorded ({at_warm[0]} then, "
          f"{end[0]} in all); "
          f"device {at_warm[1] / 2**20:.0f} MB then, {end[1] / 2**20:.0f} MB at the end")
    print(f"second half: {mean_call:.2f} ms/call; fixed T={Tm} B={Bm} replay: {fixed_call:.2f} ms/call "
          f"(ratio {mean_call / fixed_call:.2f}); staged check on {len(sample)} calls: worst relative error "
          f"{worst:.1e}")
    print(f"{len(paired)} calls of the second half, each as the policy runs it, at its exact shape and at its exact "
          f"T with B padded to its step: {policy_ms:.2f}, {exact_ms:.2f} and {padded_ms:.2f} ms/call (the policy's "
          f"ladder of chunks {policy_ms / padded_ms:.3f}x, padding B {padded_ms / exact_ms:.3f}x)")
    if args.json:               # as `rnngraph bench --json` writes (machine, settings, results), and the summary
        Path(args.json).write_text(json.dumps(dict(machine=info, settings=vars(args), results=rows, summary=summary),
                                              indent=1))
    return 0


def loop_at(layer, B: int) -> str:
    """The loop the GPU runs for the layer at B rows, in words (`rnngraph schedule --batch`)."""
    from rnngraph.lab.gpu_loop import gpu_loop
    from rnngraph.plan.schedule import build_schedule
    return gpu_loop(build_schedule(layer.cells[0], loop="auto"), B, "float32", auto=True).rsplit(", on ", 1)[0]


def timed_pairs(call, variants, shapes, repeats: int = 3) -> list:
    """The mean ms a call of `shapes` takes in each variant (layer, a function of B giving the rows it runs, or None
    for B itself): the policy's layer with its recordings warm, or a layer of the same weights replaying each shape
    exactly, warmed on it first; interleaved shape by shape so that every variant sees the same GPU."""
    import cupy
    sums = [0.0] * len(variants)
    for T, B in shapes:
        for i, (net, rows) in enumerate(variants):
            shape = (T, rows(B) if rows else B)
            for _ in range(2 if net is not variants[0][0] else 0):
                call(*shape, net)
            cupy.cuda.get_current_stream().synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                call(*shape, net)
            cupy.cuda.get_current_stream().synchronize()
            sums[i] += (time.perf_counter() - start) / repeats * 1e3
    return [s / len(shapes) for s in sums]


if __name__ == "__main__":
    sys.exit(main())
