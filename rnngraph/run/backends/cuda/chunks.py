"""Chunk boundaries on the GPU (run/chunks.py): kernels that read where a chunk lies in its call from the
call's cursor on the device, so that one recording of a chunk serves every chunk of its length in any call.

cur [HEAD + B + 3·slots + 3·N] int64 (run/cursor.py): c, step, T, N; the lengths [B]; (address, frame stride,
batch stride) of each slot, in elements; (t0, n, stash offset) of each chunk. A workspace view [rows, B, F]
has element (t, b, f) at (t·B + b)·ld + f (frame_args); carries and summed gradients are contiguous.
"""
from __future__ import annotations

from ...cursor import HEAD
from .source import CTYPES, math_type

CHUNK_SOURCE = r"""
#define ROW (cur + {HEAD} + B + 3 * NS + 3 * cur[0])
#define SLOT(k) (cur + {HEAD} + B + 3 * (k))
#define EACH(count) for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < (count); \
                         e += (long long)gridDim.x * blockDim.x)
// frame rows: sequences b over the blocks' y, frames t over their x, features f over the threads (no division)
#define ROWS(count) for (int b = blockIdx.y; b < B; b += gridDim.y) \
    for (long long t = blockIdx.x; t < (count); t += gridDim.x) for (int f = threadIdx.x; f < F; f += blockDim.x)
#define PART(b) min(max(cur[{HEAD} + (b)] - ROW[0], 0LL), ROW[1])

// dst [L, B, F] = slot k's frames t0 .. t0 + n - 1, zeros after them (all zeros where the slot is empty)
extern "C" __global__ void rg_chunk_frames_in_{TY}(const long long* __restrict__ cur, int B, int NS, int k,
        {TY}* dst, long long ld, int L, int F) {
    const long long *row = ROW, *slot = SLOT(k);
    const {TY}* src = (const {TY}*)slot[0];
    const long long n = src ? row[1] : 0, t0 = row[0], fs = slot[1], bs = slot[2];
    ROWS(L) {
        {TY} v;
        if (t < n) v = src[(t0 + t) * fs + b * bs + f]; else v = 0.0f;
        dst[(t * B + b) * ld + f] = v;
    }
}

// slot k's frames t0 .. t0 + n - 1 = src [L, B, F]'s first n (nothing where the slot is empty)
extern "C" __global__ void rg_chunk_frames_out_{TY}(const long long* __restrict__ cur, int B, int NS, int k,
        const {TY}* __restrict__ src, long long ld, int L, int F) {
    const long long *row = ROW, *slot = SLOT(k);
    {TY}* dst = ({TY}*)slot[0];
    if (!dst) return;
    const long long n = row[1], t0 = row[0], fs = slot[1], bs = slot[2];
    ROWS(n) {
        dst[(t0 + t) * fs + b * bs + f] = src[(t * B + b) * ld + f];
    }
}

// arena [size] to (save) or from the stash at the chunk's offset, where it has one (>= 0)
extern "C" __global__ void rg_chunk_stash_{TY}(const long long* __restrict__ cur, int B, int NS,
        {TY}* arena, {TY}* stash, long long size, int save) {
    long long off = ROW[2];
    if (off < 0) return;
    EACH(size) {
        if (save) stash[off + e] = arena[e]; else arena[e] = stash[off + e];
    }
}

// h [P, B, F] (a state's rows before frame 0) = carry slot c of carry [N + 1, P, B, F]
extern "C" __global__ void rg_chunk_history_in_{TY}(const long long* __restrict__ cur, int B, int NS,
        {TY}* h, long long ld, const {TY}* __restrict__ carry, int P, int F) {
    const long long c = cur[0];
    ROWS(P) {
        h[(t * B + b) * ld + f] = carry[((c * P + t) * B + b) * F + f];
    }
}

// carry slot c + 1 [P, B, F] = each sequence's last P rows of v [P + L, B, F] in the chunk
extern "C" __global__ void rg_chunk_history_out_{TY}(const long long* __restrict__ cur, int B, int NS,
        const {TY}* __restrict__ v, long long ld, {TY}* carry, int P, int F) {
    const long long c = cur[0];
    ROWS(P) {
        carry[(((c + 1) * P + t) * B + b) * F + f] = v[((PART(b) + t) * B + b) * ld + f];
    }
}

// g [P + L, B, F] += gc [P, B, F] at each sequence's last P rows of the chunk
extern "C" __global__ void rg_chunk_grads_in_{TY}(const long long* __restrict__ cur, int B, int NS,
        {TY}* g, long long ld, const {TY}* __restrict__ gc, int P, int F) {
    ROWS(P) {
        long long o = ((PART(b) + t) * B + b) * ld + f;
        g[o] = ({MT})g[o] + ({MT})gc[(t * B + b) * F + f];
    }
}

// acc [size] = g for the backward's first chunk (the call's last), else acc + g
extern "C" __global__ void rg_chunk_accumulate_{TY}(const long long* __restrict__ cur, {TY}* acc,
        const {TY}* __restrict__ g, long long size) {
    bool first = cur[0] == cur[3] - 1;
    EACH(size) {
        acc[e] = first ? ({MT})g[e] : ({MT})acc[e] + ({MT})g[e];
    }
}

// c += step (a forward) or c -= 1 (a backward)
extern "C" __global__ void rg_chunk_advance_{TY}(long long* cur, int forward) {
    cur[0] += forward ? cur[1] : -1;
}
"""

