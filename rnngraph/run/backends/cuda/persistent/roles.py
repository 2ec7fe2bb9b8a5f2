"""Warp roles in a persistent kernel whose blocks own whole heads (phases.per_head) and whose only phase is a pair
that hands its operand on in shared memory (heads.handed_on: sLSTM's and the multi-head LSTM's forward, their
weights resident in registers: a weight row a thread on CUDA cores, or in half storage with one head a block each
GEMM warp's MMA fragments, MMA_SUMS): some warps sum each frame's GEMM, others run its elements, others store the
elements' values, and no role waits for another's memory traffic.

Without roles every warp runs both the GEMM and the elements, one after the other, with a block-wide barrier
after each: a frame costs the GEMM, then the elements' loads, body and stores (sLSTM: 7 loads and 11 stores an
element, their addresses 64-bit arithmetic), and the next frame's GEMM waits for the last store to issue. With
roles (MT, ET: the GEMM and the element warps' threads; the store warps have ET, one thread an element as well):

  GEMM warps     frame t: the sums into gs, arrive at SUMS; wait at OPERAND for h_t in xs
  element warps  frame t: wait at SUMS; the body from gs and its inputs in registers; h_t into xs, arrive at
                 OPERAND; load frame t + 2's inputs; its values, as stored, into stage[t mod 2], arrive at
                 STAGED[t mod 2] (first waiting at FREE[t mod 2] until frame t - 2's were read from it)
  store warps    frame t: wait at STAGED[t mod 2], read the values, arrive at FREE[t mod 2], store them

so a frame's critical path is the GEMM and the body's arithmetic; the stores' addresses (64-bit arithmetic an
array) are worked out by warps that wait for no one. The element warps carry the states a body stores and reads a
frame later (sLSTM's c, n and m) in registers, loading them only at a launch's first frame, and load the rest of
their inputs two frames ahead (two frames an iteration, so the two sets alternate without copies).

SUMS, OPERAND, STAGED[2] and FREE[2] are named barriers (bar.sync 0, __syncthreads, is not used in the loop); the
warps past MT + 2·ET leave after frame 0's operand is staged. Shared memory stays race-free: the element warps
read gs(t) before they arrive at OPERAND(t), after which the GEMM warps write gs(t + 1); they write xs after
SUMS(t), when the GEMM warps have read it for frame t; stage[k] is written only after FREE[k] said it was read.
"""
from __future__ import annotations

import re

from ..source import HALF_TYPES
from .elements import element_at, read_ahead
from .phases import THREADS, block_units, sources

SUMS, OPERAND, STAGED, FREE = 1, 2, 3, 5    # the named barriers' ids (0 is __syncthreads'; STAGED, FREE: 2 each)

ROLES_SYNC = r"""static __device__ __forceinline__ void rg_wait(int id, int n) {{
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");        // a warp at a time, all its threads
}}
static __device__ __forceinline__ void rg_arrive(int id, int n) {{
    asm volatile("barrier.cta.arrive %0, %1;" :: "r"(id), "r"(n) : "memory");   // n: threads (whole warps)
}}
"""     # (a template, as kernels.SYNC)
STAGE_DEFINE = r"""// stage[k]: value j of element tid, as stored
#define SG(k, j) ((ST*)(smem + STAGE_OFF))[((k) * NV + (j)) * ET + tid]
"""

ROLES_FRAME = r"""                if (s >= 2) rg_wait(FREE + {k}, 2 * ET);
                rg_wait(SUMS, MT + ET);
                {{  {units}
{elements}
                }}
                rg_arrive(STAGED + {k}, 2 * ET);"""      # frame s of the element warps, k = s mod 2

