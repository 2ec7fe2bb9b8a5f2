"""Loop strategy 'scan' on the GPU: the chunked scan of a linear-diagonal state, its CUDA source and runner.

Every array is addressed by frame: element (t, b, f) of a [T, B, F] view with row stride ld is
p[(t·B + b)·ld + f]; a vector parameter [F] has ld = 0. A node's buffer [P+T, B, F] holds frame t at
row P + t (the P rows before it: the frames before the call), so a read with delay d is row P + t - d.
"""
from __future__ import annotations

from ....plan.backward import kept_values
from ....plan.loops.scan import sole_gradient
from .source import CTYPES, math_type

# -------------------------------------------------------------------------------------------------
# The scan: s_t = A_t ⊙ s_{t-d} + C_t over d interleaved chains (chain j: frames j, j+d, j+2d, ...)
# per column (b, f), in one pass over the frames (decoupled look-back): each chain's frames are cut in NC
# chunks of L, and a block of 128 columns runs one chunk of one chain. Blocks take their chunks in the order
# they start (a ticket), so a block waits only on blocks already running. A block composes its chunk's
# (A, C) and posts it (AGG); it then looks back over the chunks before its own to the nearest that has posted
# the chain's value after it (PREFIX), and applies the (A, C) of those between to that value, in order, as
# each of them computes its own: its carry-in is therefore the same whichever it found, and runs are bit for
# bit the same. It posts its own value after the chunk (A ⊙ carry-in + C: PREFIX) and walks its frames from
# the carry-in, writing the results. Chunk 0 starts from the chain's history; a chain of one chunk only walks.
# A chunk of a call (run/chunks.py) walks only its n frames, read from the call's cursor; frames past n compose
# as (1, 0). The backward runs the same over reversed chains, from their last chunk:
# H_t = (gm_t + gs_t) + a_{t+d} ⊙ H_{t+d}, H the total gradient of m_t. Before each launch rg_scan_next
# zeroes the tickets and numbers the launch (epoch): a chunk's flag holds 4·epoch + 1 (AGG) or + 2 (PREFIX).

SCAN_SYNC = r"""static __device__ __forceinline__ unsigned int rg_scan_ticket(unsigned int* state) {
    return atomicAdd(state, 1u);
}
static __device__ __forceinline__ unsigned int rg_scan_wait(const unsigned int* flag, unsigned int epoch) {
    // 1 once the chunk's (A, C) is posted, 2 once its chain's value after it is
    unsigned int v;
    do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory"); }
    while (v != 4u * epoch + 1u && v != 4u * epoch + 2u);
    return v - 4u * epoch;
}
static __device__ __forceinline__ void rg_scan_post(unsigned int* flag, unsigned int v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(flag), "r"(v) : "memory");
}
"""

SCAN_NEXT = r"""
extern "C" __global__ void rg_scan_next(unsigned int* state) {
    state[0] = 0u;      // the tickets
    state[1] += 1u;     // the launch
}
"""