THREADS, MAX_BLOCKS = 256, 2048     # grid-stride loops over a chunk's elements (EACH), ...
ROW_THREADS, MAX_GRID_Y = 128, 65535   # ... or over its frame rows, sequences on the grid's y (ROWS)


def chunk_source(ctype: str) -> str:
    """The chunk boundary kernels for arrays of element type ctype."""
    return CHUNK_SOURCE.replace("{HEAD}", str(HEAD)).replace("{TY}", ctype).replace("{MT}", math_type(ctype))


def chunk_launch(be, op: str, cur, args) -> tuple:
    """The launch of boundary operation `op` (chunks.OPS) on the reference's arguments."""
    return (LAUNCHES[op](be, cur, *args),)


def _kernel(be, op, dtype):
    ctype = CTYPES[str(dtype)]
    return be.raw(f"rg_chunk_{op}_{ctype}", chunk_source(ctype))


def _launch(be, op, dtype, count, *args):
    """A grid-stride loop over `count` elements (EACH)."""
    return _kernel(be, op, dtype), (max(1, min(MAX_BLOCKS, -(-count // THREADS))),), (THREADS,), args


def _row_launch(be, op, dtype, frames, B, *args):
    """A loop over `frames` frames of B sequences (ROWS): the frames over about MAX_BLOCKS / B blocks, the
    sequences over at most MAX_GRID_Y."""
    return _kernel(be, op, dtype), (max(1, min(frames, MAX_BLOCKS // B)), min(B, MAX_GRID_Y)), (ROW_THREADS,), args


def _frames(op):
    def launch(be, cur, a, k):          # a [L, B, F], a workspace's frames
        cp, (L, B, F) = be.xp, a.shape
        return _row_launch(be, op, a.dtype, L, B, cur.dev, cp.int32(B), cp.int32(cur.slots), cp.int32(k),
                           *be.frame_args([a], B), cp.int32(L), cp.int32(F))
    return launch


def _rows(op):
    def launch(be, cur, v, carry):      # v [P or P + L, B, F] (frame rows), carry [.., P, B, F] (contiguous)
        cp, (P, B, F) = be.xp, carry.shape[-3:]
        return _row_launch(be, op, v.dtype, P, B, cur.dev, cp.int32(B), cp.int32(cur.slots),
                           *be.frame_args([v], B), carry, cp.int32(P), cp.int32(F))
    return launch


def _stash(be, cur, arena, stash, save):
    cp = be.xp
    return _launch(be, "stash", arena.dtype, arena.size, cur.dev, cp.int32(cur.B), cp.int32(cur.slots), arena,
                   stash, cp.int64(arena.size), cp.int32(save))


def _accumulate(be, cur, acc, g):
    return _launch(be, "accumulate", acc.dtype, acc.size, cur.dev, acc, g, be.xp.int64(acc.size))


def _advance(be, cur, forward):
    return _launch(be, "advance", "float32", 1, cur.dev, be.xp.int32(forward))


LAUNCHES = {"frames_in": _frames("frames_in"), "frames_out": _frames("frames_out"), "stash": _stash,
            "history_in": _rows("history_in"), "history_out": _rows("history_out"), "grads_in": _rows("grads_in"),
            "accumulate": _accumulate, "advance": _advance}