ROLES_BODY = r"""{load}
    __syncthreads();
    if (NF > 0) {{          // frame 0's operand, staged by every thread
        const int s = 0, t = s;
        (void)s;
        {units}
{stage}
    }}
    __syncthreads();
    if (tid < MT) {{        // GEMM warps
        for (int s = 0; s < NF; ++s) {{
            const int t = s;
            {{  {units}
{sums}
            }}
            rg_arrive(SUMS, MT + ET);
            rg_wait(OPERAND, MT + ET);
        }}
    }} else if (tid < MT + ET) {{   // element warps, each its element e = tid
        const int tid = threadIdx.x - MT;
        {registers}
        {{  {units}
            if (tid < nu * NB) {{
                const int b = tid / nu, f = u0 + tid - b * nu;
                if (NF > 0) {{ const int t = 0;{first} }}
                if (NF > 1) {{ const int t = 1;{second} }}
            }}
        }}
        for (int s2 = 0; s2 < NF; s2 += 2) {{     // two frames an iteration, each its own input registers
            {{  const int s = s2, t = s;
{even}
            }}
            if (s2 + 1 < NF) {{
                const int s = s2 + 1, t = s;
{odd}
            }}
        }}
        for (int s = NF < 2 ? 0 : NF - 2; s < NF; ++s) rg_wait(FREE + (s & 1), 2 * ET);
    }} else if (tid < MT + 2 * ET) {{   // store warps, each element e = tid's values
        const int tid = threadIdx.x - MT - ET;
        for (int s = 0; s < NF; ++s) {{
            const int t = s;
            rg_wait(STAGED + (s & 1), 2 * ET);
            {{  {units}
                const int b = tid / nu, f = u0 + tid - b * nu;{reads}
                rg_arrive(FREE + (s & 1), 2 * ET);{stores}
            }}
        }}
    }}
}}
"""
STORE = re.compile(r"^(\s*)(AT\(.*\)) = (.*);$")     # an epilogue's store: AT(p, ld, lag, col) = value;

# On tensor cores (half storage, one head a block, at most 8 rows): GEMM warp w holds the A fragments of its MTW
# tiles of 16 weight rows in registers for the whole call, and x's rows are B, one tile of 8 rows (a block of a
# few rows pads half as much as with x as A, 16 rows a tile); x sits in shared memory as stored, rows XLD apart
MMA_WEIGHTS = r"""    unsigned wf[{MTW}][{KSTEPS}][4] = {{}};     // the GEMM warps' weight fragments, for every frame
    if (warp < MW) {{
        {units}
        const int g = lane >> 2, c = (lane & 3) * 2;
        #pragma unroll
        for (int i = 0; i < {MTW}; ++i)
            #pragma unroll
            for (int ks = 0; ks < {KSTEPS}; ++ks)
                #pragma unroll
                for (int h = 0; h < 4; ++h) {{      // A[m][k] = W[q][k], q = 16 tile + m: m = g (+ 8), k = 2c' (+ 8)
                    const int q = (warp * {MTW} + i) * 16 + g + (h & 1) * 8, j = q / nu, u = q - j * nu;
                    (void)j; (void)u;
                    unsigned lo, hi;
                    {{ const int k = ks * 16 + (h >> 1) * 8 + c; lo = (unsigned)({w}).u; }}
                    {{ const int k = ks * 16 + (h >> 1) * 8 + c + 1; hi = (unsigned)({w}).u; }}
                    wf[i][ks][h] = lo | (hi << 16);
                }}
    }}"""
MMA_STAGE = r"""        for (int e = tid; e < NB * {K}; e += NT) {{
            const int b = e / {K}, i = e - b * {K};
            ((ST*)xs)[b * XLD + i] = AT({x}, {ld}, {lag}, (u0 / {per}) * {K} + i);
        }}"""