SCAN_SOURCE = r"""
#define IDX(ld, t) (((long long)(t) * B + b) * (ld) + f)
#define WALK if (run) T = (int)run[tab + 3 * run[0] + 1];     /* a chunk: the running one's n frames */
#define FRAME(q) int i = {REV} ? k * L + L - 1 - (q) : k * L + (q); int t = j + d * i; if (t >= T) continue;

extern "C" __global__ void rg_scan_{DIR}_{TY}({ARGS}const long long* __restrict__ run, int tab, int T, int B,
        int F, int d, int L, int NC, int CB, {TY}* PA, {TY}* PC, {TY}* PP, unsigned int* flags,
        unsigned int* state) {
    __shared__ unsigned int got[2];
    if (threadIdx.x == 0) got[0] = rg_scan_ticket(state);
    __syncthreads();
    WALK
    const unsigned int ticket = got[0], epoch = state[1];
    // the chain's kl-th chunk (the backward's from the end: chunk k), chain j, columns cb
    const int cb = ticket % CB, kj = ticket / CB, j = kj % d, kl = kj / d, k = {REV} ? NC - 1 - kl : kl;
    const long long col = (long long)cb * blockDim.x + threadIdx.x, at = (long long)kj * B * F + col;
    const bool live = col < (long long)B * F;
    const int b = live ? (int)(col / F) : 0, f = live ? (int)(col - (long long)b * F) : 0;
    {TY} A = 1, C = 0, carry = 0;
    if (NC > 1 && live) {
        #pragma unroll 8
        for (int q = 0; q < L; ++q) {
            FRAME(q)
            {TY} x, y;
            {COEF}
            C = x * C + y;
            A = x * A;
        }
    }
    if (kl == 0) {
        if (live) carry = {INIT};
    } else {
        if (live) {
            PA[at] = A;
            PC[at] = C;
        }
        __syncthreads();
        if (threadIdx.x == 0) rg_scan_post(flags + ticket, 4u * epoch + 1u);
        if (threadIdx.x == 0) {     // back to the nearest chunk whose chain value after it is posted
            int p = kj - d;
            while (rg_scan_wait(flags + (long long)p * CB + cb, epoch) != 2u) p -= d;
            got[1] = (unsigned int)p;
        }
        __syncthreads();
        if (live) {                 // forward from there over the chunks' (A, C), as each computes its own value
            carry = __ldcg(PP + (long long)got[1] * B * F + col);
            for (int p = (int)got[1] + d; p < kj; p += d) {
                const long long o = (long long)p * B * F + col;
                carry = __ldcg(PA + o) * carry + __ldcg(PC + o);
            }
        }
    }
    if (NC > 1) {
        if (live) PP[at] = A * carry + C;
        __syncthreads();
        if (threadIdx.x == 0) rg_scan_post(flags + ticket, 4u * epoch + 2u);
    }
    if (live) {
        {TY} y = carry;
        #pragma unroll 8
        for (int q = 0; q < L; ++q) {
            FRAME(q)
            {STEP}
        }
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
# get theirs added) and gm += G where the reduce section reads them (totals: a or b a parameter); ga += H ⊙ s_{t-d}
# and gb += G where those are arrays (has_ga, has_gb: 1 adds, 2 writes, where the scan alone sends that gradient)
SCAN_BACKWARD = dict(
    DIR="bwd", REV="1",
    ARGS="const {S}* __restrict__ a, long long la, const {S}* __restrict__ s, long long ls, {S}* gs, long long lgs, "
         "{S}* gm, long long lgm, {S}* ga, long long lga, {S}* gb, long long lgb, int has_ga, int has_gb, int totals, ",
    COEF="x = t + d < T ? ({TY})a[IDX(la, t + d)] : 0; y = gm[IDX(lgm, t)] + gs[IDX(lgs, d + t)];",
    INIT="0",
    STEP="{TY} an = t + d < T ? ({TY})a[IDX(la, t + d)] : 0; {TY} G = gs[IDX(lgs, d + t)] + an * y; "
         "{TY} H = gm[IDX(lgm, t)] + G; if (totals) { gs[IDX(lgs, d + t)] = G; gm[IDX(lgm, t)] = H; } "
         "if (has_ga == 1) ga[IDX(lga, t)] = ga[IDX(lga, t)] + H * s[IDX(ls, t)]; "
         "else if (has_ga == 2) ga[IDX(lga, t)] = H * s[IDX(ls, t)]; "
         "if (has_gb == 1) gb[IDX(lgb, t)] = gb[IDX(lgb, t)] + G; else if (has_gb == 2) gb[IDX(lgb, t)] = G; "
         "if (t < d) gs[IDX(lgs, t)] = gs[IDX(lgs, t)] + a[IDX(la, t)] * H; y = H;")

SCAN_BLOCK = 128            # columns a block
SCAN_THREADS = 1 << 18      # chunks per chain are chosen so that about this many threads walk frames
SCAN_MIN_FRAMES = 8         # ... each at least this many frames (its loads in flight together)


def scan_source(direction: str, ctype: str) -> tuple[str, str]:
    """(CUDA source, kernel name) of the forward ('fwd') or backward ('bwd') scan kernel for arrays of element
    type ctype; the chunks' composites PA, PC, PP and every carry have its math type."""
    parts = SCAN_FORWARD if direction == "fwd" else SCAN_BACKWARD
    text = SCAN_SOURCE
    for key in ("ARGS", "COEF", "INIT", "STEP", "DIR", "REV"):
        text = text.replace("{" + key + "}", parts[key])
    text = text.replace("_{TY}(", f"_{ctype}(").replace("{S}", ctype).replace("{TY}", math_type(ctype))
    return SCAN_SYNC + text, f"rg_scan_{parts['DIR']}_{ctype}"


