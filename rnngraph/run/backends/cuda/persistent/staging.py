"""How a tensor-core GEMM phase's operand rows reach shared memory each frame (mma.gemm, resident.py): x's B rows, as
stored, K in slices of kw columns from k0, into xh ([rows, XLD] elements). Where the rows are 16-byte aligned and a
phase reads x's columns as they lie, each row of the slice is one bulk copy (the Hopper TMA, cp.async.bulk), issued by
one thread, its bytes counted in at the block's mbarrier, which every thread waits on (rg_bulk, its phase bit
rg_phase); that moves a frame's rows from L2 faster than 16-byte copies. Measured on an H200 (bfloat16 LSTM, backward
µs a frame, slope T = 100 -> 1000, 16-byte copies / bulk): H = 768 B = 16 (2 groups of 8 rows) 4.93 / 4.60, H = 512
B = 64 (4 groups of 16) 6.93 / 6.31, the results bit for bit the same. Where a phase reads other columns (a head's), or
several slices are in flight at once (stage_at_once), every 16-byte copy is in flight at once (cp.async); where rows
are not aligned, loads; where x travels in tagged half words (kernels.py), from them at frames two or more after the
launch's first (STAGE_TAGGED). The pad columns (K to the MMA's 16) are staged as zeros by the copies and loads, and
bulk copies run only where K has none.

A bulk copy reads in the async proxy what other blocks wrote in the generic one, after the frame's barrier: the
issuing thread fences the proxies (fence.proxy.async) first, for global memory and for the shared memory the block's
threads read in the frame before.
"""
from __future__ import annotations

from .phases import THREADS

HELPERS = r"""
static __device__ __forceinline__ void rg_copy16(void* smem, const void* global, bool full) {
    // 16 bytes from global memory (through L2, not L1) into shared memory, in flight until rg_copies_wait;
    // zeros where not full (then nothing is read)
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(global), "r"(full ? 16 : 0) : "memory");
}
static __device__ __forceinline__ void rg_copies_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }
template <class H> static __device__ __forceinline__ void exchange_half(unsigned int* w, unsigned int t, CT x) {
    // a half value as stored, in one 32-bit word above frame t's 16-bit tag
    H h;
    h = x;
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" :: "l"(w), "r"((t << 16) | h.u) : "memory");
}
static __device__ __forceinline__ uint4 rg_tagged4(const unsigned int* w) {
    // four tagged half words, one 16-byte load
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(w) : "memory");
    return v;
}
static __device__ __forceinline__ bool rg_tagged(uint4 v, unsigned int t) {
    // whether all four words carry frame t's tag
    const unsigned int k = t & 0xFFFFu;
    return (v.x >> 16) == k && (v.y >> 16) == k && (v.z >> 16) == k && (v.w >> 16) == k;
}
static __device__ __forceinline__ void rg_bulk_init(unsigned long long* mb) {
    // the block's bulk-copy mbarrier: one arrival (the issuing thread's) and the bytes a phase; before the kernel's
    // first __syncthreads
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"((unsigned)__cvta_generic_to_shared(mb)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
}
static __device__ __forceinline__ void rg_bulk_expect(unsigned long long* mb, unsigned bytes) {
    // one thread: the bytes the next copies bring, after fencing the generic proxy's accesses from the async one's
    asm volatile("fence.proxy.async.global;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;"
                 :: "r"((unsigned)__cvta_generic_to_shared(mb)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void rg_bulk_copy(void* smem, const void* global, unsigned bytes,
                                                    unsigned long long* mb) {
    // `bytes` (a multiple of 16, both ends 16-byte aligned) from global memory into shared memory, counted in at mb
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(global), "r"(bytes),
                    "r"((unsigned)__cvta_generic_to_shared(mb)) : "memory");
}
static __device__ __forceinline__ void rg_bulk_wait(unsigned long long* mb, unsigned& phase) {
    // every thread: until the copies of the barrier's current phase have all landed; then the next phase
    unsigned done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"((unsigned)__cvta_generic_to_shared(mb)), "r"(phase) : "memory");
    } while (!done);
    phase ^= 1u;
}
"""


