"""How many rows a row group of the persistent kernel should hold, on the GPU: for each cell and B, the kernel as
runner.chosen picks it next to the one picked with RNNGRAPH_PERSISTENT_ROWS set (groups of at most that many
rows), both built and warmed in one process, then timed in alternating rounds (CUDA events, medians), so that a
difference between processes cannot pass for one between kernels. A probe that prints a table:

    PYTHONPATH=. python3 experiments/persistent_rows.py [--cell lstm,gru,mgu] [-B 48,64,96] [-H 512] [-T 100]
                                                        [--dtype bfloat16] [--rows 8] [--tf32] [--shared]

The training step (forward and backward with every gradient), loop 'persistent'; each row names the kernel each
side ran (rnngraph schedule CELL --batch B --dtype D says the same for the default). --shared: the other side
skips runner.chosen's preference for groups whose weights sit in registers, so that its first choice of groups
runs even where its weights stay in shared memory.
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnngraph import build_schedule, load_cell            # noqa: E402
from rnngraph.lab import bench                             # noqa: E402
from rnngraph.lab.gpu_loop import gpu_loop                 # noqa: E402
from rnngraph.run.backends.cuda.persistent import runner   # noqa: E402

VARIABLE = "RNNGRAPH_PERSISTENT_ROWS"


def built(cell: str, T: int, B: int, H: int, dtype: str, rows: int | None, tf32: bool, shared: bool = False):
    """(a training step, the kernel it runs), chosen with `rows` as RNNGRAPH_PERSISTENT_ROWS (None: unset) and,
    where `shared`, no preference for weights in registers."""
    import cupy
    os.environ.pop(VARIABLE, None)
    if rows:
        os.environ[VARIABLE] = str(rows)
    first = runner.RESIDENT_ROWS
    runner.RESIDENT_ROWS = 0 if shared else first
    try:
        fns = bench._rnngraph_fns(cell, "graph", T, B, H, H, 1, dtype, 0, "persistent")[0]
        for _ in range(3):          # records the step, choosing the kernel while the variable is set
            fns["train"]()
        cupy.cuda.Device().synchronize()
        ran = gpu_loop(build_schedule(load_cell(cell, H, H), loop="persistent"), B, dtype, auto=False, tf32=tf32)
    finally:
        os.environ.pop(VARIABLE, None)
        runner.RESIDENT_ROWS = first
    return fns["train"], ran.rsplit(", on ", 1)[0]


def per_step(fn, n: int = 10) -> float:
    """ms a call of fn, over n calls back to back between two CUDA events."""
    import cupy
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", default="lstm,gru,mgu")
    ap.add_argument("-B", default="48,64,96")
    ap.add_argument("-H", type=int, default=512)
    ap.add_argument("-T", type=int, default=100)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", type=int, default=8, help="the rows a group set against the default")
    ap.add_argument("--tf32", action="store_true", help="float32 with TF32 allowed")
    ap.add_argument("--shared", action="store_true", help="the other side without the registers' preference")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args(argv)
    bench.set_tf32(args.tf32)
    print(f"training step ms, T = {args.T}, H = {args.H}, {args.dtype}{' (TF32)' * args.tf32}, loop 'persistent': "
          f"the default against {VARIABLE}={args.rows}{' without the registers first' * args.shared}")
    for cell in args.cell.split(","):
        for B in map(int, args.B.split(",")):
            (a, ran_a), (b, ran_b) = (built(cell, args.T, B, args.H, args.dtype, r, args.tf32, s)
                                      for r, s in ((None, False), (args.rows, args.shared)))
            ta, tb = [], []
            for r in range(args.rounds):        # alternating, each side first in half the rounds
                for fn, ts in ((a, ta), (b, tb))[::1 if r % 2 == 0 else -1]:
                    ts.append(per_step(fn))
            ma, mb = statistics.median(ta), statistics.median(tb)
            print(f"{cell:5s} B={B:3d}  default {ma:6.3f} ({ran_a})  rows {args.rows}: {mb:6.3f} ({ran_b})  "
                  f"ratio {mb / ma:.3f}", flush=True)


if __name__ == "__main__":
    main()
