"""Loop strategy 'scan' on the GPU: the chunked scan of a linear-diagonal state, its CUDA source and runner.

Every array is addressed by frame: element (t, b, f) of a [T, B, F] view with row stride ld is
p[(t·B + b)·ld + f]; a vector parameter [F] has ld = 0. A node's buffer [P+T, B, F] holds frame t at
row P + t (the P rows before it: the frames before the call), so a read with delay d is row P + t - d.
"""
from __future__ import annotations

from ....ir.ops import OpKind
from ....plan.backward import kept_values
from ....plan.loops.scan import sole_gradient
from .source import CTYPES, math_type

# -------------------------------------------------------------------------------------------------
# The scan: s_t = A_t ⊙ s_{t-d} + C_t over d interleaved chains (chain j: frames j, j+d, j+2d, ...)
# per column (b, f). Three kernels: each chunk of a chain composes its (A, C) (part), one thread per
# chain combines the chunks' composites in order into each chunk's carry-in (carry), each chunk
# re-walks its frames from its carry-in, writing the results (out); with one chunk per chain (many
# columns) part is skipped and carry only writes each chain's start. A chunk of a call (run/chunks.py)
# walks only its n frames, read from the call's cursor: part and out skip the frames past n, whose
# composites are (1, 0). The backward runs the same three over reversed chains:
# H_t = (gm_t + gs_t) + a_{t+d} ⊙ H_{t+d}, H the total gradient of m_t.
# Grid: x over the B·F columns (coalesced), y over (chunk k, chain j) as k·d + j.

SCAN_SOURCE = r"""
#define IDX(ld, t) (((long long)(t) * B + b) * (ld) + f)
#define COLUMN long long col = (long long)blockIdx.x * blockDim.x + threadIdx.x; \
    if (col >= (long long)B * F) return; \
    int b = (int)(col / F), f = (int)(col - (long long)b * F);
#define WALK if (run) T = (int)run[tab + 3 * run[0] + 1];     /* a chunk: the running one's n frames */
#define FRAME(q) int i = {REV} ? k * L + L - 1 - (q) : k * L + (q); int t = j + d * i; if (t >= T) continue;

extern "C" __global__ void rg_scan_{DIR}_part_{TY}({ARGS}const long long* __restrict__ run, int tab, int T, int B,
        int F, int d, int L, {TY}* PA, {TY}* PC) {
    COLUMN
    WALK
    int j = blockIdx.y % d, k = blockIdx.y / d;
    {TY} A = 1, C = 0;
    #pragma unroll 8
    for (int q = 0; q < L; ++q) {
        FRAME(q)
        {TY} x, y;
        {COEF}
        C = x * C + y;
        A = x * A;
    }
    PA[blockIdx.y * (long long)B * F + col] = A;
    PC[blockIdx.y * (long long)B * F + col] = C;
}

extern "C" __global__ void rg_scan_{DIR}_carry_{TY}({ARGS}int T, int B, int F, int d, int NC,
        const {TY}* __restrict__ PA, {TY}* PC) {
    // PC[k, j] becomes chunk k's carry-in: the chain's value just before (backward: after) the chunk.
    // A block of 32 columns (threadIdx.x) × 32 segments of the chunks (threadIdx.y): each segment
    // composes its chunks, one thread per column combines the 32 segments in shared memory, then each
    // segment re-walks its chunks from its own carry-in.
    __shared__ {TY} SA[32][33], SC[32][33];
    long long col = (long long)blockIdx.x * 32 + threadIdx.x;
    bool live = col < (long long)B * F;
    int b = live ? (int)(col / F) : 0, f = live ? (int)(col - (long long)b * F) : 0;
    int j = blockIdx.y, y = threadIdx.y, per = (NC + 31) / 32;
    {TY} A = 1, C = 0;
    for (int q = y * per; live && q < min(NC, (y + 1) * per); ++q) {
        long long o = (({REV} ? NC - 1 - q : q) * (long long)d + j) * B * F + col;
        C = PA[o] * C + PC[o];
        A = PA[o] * A;
    }
    SA[y][threadIdx.x] = A;
    SC[y][threadIdx.x] = C;
    __syncthreads();
    if (y == 0 && live) {
        {TY} v = {INIT};
        for (int k = 0; k < 32; ++k) {
            {TY} a = SA[k][threadIdx.x], c = SC[k][threadIdx.x];
            SC[k][threadIdx.x] = v;
            v = a * v + c;
        }
    }
    __syncthreads();
    {TY} v = SC[y][threadIdx.x];
    for (int q = y * per; live && q < min(NC, (y + 1) * per); ++q) {
        long long o = (({REV} ? NC - 1 - q : q) * (long long)d + j) * B * F + col;
        {TY} a = PA[o], c = PC[o];
        PC[o] = v;
        v = a * v + c;
    }
}

extern "C" __global__ void rg_scan_{DIR}_out_{TY}({ARGS}const long long* __restrict__ run, int tab, int T, int B,
        int F, int d, int L, const {TY}* __restrict__ PC) {
    COLUMN
    WALK
    int j = blockIdx.y % d, k = blockIdx.y / d;
    {TY} y = PC[blockIdx.y * (long long)B * F + col];
    #pragma unroll 8
    for (int q = 0; q < L; ++q) {
        FRAME(q)
        {STEP}
    }
}
"""

