"""Profile: what rnngraph.torch adds to a training step over the raw executor, on a CUDA GPU.

Three views of one LSTM training step (graph mode, float32; T, B, H as given), for the raw executor
(rnngraph.nn.Recurrent on cupy, on torch's stream), rnngraph.torch.Recurrent through loss.backward(), and,
as the floor of torch's own machinery, a trivial torch.autograd.Function (apply + backward):
- synced: one step from an idle GPU to its end, CUDA events, median (what `rnngraph bench` reports);
- pipelined: wall time per step over back-to-back steps (a training loop that does not sync each step);
- host: host time per step while the GPU is kept busy, so nothing waits on it.
A profile, not an experiment: it prints a table (no results file). Needs torch with CUDA and cupy.

    python experiments/profile_torch_step.py [--T 100] [--B 1] [--H 512] [--steps 200]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=100)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=512)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args(argv)
    import cupy
    import torch

    import rnngraph.torch as rt
    from rnngraph.lab.bench import machine_info
    from rnngraph.nn.recurrent import Recurrent
    from rnngraph.torch.autograd import on_stream
    if not torch.cuda.is_available():
        print("profile_torch_step needs a CUDA GPU", file=sys.stderr)
        return 2
    dev, (T, B, H) = torch.device("cuda"), (args.T, args.B, args.H)
    torch.manual_seed(0)
    x = torch.randn(T, B, H, device=dev).requires_grad_()
    gy = torch.randn(T, B, H, device=dev)
    model = rt.Recurrent("lstm", H, H, mode="graph", device=dev)
    raw = Recurrent("lstm", H, H, backend="cupy", mode="graph")
    xc, gc = cupy.asarray(x.detach()), cupy.asarray(gy)

    def torch_step():
        x.grad = None
        for p in model.parameters():
            p.grad = None
        model(x)[0].backward(gy)

    def raw_step():
        with on_stream(dev):
            raw(xc)
            raw.backward(gc)

    class Trivial(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.view_as(a)

        @staticmethod
        def backward(ctx, g):
            return g

    small, ones = torch.zeros(8, device=dev, requires_grad=True), torch.ones(8, device=dev)

    def floor_step():
        Trivial.apply(small).backward(ones)

    print(" ".join(f"{k}={v}" for k, v in machine_info().items() if k in ("gpu", "torch", "cupy", "commit")))
    print(f"LSTM T={T} B={B} H={H}, graph mode, float32; µs per training step (forward + backward)")
    print(f"{'':34s} {'synced':>8s} {'pipelined':>10s} {'host':>8s}")
    for name, step in (("raw executor", raw_step), ("rnngraph.torch", torch_step),
                       ("torch floor (trivial Function)", floor_step)):
        print(f"{name:34s} {synced(torch, step, args.steps):8.0f} {pipelined(torch, step, args.steps):10.0f} "
              f"{host(torch, step, args.steps):8.0f}")
    return 0


def synced(torch, step, n: int) -> float:
    for _ in range(10):
        step()
    times = []
    for _ in range(n):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def pipelined(torch, step, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def host(torch, step, n: int) -> float:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        torch.cuda._sleep(10_000_000)          # keeps the GPU busy for a few ms: the step never waits on it
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