def scan_chunks(T: int, d: int, columns: int) -> tuple[int, int]:
    """(chunks per chain NC, frames per chunk L) for chains of ⌈T/d⌉ frames over `columns` columns."""
    n = -(-T // d)
    want = max(1, min(-(-n // SCAN_MIN_FRAMES), -(-SCAN_THREADS // (columns * d))))
    L = -(-n // want)
    return -(-n // L), L


def compile(be, cell, loop, views):
    """Per state, the launch numbering (rg_scan_next) and the one-pass scan kernel over all frames, forward or
    reverse, in a chunk only over its n frames (read from the cursor); the chunks' composites, flags and tickets
    live in buffers made here. views: plan/loops/scan.py chain_views."""
    cp, out, walk = be.xp, [], be.running_args(views.running)
    for (pn, mn, an, bn, _), (a, b, s, m, gs, gm, ga, gb) in zip(loop.chains, views.chains):
        (T, B, F), d = m.shape, s.shape[0] - m.shape[0]          # a, b: [T, B, F] or a vector [F]; s, gs: [d+T, B, F]
        ctype = CTYPES[str(m.dtype)]
        src, name = scan_source("bwd" if loop.reverse else "fwd", ctype)
        NC, L = scan_chunks(T, d, B * F)
        CB = -(-B * F // SCAN_BLOCK)
        PA, PC, PP = (cp.empty((NC * d if NC > 1 else 1, B * F), cp.float64 if ctype == "double" else cp.float32)
                      for _ in range(3))
        flags, state = cp.zeros(NC * d * CB, cp.uint32), cp.zeros(2, cp.uint32)
        if loop.reverse:
            head = be.frame_args([a, s, gs, gm, gm if ga is None else ga, gm if gb is None else gb], B)
            head += [cp.int32(_sends(cell, ga, an, mn)), cp.int32(_sends(cell, gb, bn, pn)),
                     cp.int32(ga is None or gb is None)]
        else:
            head = be.frame_args([a, b, s, m], B) + [cp.int32(mn not in unstored(cell, loop))]
        dims = [cp.int32(T), cp.int32(B), cp.int32(F), cp.int32(d), cp.int32(L), cp.int32(NC), cp.int32(CB)]
        out += [(be.raw("rg_scan_next", SCAN_NEXT), (1,), (1,), (state,)),
                (be.raw(name, src), (NC * d * CB,), (SCAN_BLOCK,), (*head, *walk, *dims, PA, PC, PP, flags, state))]
    return tuple(out)


def unstored(cell, loop) -> set:
    """The products m = a ⊙ s@t-d the forward scan never stores: those nothing reads but their chain's sum
    (plan.backward.kept_values of the pair), as minGRU's (1 - z) ⊙ h@t-1."""
    return {m for p, m, *_ in loop.chains if m not in kept_values(cell, (p, m))}


def _sends(cell, g, n, reader) -> int:
    """The backward's has_ga / has_gb for coefficient n read by `reader`: 0 a parameter (no array), 2 where the
    scan alone sends n's gradient (it writes it: no load of a zero), else 1 (it adds to what others sent)."""
    return 0 if g is None else 2 if sole_gradient(cell, n, reader) else 1