# a, b: the coefficient and offset; s [d+T] rows: frame t at row d + t, so s_{t-d} is row t; m = a ⊙ s_{t-d}, stored
# where something reads it (keep_m: unstored)
SCAN_FORWARD = dict(
    DIR="fwd", REV="0",
    ARGS="const {S}* __restrict__ a, long long la, const {S}* __restrict__ c, long long lc, {S}* s, long long ls, "
         "{S}* m, long long lm, int keep_m, ",
    COEF="x = a[IDX(la, t)]; y = c[IDX(lc, t)];",
    INIT="s[IDX(ls, j)]",
    STEP="{TY} p = a[IDX(la, t)] * y; y = p + c[IDX(lc, t)]; if (keep_m) m[IDX(lm, t)] = p; s[IDX(ls, d + t)] = y;")

# gs [d+T] rows: ∂L/∂s from other readers, overwritten with the totals G_t (its first d rows, the history's,
# get theirs added) and gm += G where the reduce section reads them (totals: a or b a parameter); gm is read only
# where another reader sends m's gradient (gm_in); ga += H ⊙ s_{t-d} and gb += G where those are arrays (has_ga,
# has_gb: 1 adds, 2 writes, where the scan alone sends that gradient)
SCAN_BACKWARD = dict(
    DIR="bwd", REV="1",
    ARGS="const {S}* __restrict__ a, long long la, const {S}* __restrict__ s, long long ls, {S}* gs, long long lgs, "
         "{S}* gm, long long lgm, {S}* ga, long long lga, {S}* gb, long long lgb, int has_ga, int has_gb, int totals, "
         "int gm_in, ",
    COEF="x = t + d < T ? ({TY})a[IDX(la, t + d)] : 0; y = (gm_in ? ({TY})gm[IDX(lgm, t)] : 0) + gs[IDX(lgs, d + t)];",
    INIT="0",
    STEP="{TY} an = t + d < T ? ({TY})a[IDX(la, t + d)] : 0; {TY} G = gs[IDX(lgs, d + t)] + an * y; "
         "{TY} H = (gm_in ? ({TY})gm[IDX(lgm, t)] : 0) + G; "
         "if (totals) { gs[IDX(lgs, d + t)] = G; gm[IDX(lgm, t)] = H; } "
         "if (has_ga == 1) ga[IDX(lga, t)] = ga[IDX(lga, t)] + H * s[IDX(ls, t)]; "
         "else if (has_ga == 2) ga[IDX(lga, t)] = H * s[IDX(ls, t)]; "
         "if (has_gb == 1) gb[IDX(lgb, t)] = gb[IDX(lgb, t)] + G; else if (has_gb == 2) gb[IDX(lgb, t)] = G; "
         "if (t < d) gs[IDX(lgs, t)] = gs[IDX(lgs, t)] + a[IDX(la, t)] * H; y = H;")

SCAN_THREADS = 1 << 18      # chunks per chain are chosen so that about this many threads walk frames
SCAN_MIN_FRAMES = 8         # ... each at least this many frames (its loads in flight together)


