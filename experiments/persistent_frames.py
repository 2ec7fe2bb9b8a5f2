"""Per-frame latency of loop strategy 'persistent' against 'stages', cuDNN and torch.compile, and the cost
of one grid barrier, on the GPU. A probe that prints a table (no results file):

    PYTHONPATH=. python3 experiments/persistent_frames.py [--cells lstm,gru] [--repeats 30]

A frame's cost is the slope between T = 100 and T = 1000 (forward, and training step minus forward), so
once-per-sequence work (the hoisted GEMMs, staging) drops out; torch.compile is measured at T = 100 only
(compiling the T = 1000 loop takes too long), so its column is that time / 100, an upper bound.
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnngraph.lab.bench import measure          # noqa: E402

ROWS = [("graph:persistent", "graph", "persistent"), ("graph:stages", "graph", "stages"),
        ("cudnn", "cudnn", "auto"), ("torch_compile", "torch_compile", "auto")]


def per_frame(cell: str, impl: str, loop: str, B: int, H: int, repeats: int) -> tuple:
    """(forward µs, backward µs) a frame, and the T = 100 forward / training step ms."""
    r = {T: measure(cell, impl, T=T, B=B, H=H, repeats=repeats, loop=loop)
         for T in ((100,) if impl == "torch_compile" else (100, 1000))}
    if any("skipped" in x for x in r.values()):
        return None
    f100, t100 = r[100]["forward_ms"], r[100]["train_ms"]
    if impl == "torch_compile":
        return f100 * 10, (t100 - f100) * 10, f100, t100
    f1k, t1k = r[1000]["forward_ms"], r[1000]["train_ms"]
    return (f1k - f100) / 0.9, ((t1k - f1k) - (t100 - f100)) / 0.9, f100, t100


BARRIER = r"""
extern "C" __global__ void __launch_bounds__(512, 1) barriers(unsigned int* bar, int n) {
    unsigned int barriers = 0;
    for (int s = 0; s < n; ++s) grid_barrier(bar, ++barriers * gridDim.x);
}
"""


def barrier_us(n: int = 20000) -> float:
    """µs per grid barrier of persistent_kernels.py: one block of 512 threads per SM, n barriers."""
    import cupy
    from rnngraph.run.backends.cuda.persistent.kernels import SOURCE
    head = SOURCE[SOURCE.index("static __device__"):SOURCE.index('extern "C"')].replace("{{", "{").replace("}}", "}")
    kernel = cupy.RawKernel("#define CT float\n" + head + BARRIER, "barriers", enable_cooperative_groups=True)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    bar, out = cupy.zeros(1, cupy.uint32), []
    for _ in range(5):
        bar.fill(0)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel((sms,), (512,), (bar, cupy.int32(n)))
        stop.record()
        stop.synchronize()
        out.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / n)
    return statistics.median(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", default="lstm,gru,peephole_lstm,mgu")
    p.add_argument("-B", type=int, default=1)
    p.add_argument("-H", type=int, default=512)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--compile", action="store_true", help="also torch.compile (about 90 s to compile per cell)")
    a = p.parse_args(argv)
    print(f"grid barrier: {barrier_us():.2f} µs")
    print(f"B={a.B} H={a.H}, fp32; µs a frame forward / backward; then T=100 forward / training step ms")
    for cell in a.cells.split(","):
        for label, impl, loop in ROWS:
            if impl == "torch_compile" and not a.compile:
                continue
            got = per_frame(cell, impl, loop, a.B, a.H, a.repeats)
            if got is not None:
                print(f"{cell:14s} {label:17s} {got[0]:6.2f} / {got[1]:6.2f} µs   T=100: {got[2]:.3f} / {got[3]:.3f} ms",
                      flush=True)


if __name__ == "__main__":
    main()