MMA_SUMS = r"""
        {{  // tensor cores: warp w's MTW tiles of 16 weight rows against x's NB rows (one tile of 8, the rest zero)
            const int g = lane >> 2, c = (lane & 3) * 2;
            const ST* xh = (const ST*)xs;
            float acc[{MTW}][4] = {{}};
            #pragma unroll
            for (int ks = 0; ks < {KSTEPS}; ++ks) {{      // B[k][n] = x[row n = g][k]: k = 2c', 2c' + 1 (+ 8)
                const unsigned b0 = g < NB ? *(const unsigned*)(xh + g * XLD + ks * 16 + c) : 0u;
                const unsigned b1 = g < NB ? *(const unsigned*)(xh + g * XLD + ks * 16 + 8 + c) : 0u;
                #pragma unroll
                for (int i = 0; i < {MTW}; ++i)
                    rg_mma(acc[i], wf[i][ks][0], wf[i][ks][1], wf[i][ks][2], wf[i][ks][3], b0, b1);
            }}
            #pragma unroll
            for (int i = 0; i < {MTW}; ++i) {{      // D[m][n]: weight rows g (and g + 8), x rows 2c', 2c' + 1
                const int q = (warp * {MTW} + i) * 16 + g;
                if (c < NB) {{ gs[q * NB + c] = acc[i][0]; gs[(q + 8) * NB + c] = acc[i][2]; }}
                if (c + 1 < NB) {{ gs[q * NB + c + 1] = acc[i][1]; gs[(q + 8) * NB + c + 1] = acc[i][3]; }}
            }}
        }}"""


