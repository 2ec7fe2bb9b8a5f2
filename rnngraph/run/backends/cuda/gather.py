"""Runs of consecutive elements, a table on the device, in one launch each: a layer's parameter gradients
gathered into PyTorch's layout (nn/grads.py), the few runs its parameters make as [R, 3] of (src offset, out
offset, length), so that no index array is read (a take of every element read 4 bytes of index a 2-byte
gradient); and the runs of a gradient arena a backward zeroes (Workspace.zero_grads), one launch rather than a
memset each (about 9 µs of host time a memset: an LSTM's 19 runs took 170 µs, against 57 for the whole arena)."""
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
ZERO_RUNS = r"""
extern "C" __global__ void rg_zero_runs(unsigned char* base, const long long* runs, long long R, long long k) {
    // bytes [s + k·w, e) of base = 0 for each run (s, e, w) of the table [R, 3] (w: 0, or a row's bytes, the run's
    // rows zeroed from row k on): 16-byte stores where aligned, bytes at the edges (fewer than 16 each)
    const long long step = (long long)gridDim.x * blockDim.x, i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long r = blockIdx.y; r < R; r += gridDim.y) {
        const long long e = runs[3 * r + 1], s = min(e, runs[3 * r] + k * runs[3 * r + 2]);
        const long long a = min(e, s + (long long)((16 - ((unsigned long long)(base + s) & 15)) & 15));
        const long long z = max(a, e - (long long)((unsigned long long)(base + e) & 15));
        for (long long j = i; j < (z - a) / 16; j += step)
            reinterpret_cast<uint4*>(base + a)[j] = make_uint4(0, 0, 0, 0);
        for (long long j = i; j < a - s; j += step) base[s + j] = 0;
        for (long long j = i; j < e - z; j += step) base[z + j] = 0;
    }
}
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


def zero_runs_table(xp, a, runs):
    """The runs [(start, end, row)] of a [n] in bytes on the device [R, 3] int64, and the longest's bytes."""
    table = numpy.array(runs, numpy.int64).reshape(-1, 3) * a.itemsize
    return xp.asarray(table), int((table[:, 1] - table[:, 0]).max())


def zero_runs_launch(be, a, table, longest: int, k: int = 0):
    """(kernel, grid, block, args): block row r of the grid (and every gridDim.y-th after) zeroes run r, its rows
    from row k on where it has rows."""
    grid = (min(-(-longest // 4096), 1024), min(len(table), 1024))
    return be.raw("rg_zero_runs", ZERO_RUNS), grid, (256,), (a, table, numpy.int64(len(table)), numpy.int64(k))
