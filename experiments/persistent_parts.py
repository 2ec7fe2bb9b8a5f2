"""What a frame of the persistent kernel costs, part by part, on the GPU: the kernel as generated, then with one
part taken out of its source at a time (its results are then wrong: a probe of time only). A probe that prints a
table (no results file):

    PYTHONPATH=. python3 experiments/persistent_parts.py [--cell lstm] [-B 16,64] [-H 512] [--dtype bfloat16]

The parts: the grid barriers (each becomes a __syncthreads), the staging of each frame's GEMM operand from L2
(the tensor cores' 16-byte and bulk copies), and the tensor cores' MMAs; 'all three' leaves the rest (the elementwise
bodies, their loads and stores, the sums' reduction). A frame's cost is the slope between T = 100 and T = 1000,
forward and backward (training step minus forward), so the once-per-sequence work drops out.
"""
import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rnngraph.lab.bench import measure                          # noqa: E402
from rnngraph.run.backends.cuda.persistent import runner        # noqa: E402

NOOPS = r"""
static __device__ __forceinline__ void rg_no_copy(void*, const void*, bool) {}
static __device__ __forceinline__ void rg_no_bulk(void*, const void*, unsigned, unsigned long long*) {}
static __device__ __forceinline__ void rg_no_expect(unsigned long long*, unsigned) {}
static __device__ __forceinline__ void rg_no_wait(unsigned long long*, unsigned&) {}
static __device__ __forceinline__ void rg_no_mma(float*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned) {}
"""
CUTS = {"barrier": [("grid_barrier(count, ++barriers * G);", "__syncthreads();")],
        "staging": [("rg_copy16(&xh[", "rg_no_copy(&xh["), ("rg_bulk_copy(&xh[", "rg_no_bulk(&xh["),
                    ("rg_bulk_expect(", "rg_no_expect("), ("rg_bulk_wait(", "rg_no_wait(")],
        "mma": [("rg_mma(acc[", "rg_no_mma(acc[")]}
VARIANTS = {"as generated": [], **{f"no {k}": v for k, v in CUTS.items()},
            "all three": [c for v in CUTS.values() for c in v]}


def cut(edits: list):
    """runner.persistent_kernel with `edits` made to each kernel's source (renamed, so none is mistaken for the
    kernel as generated)."""
    made = runner.persistent_kernel.__wrapped__ if hasattr(runner.persistent_kernel, "__wrapped__") \
        else runner.persistent_kernel

    def kernel(*args, **kw):
        k = made(*args, **kw)
        if not edits:
            return k
        name, at = k.name + "_cut" + str(abs(hash(tuple(edits))) % 10 ** 6), k.source.index('extern "C"')
        body = k.source[at:]            # the kernel's calls, not the helpers' definitions before it
        for a, b in edits:
            body = body.replace(a, b)
        return dataclasses.replace(k, name=name, source=(k.source[:at] + NOOPS + body).replace(k.name, name))
    kernel.__wrapped__ = made
    return kernel


def per_frame(cell: str, B: int, H: int, dtype: str, repeats: int) -> tuple:
    """(forward µs, backward µs) a frame: the slope from T = 100 to 1000."""
    r = {T: measure(cell, "graph", T=T, B=B, H=H, dtype=dtype, repeats=repeats, loop="persistent") for T in (100, 1000)}
    f = (r[1000]["forward_ms"] - r[100]["forward_ms"]) / 0.9
    b = ((r[1000]["train_ms"] - r[1000]["forward_ms"]) - (r[100]["train_ms"] - r[100]["forward_ms"])) / 0.9
    return f, b, r[100].get("gpu_loop") or r[100].get("loop_strategy")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cell", default="lstm")
    p.add_argument("-B", default="16,64")
    p.add_argument("-H", type=int, default=512)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    print(f"{a.cell}, H = {a.H}, {a.dtype}: µs a frame (slope T = 100 -> 1000), forward / backward")
    print(f"{'B':>4}  {'variant':<14} {'forward':>8} {'backward':>9}")
    for B in map(int, a.B.split(",")):
        for variant, edits in VARIANTS.items():
            runner._KERNELS.clear()
            runner.persistent_kernel = cut(edits)
            f, b, ran = per_frame(a.cell, B, a.H, a.dtype, a.repeats)
            print(f"{B:>4}  {variant:<14} {f:8.2f} {b:9.2f}   {ran if variant == 'as generated' else ''}", flush=True)
    runner.persistent_kernel = cut([]).__wrapped__


if __name__ == "__main__":
    main()