def scan_source(direction: str, ctype: str) -> tuple[str, dict]:
    """(CUDA source, {phase: kernel name}) of the forward ('fwd') or backward ('bwd') scan kernels for
    arrays of element type ctype; the chunks' composites PA, PC and every carry have its math type."""
    parts = SCAN_FORWARD if direction == "fwd" else SCAN_BACKWARD
    text = SCAN_SOURCE
    for key in ("ARGS", "COEF", "INIT", "STEP", "DIR", "REV"):
        text = text.replace("{" + key + "}", parts[key])
    text = text.replace("_{TY}(", f"_{ctype}(").replace("{S}", ctype).replace("{TY}", math_type(ctype))
    return text, {ph: f"rg_scan_{parts['DIR']}_{ph}_{ctype}" for ph in ("part", "carry", "out")}


def scan_chunks(T: int, d: int, columns: int) -> tuple[int, int]:
    """(chunks per chain NC, frames per chunk L) for chains of ⌈T/d⌉ frames over `columns` columns."""
    n = -(-T // d)
    want = max(1, min(-(-n // SCAN_MIN_FRAMES), -(-SCAN_THREADS // (columns * d))))
    L = -(-n // want)
    return -(-n // L), L


def compile(be, cell, loop, views):
    """Per state, the three chunked-scan kernels over all frames, forward or reverse, in a chunk only over its n
    frames (part and out read n from the cursor; the carry passes the chunks past n through, (1, 0) each); the
    chunks' composites live in two buffers made here. views: plan/loops/scan.py chain_views."""
    cp, out, walk, dropped = be.xp, [], be.running_args(views.running), unstored(cell, loop)
    for (pn, mn, an, bn, _), (a, b, s, m, gs, gm, ga, gb) in zip(loop.chains, views.chains):
        (T, B, F), d = m.shape, s.shape[0] - m.shape[0]          # a, b: [T, B, F] or a vector [F]; s, gs: [d+T, B, F]
        ctype = CTYPES[str(m.dtype)]
        src, names = scan_source("bwd" if loop.reverse else "fwd", ctype)
        NC, L = scan_chunks(T, d, B * F)
        PA, PC = (cp.empty((NC * d, B * F), cp.float64 if ctype == "double" else cp.float32) for _ in range(2))
        if loop.reverse:
            head = be.frame_args([a, s, gs, gm, gm if ga is None else ga, gm if gb is None else gb], B)
            head += [cp.int32(_sends(cell, ga, an, mn)), cp.int32(_sends(cell, gb, bn, pn)),
                     cp.int32(ga is None or gb is None), cp.int32(not sole_gradient(cell, mn, pn))]
        else:
            head = be.frame_args([a, b, s, m], B) + [cp.int32(mn not in dropped)]
        dims, grid = [cp.int32(T), cp.int32(B), cp.int32(F), cp.int32(d)], (B * F + 127) // 128
        k = {ph: be.raw(nm, src) for ph, nm in names.items()}
        out += [(k["part"], (grid, NC * d), (128,), (*head, *walk, *dims, cp.int32(L), PA, PC))] * (NC > 1)
        out += [(k["carry"], ((B * F + 31) // 32, d), (32, 32), (*head, *dims, cp.int32(NC), PA, PC)),
                (k["out"], (grid, NC * d), (128,), (*head, *walk, *dims, cp.int32(L), PC))]
    return tuple(out)


def unstored(cell, loop) -> set:
    """The products m = a ⊙ s@t-d the forward scan never stores: those nothing reads but their chain's sum
    (plan.backward.kept_values of the pair), as minGRU's (1 - z) ⊙ h@t-1."""
    return {m for p, m, *_ in loop.chains if m not in kept_values(cell, (p, m))}


def loop_stores(cell, loop) -> frozenset:
    """The gradients whose buffers the backward scan needs unzeroed: the coefficients' it writes whole, every
    frame (has_ga / has_gb 2: it alone sends them; _sends), and a product m's that no other reader sends (gm_in
    0: the scan never reads it, and writes it whole where it writes it). A parameter's (a vector) is summed
    elsewhere."""
    if not loop.reverse:
        return frozenset()
    return frozenset(n for p, m, a, b, _ in loop.chains for n, reader in ((a, m), (b, p), (m, p))
                     if cell.op(n).kind is not OpKind.PARAM and sole_gradient(cell, n, reader))


def _sends(cell, g, n, reader) -> int:
    """The backward's has_ga / has_gb for coefficient n read by `reader`: 0 a parameter (no array), 2 where the
    scan alone sends n's gradient (it writes it: no load of a zero), else 1 (it adds to what others sent)."""
    return 0 if g is None else 2 if sole_gradient(cell, n, reader) else 1
