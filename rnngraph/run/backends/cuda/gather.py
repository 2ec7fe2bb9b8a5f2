"""A layer's parameter gradients gathered into PyTorch's layout on the GPU (nn/grads.py): the few runs of
consecutive elements a layer's parameters make, as a table on the device [R, 3] of (src offset, out offset,
length), copied in one launch; no index array is read (a take of every element read 4 bytes of index a 2-byte
gradient)."""
from __future__ import annotations

import numpy

COPY_RUNS = r"""
extern "C" __global__ void rg_copy_runs_{bytes}(const {T}* src, {T}* out, const long long* runs, long long R) {{
    // out[d + i] = src[s + i] for each run (s, d, n) of the table [R, 3], i < n
    for (long long r = blockIdx.y; r < R; r += gridDim.y) {{
        const long long s = runs[3 * r], d = runs[3 * r + 1], n = runs[3 * r + 2], step = (long long)gridDim.x * 256;
        for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n; i += step)
            out[d + i] = src[s + i];
    }}
}}
"""
WORDS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}   # an element's bits


def runs_table(xp, runs):
    """The runs [(src offset, out offset, length)] on the device, [R, 3] int64."""
    return xp.asarray(numpy.array(runs, numpy.int64).reshape(-1, 3))


def copy_runs_launch(be, src, table, runs, out):
    """(kernel, grid, block, args): block row r of the grid (and every gridDim.y-th after) copies run r."""
    kernel = be.raw(f"rg_copy_runs_{src.itemsize}", COPY_RUNS.format(bytes=src.itemsize, T=WORDS[src.itemsize]))
    longest = max(n for _, _, n in runs)
    grid = (min(-(-longest // 1024), 1024), min(len(runs), 1024))
    return kernel, grid, (256,), (src, out, table, numpy.int64(len(runs)))
