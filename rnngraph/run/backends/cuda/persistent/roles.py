"""Warp roles in a persistent kernel whose blocks own whole heads (phases.per_head) and whose only phase is a pair
that hands its operand on in shared memory (heads.handed_on: sLSTM's and the multi-head LSTM's forward on CUDA
cores): some warps sum each frame's GEMM, others run its elements, and neither waits for the other's memory traffic.

Without roles every warp runs both, one after the other, with a block-wide barrier after each: a frame costs the
GEMM, then the elements' loads, body and stores (sLSTM: 7 loads and 15 stores an element, their addresses 64-bit
arithmetic), and the next frame's GEMM waits for the last of those stores to issue. With roles:

  GEMM warps [0, MT)         frame t: the sums into gs, arrive at SUMS; wait at OPERAND for h_t in xs
  element warps [MT, MT+ET)  frame t: load its inputs; wait at SUMS; the body from gs; h_t into xs, arrive at
                             OPERAND; then its stores, which issue while the GEMM warps sum frame t + 1

so a frame's critical path is the GEMM and the body's arithmetic. SUMS and OPERAND are named barriers of MT + ET
threads (bar.sync 0, __syncthreads, is not used in the loop); the warps past MT + ET leave after frame 0's operand is
staged. Shared memory stays race-free: the element warps read gs(t) before they arrive at OPERAND(t), after which
the GEMM warps write gs(t + 1); they write xs after SUMS(t), when the GEMM warps have read it for frame t.
"""
from __future__ import annotations

from .elements import element_at, read_ahead
from .phases import THREADS, block_units, sources

SUMS, OPERAND = 1, 2        # the named barriers' ids (0 is __syncthreads')

ROLES_SYNC = r"""static __device__ __forceinline__ void rg_wait(int id, int n) {{
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory");        // a warp at a time, all its threads
}}
static __device__ __forceinline__ void rg_arrive(int id, int n) {{
    asm volatile("barrier.cta.arrive %0, %1;" :: "r"(id), "r"(n) : "memory");   // any of a warp's threads
}}
"""     # (a template, as kernels.SYNC)

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
        #pragma unroll 2
        for (int s = 0; s < NF; ++s) {{        // two frames an iteration: the n-registers alternate, not copied
            const int t = s;
            rg_wait(SUMS, MT + ET);
            {{  {units}
{elements}
            if (tid >= nu * NB) rg_arrive(OPERAND, MT + ET);
            else {{
                const int b = tid / nu, f = u0 + tid - b * nu;{rotate}
                if (s + 2 < NF) {{ const int t = s + 2;{ahead} }}
            }}
            }}
        }}
    }}
}}
"""


def warp_roles(p, G: int, B: int, rows: int) -> tuple | None:
    """(MT, ET): the GEMM warps' and the element warps' threads of the kernel whose only phase is the handed-on
    pair p, its weights resident (a thread one weight row against `rows` x rows, heads.resident) on G blocks of B
    rows, where both roles fit in a block, each element warp's thread one element; else None."""
    nu = -(-p.units // G)
    warps = lambda n: -(-n // 32) * 32
    mt, et = warps(nu * p.m * (B // rows)), warps(nu * B)
    return (mt, et) if mt + et <= THREADS else None


def element_inputs(cell, p, arg) -> tuple:
    """({name: register}, {field: lines}) of the element warps' inputs of the forward pair p (elements.read_ahead),
    each in a register: a state the body stores at lag 0 and reads at lag 1 (sLSTM's c, n, m) is loaded from memory
    at frame 0 only, then carried as stored (the register takes the stored value after the stores, `carry`); the
    rest is loaded two frames ahead (`second`, `ahead` into the n-registers, `rotate` at the end of each frame), so
    its trip to memory overlaps a frame's GEMM and body instead of waiting after the GEMM."""
    spec, where = sources(cell, p.item.fused.nodes, "fwd")
    stored = {where[nm][1]: v for nm, v, op in spec.stores if op == "=" and where[nm][2] == 0}
    wanted = read_ahead(cell, p)
    carried = {nm: stored[src[1]] for nm, src in wanted if src[0] == "val" and src[2] == 1 and src[1] in stored}
    cur = {nm: f"r_{nm}" for nm, _ in wanted}
    ahead = [(nm, src) for nm, src in wanted if nm not in carried]
    load = lambda regs, items: "".join(f" {regs[nm]} = {element_at(arg, src)};" for nm, src in items)
    nxt = {nm: f"n_{nm}" for nm, _ in ahead}
    regs = [f"{r} = {{}}" for r in (*cur.values(), *nxt.values())]
    return cur, {
        "registers": f"ST {', '.join(regs)};" if regs else "",
        "first": load(cur, wanted), "second": load(nxt, ahead), "ahead": load(nxt, ahead),
        "rotate": "".join(f" {cur[nm]} = {nxt[nm]};" for nm, _ in ahead),
        "carry": [f"{cur[nm]} = {v};" for nm, v in carried.items()]}


def roles_body(p, roles: tuple, load: str, stage: str, sums: str, inputs: dict, elements: list) -> tuple:
    """({#define: value}, the kernel body after KERNEL_HEAD) running phase p in warp roles (MT, ET): `load` the
    weights' load, `stage` frame 0's operand staging, `sums` the GEMM's sums, `inputs` the element warps' loads
    (element_inputs), `elements` their epilogue (the operand's write followed by arrive_line(), then the stores, then
    the carried states)."""
    mt, et = roles
    fields = {k: v for k, v in inputs.items() if k != "carry"}
    return {"MT": mt, "ET": et, "SUMS": SUMS, "OPERAND": OPERAND}, ROLES_BODY.format(
        load=load, units=block_units(p.units), stage=stage, sums=sums, elements="\n".join(elements), **fields)


def arrive_line() -> str:
    """The element warps' arrival at OPERAND, in their epilogue right after the operand's write into xs."""
    return "rg_arrive(OPERAND, MT + ET);"