def warp_roles(p, G: int, B: int, rows: int, mma_warps: int | None) -> tuple | None:
    """(MT, ET): the GEMM warps' and the element warps' threads of the kernel whose only phase is the handed-on
    pair p, its weights resident (a thread one weight row against `rows` x rows, heads.resident; or mma_warps
    warps on tensor cores, tensor_core_warps) on G blocks of B rows, where the three roles fit in a block and a
    block's elements fill whole warps, each element (and store) warp's thread one element, so that every warp
    arrives at a barrier with all its threads; else None."""
    if p.units % G:
        return None
    nu = p.units // G
    mt, et = 32 * mma_warps if mma_warps else -(-nu * p.m * (B // rows) // 32) * 32, nu * B
    return (mt, et) if et % 32 == 0 and mt + 2 * et <= THREADS else None


def tensor_core_warps(p, G: int, B: int, st: str) -> int | None:
    """The GEMM warps (MW) where warp roles run the GEMM on tensor cores (MMA_SUMS): half storage, a block one
    head whose width is a multiple of 16, at most 8 rows (one tile); the most of 8, 4, 2, 1 that share the nq/16
    tiles of 16 weight rows evenly. Else None (CUDA cores)."""
    nq = p.units // G * p.m
    if st not in HALF_TYPES or p.heads != G or p.width % 16 or B > 8 or nq % 16:
        return None
    return next(w for w in (8, 4, 2, 1) if nq // 16 % w == 0)


def mma_parts(p, G: int, mw: int, w: str, x: str, ld: str) -> tuple:
    """({#define: value}, the weights' load, frame 0's staging, the sums) of the GEMM warps on tensor cores: w the
    weights' element (q = j·nu + u, k) in memory (heads.head_weight), x and ld the operand's frame array."""
    nq, K = p.units // G * p.m, p.width
    mtw, ksteps = nq // 16 // mw, K // 16
    it = p.item.gemm
    defs = {"MW": mw, "XLD": K + 8}     # rows 16 bytes apart past K: a warp's 8 rows in distinct banks
    return (defs, MMA_WEIGHTS.format(MTW=mtw, KSTEPS=ksteps, units=block_units(p.units), w=w),
            MMA_STAGE.format(K=K, x=x, ld=ld, lag=it.delay, per=p.units // p.heads),
            MMA_SUMS.format(MTW=mtw, KSTEPS=ksteps))


def element_inputs(cell, p, arg) -> tuple:
    """([{name: register}] of even and odd frames, {field: lines}) of the element warps' inputs of the forward pair
    p (elements.read_ahead), each in a register: a state the body stores at lag 0 and reads at lag 1 (sLSTM's c, n,
    m) is loaded from memory at frame 0 only, then carried as stored (the register takes the stored value after
    the stores, `carry`); a parameter (a bias the loop adds, plan.schedule.sunk) at frame 0 only, the same every
    frame; the rest is loaded two frames ahead into registers of its own for even (r_) and odd (n_) frames: frame
    s's set is loaded again with frame s + 2's inputs right after the element's arrival at OPERAND (`arrive`, one
    list a parity), so each load has two frames' GEMM and body to arrive in, and no register is copied."""
    spec, where = sources(cell, p.item.fused.nodes, "fwd")
    stored = {where[nm][1]: v for nm, v, op in spec.stores if op == "=" and where[nm][2] == 0}
    wanted = read_ahead(cell, p)
    carried = {nm: stored[src[1]] for nm, src in wanted if src[0] == "val" and src[2] == 1 and src[1] in stored}
    fixed = {nm for nm, src in wanted if src[1] in cell.params}     # a bias (schedule.sunk): the same every frame
    ahead = [(nm, src) for nm, src in wanted if nm not in carried and nm not in fixed]
    even = {nm: f"r_{nm}" for nm, _ in wanted}
    sets = [even, {**even, **{nm: f"n_{nm}" for nm, _ in ahead}}]
    load = lambda regs, items: "".join(f" {regs[nm]} = {element_at(arg, src)};" for nm, src in items)
    decls = [f"{r} = {{}}" for r in dict.fromkeys(r for m in sets for r in m.values())]
    again = lambda regs: [f"if (s + 2 < NF) {{ const int t = s + 2;{load(regs, ahead)} }}"] if ahead else []
    return sets, {
        "registers": f"ST {', '.join(decls)};" if decls else "",
        "first": load(sets[0], wanted), "second": load(sets[1], ahead),
        "arrive": [["rg_arrive(OPERAND, MT + ET);", *again(regs)] for regs in sets],
        "carry": [f"{even[nm]} = {v};" for nm, v in carried.items()]}


def staged_stores(elements: list, k: int) -> tuple:
    """(the element warps' epilogue with each store `AT(...) = v;` written as SG(k, j) = v, as stored, into
    stage[k], k the frame's parity, the store warps' reads of those values, their stores, the values' count)."""
    out, reads, stores = [], [], []
    for ln in elements:
        m = STORE.match(ln)
        if m is None or "xs[" in ln:
            out.append(ln)
            continue
        j = len(stores)
        out.append(f"{m.group(1)}SG({k}, {j}) = {m.group(3)};")
        reads.append(f"\n                    const ST w{j} = SG(s & 1, {j});")
        stores.append(f"\n                    {m.group(2)} = w{j};")
    return out, "".join(reads), "".join(stores), len(stores)


def roles_body(p, roles: tuple, load: str, stage: str, sums: str, inputs: dict, frames: list, total: int,
               st_bytes: int, ct_bytes: int) -> tuple:
    """({#define: value}, the kernel body after KERNEL_HEAD, the math-type elements of shared memory it adds after
    the `total` there) running phase p in warp roles (MT, ET): `load` the weights' load, `stage` frame 0's operand
    staging, `sums` the GEMM's sums, `inputs` the element warps' loads (element_inputs), `frames` their epilogue of
    an even and of an odd frame (the operand's write followed by inputs' arrive lines, then the stores, then the
    carried states)."""
    mt, et = roles
    staged = [staged_stores(lines, k) for k, lines in enumerate(frames)]
    _, reads, stores, nv = staged[0]
    extra = -(-2 * nv * et * st_bytes // ct_bytes)
    fields = {k: v for k, v in inputs.items() if k not in ("carry", "arrive")}
    even, odd = (ROLES_FRAME.format(k=k, units=block_units(p.units), elements="\n".join(out))
                 for k, (out, *_) in enumerate(staged))
    defs = {"MT": mt, "ET": et, "NV": nv, "STAGE_OFF": total, "SUMS": SUMS, "OPERAND": OPERAND, "STAGED": STAGED,
            "FREE": FREE}
    return defs, ROLES_BODY.format(load=load, units=block_units(p.units), stage=stage, sums=sums, even=even,
                                   odd=odd, reads=reads, stores=stores, **fields), extra