def padded(K: int) -> int:
    """K rounded up to the MMA's 16."""
    return -(-K // 16) * 16


# a kernel's lines before its first __syncthreads where a phase stages in bulk copies (kernels.py adds them once), and
# the static shared memory they take (the mbarrier's 8 bytes, allowed 16)
BULK_SHARED = 16
BULK_INIT = """    __shared__ __align__(8) unsigned long long rg_bulk;       // the block's bulk-copy mbarrier
    unsigned rg_phase = 0u;                                     // ... and its phase bit, the same in every thread
    rg_bulk_init(&rg_bulk);"""

STAGE = r"""                for (int e = tid; e < NB * kw; e += NT) {{
                    const int b = e / kw, kk = e - b * kw, k = k0 + kk;
                    if (k < {K}) xh[b * {XLD} + kk] = {load}; else xh[b * {XLD} + kk] = 0.f;
                }}"""

STAGE_WIDE = r"""                if ((((unsigned long long)&{x}[0]) & 15) == 0 && {ld} % {V} == 0) {{
                    // 16 bytes a copy, every copy in flight at once (cp.async): the frame's rows come from L2
                    const int per = kw / {V};
                    for (int e = tid; e < NB * per; e += NT) {{
                        const int b = e / per, k = k0 + (e - b * per) * {V};
                        rg_copy16(&xh[b * {XLD} + (e - b * per) * {V}], k < {K} ? (const void*)&{load} : (const void*){x}, k < {K});
                    }}
{wait}                }} else
""" + STAGE

STAGE_BULK = r"""                if ((((unsigned long long)&{x}[0]) & 15) == 0 && {ld} % {V} == 0) {{
                    // each row's kw columns in one bulk copy (TMA): the frame's rows come from L2
                    if (tid == 0) {{
                        rg_bulk_expect(&rg_bulk, NB * kw * {size});
                        for (int b = 0; b < NB; ++b)
                            rg_bulk_copy(&xh[b * {XLD}], &AT({x}, {ld}, {lag}, k0), kw * {size}, &rg_bulk);
                    }}
                    rg_bulk_wait(&rg_bulk, rg_phase);
                }} else
""" + STAGE

STAGE_TAGGED = r"""                if (t - {lag} >= 2) {{
                    // frame t - {lag}'s rows as tagged half words (kernels.py): four a load, {N} loads in flight at
                    // once, those whose words do not all carry the frame's tag read again, together; the halves kept
                    const int per = kw / 4;
                    for (int e0 = tid; e0 < NB * per; e0 += {N} * NT) {{
                        uint4 w[{N}];
                        bool ok[{N}];
                        #pragma unroll
                        for (int i = 0; i < {N}; ++i) {{
                            const int e = e0 + i * NT, b = e / per, k = k0 + (e - b * per) * 4;
                            ok[i] = e >= NB * per || k >= {K};
                            if (!ok[i]) w[i] = rg_tagged4(&XAT({xh}, (t - {lag}) & 1, k, {K}));
                        }}
                        for (bool all = false; !all;) {{
                            all = true;
                            #pragma unroll
                            for (int i = 0; i < {N}; ++i) {{
                                ok[i] = ok[i] || rg_tagged(w[i], t - {lag});
                                all = all && ok[i];
                            }}
                            #pragma unroll
                            for (int i = 0; i < {N}; ++i) {{
                                const int e = e0 + i * NT, b = e / per, k = k0 + (e - b * per) * 4;
                                if (!ok[i]) w[i] = rg_tagged4(&XAT({xh}, (t - {lag}) & 1, k, {K}));
                            }}
                        }}
                        #pragma unroll
                        for (int i = 0; i < {N}; ++i) {{
                            const int e = e0 + i * NT, b = e / per, kk = (e - b * per) * 4;
                            if (e >= NB * per) break;
                            *(uint2*)&xh[b * {XLD} + kk] = k0 + kk >= {K} ? make_uint2(0u, 0u) :
                                make_uint2((w[i].x & 0xFFFFu) | (w[i].y << 16), (w[i].z & 0xFFFFu) | (w[i].w << 16));
                        }}
                    }}
                }} else
"""
TAGGED_LOADS = 4            # tagged staging: 16-byte loads a thread has in flight at once, at most, and with the
TAGGED_WORDS = 60           # ... weights' fragments held in registers at most this many registers (4 a load). On an
                            # H200 (bfloat16 LSTM, forward µs a frame, loads a thread: 6, 4, 3, barriers): H = 768
                            # B = 16 (48 fragment registers: spills) 4.23, 5.01, 3.39, 3.73; H = 512 B = 16 (32) 4 loads
                            # 2.17, barriers 2.93


def stage_slice(p, lay, x: str, ld: str, lag: int, col: str, wait: bool, xh: str | None = None) -> str:
    """The lines staging slice k0 (kw columns) of x (read at `lag`, column `col`) into xh, on layout lay (mma.Layout):
    where rows are aligned, bulk copies if x's columns are read as they lie (col k), the phase has no pad columns and
    the wait is here, else 16-byte copies in flight at once (waited for here, or by the caller where `wait` is False);
    else loads; where xh names x's tagged half words (kernels.py), from them at frames two or more after the launch's
    first (STAGE_TAGGED)."""
    load, V = f"AT({x}, {ld}, {lag}, {col})", 16 // lay.itemsize        # V: elements a 16-byte copy
    waits = "                    rg_copies_wait();\n" if wait else ""
    held = sum(r.words for r in lay.resident.values())
    loads = max(1, min(TAGGED_LOADS, (TAGGED_WORDS - held) // 4, -(-lay.x_rows * lay.ks[id(p)] // 4 // THREADS)))
    tagged = STAGE_TAGGED.format(lag=lag, N=loads, K=p.width, xh=xh, XLD=lay.xld) if xh else ""
    wide = STAGE_BULK if wait and col == "k" and padded(p.width) == p.width else STAGE_WIDE
    return tagged + (wide if p.width % V == 0 else STAGE).format(K=p.width, XLD=lay.xld, load=load, x=x, ld=ld, V=V,
                                                                  wait=waits, lag=lag, size=lay.itemsize)


def stage_at_once(p, lay, x: str, ld: str, cols: list) -> str:
    """x's columns cols[j] (expressions of k) of a one-slice phase p staged into buffers j of xs, every copy in
    flight at once, one wait and one barrier for all (a head-wise dgemm's J output gradients: J L2 round trips
    a frame become one)."""
    KP = padded(p.width)
    parts = [f"            {{   ST* xh = (ST*)xs + {j * lay.x_rows * lay.xld};\n"
             f"                const int k0 = 0, kw = {KP};\n{stage_slice(p, lay, x, ld, 0, col, False)}\n"
             "            }"
             for j, col in enumerate(cols)]
    return "\n        {\n" + "\n".join(parts) + "\n            rg_copies_wait();\n        }\n        __syncthreads();"
