"""CUDA source of the loop strategies that run time inside kernels: the chunked scan of a
linear-diagonal state, and the elementwise time loop generated from the loop's fused groups. Pure
strings: this module runs without a GPU.

Every array is addressed by frame: element (t, b, f) of a [T, B, F] view with row stride ld is
p[(t·B + b)·ld + f]; a vector parameter [F] has ld = 0. A node's buffer [P+T, B, F] holds frame t at
row P + t (the P rows before it: the frames before the call), so a read with delay d is row P + t - d.
"""
from __future__ import annotations

from ..ir.ops import KERNEL, OpKind
from ..plan.items import Fused
from .kernels import HALF_TYPES, kernel_name, math_type, op_expr

# -------------------------------------------------------------------------------------------------
# The scan: s_t = A_t ⊙ s_{t-d} + C_t over d interleaved chains (chain j: frames j, j+d, j+2d, ...)
# per column (b, f). Three kernels: each chunk of a chain composes its (A, C) (part), one thread per
# chain combines the chunks' composites in order into each chunk's carry-in (carry), each chunk
# re-walks its frames from its carry-in, writing the results (out); with one chunk per chain (many
# columns) part is skipped and carry only writes each chain's start. The backward runs the same
# three over reversed chains: H_t = (gm_t + gs_t) + a_{t+d} ⊙ H_{t+d}, H the total gradient of m_t.
# Grid: x over the B·F columns (coalesced), y over (chunk k, chain j) as k·d + j.

SCAN_SOURCE = r"""
#define IDX(ld, t) (((long long)(t) * B + b) * (ld) + f)
#define COLUMN long long col = (long long)blockIdx.x * blockDim.x + threadIdx.x; \
    if (col >= (long long)B * F) return; \
    int b = (int)(col / F), f = (int)(col - (long long)b * F);
#define FRAME(q) int i = {REV} ? k * L + L - 1 - (q) : k * L + (q); int t = j + d * i; if (t >= T) continue;

extern "C" __global__ void rg_scan_{DIR}_part_{TY}({ARGS}int T, int B, int F, int d, int L,
        {TY}* PA, {TY}* PC) {
    COLUMN
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

extern "C" __global__ void rg_scan_{DIR}_out_{TY}({ARGS}int T, int B, int F, int d, int L,
        const {TY}* __restrict__ PC) {
    COLUMN
    int j = blockIdx.y % d, k = blockIdx.y / d;
    {TY} y = PC[blockIdx.y * (long long)B * F + col];
    #pragma unroll 8
    for (int q = 0; q < L; ++q) {
        FRAME(q)
        {STEP}
    }
}
"""

# a, b: the coefficient and offset; s [d+T] rows: frame t at row d + t, so s_{t-d} is row t; m = a ⊙ s_{t-d}
SCAN_FORWARD = dict(
    DIR="fwd", REV="0",
    ARGS="const {S}* __restrict__ a, long long la, const {S}* __restrict__ c, long long lc, {S}* s, long long ls, "
         "{S}* m, long long lm, ",
    COEF="x = a[IDX(la, t)]; y = c[IDX(lc, t)];",
    INIT="s[IDX(ls, j)]",
    STEP="{TY} p = a[IDX(la, t)] * y; y = p + c[IDX(lc, t)]; m[IDX(lm, t)] = p; s[IDX(ls, d + t)] = y;")

# gs [d+T] rows: ∂L/∂s from other readers, overwritten with the totals G_t (its first d rows, the history's,
# get theirs added); gm += G; ga += H ⊙ s_{t-d} and gb += G where those are arrays (has_ga, has_gb)
SCAN_BACKWARD = dict(
    DIR="bwd", REV="1",
    ARGS="const {S}* __restrict__ a, long long la, const {S}* __restrict__ s, long long ls, {S}* gs, long long lgs, "
         "{S}* gm, long long lgm, {S}* ga, long long lga, {S}* gb, long long lgb, int has_ga, int has_gb, ",
    COEF="x = t + d < T ? ({TY})a[IDX(la, t + d)] : 0; y = gm[IDX(lgm, t)] + gs[IDX(lgs, d + t)];",
    INIT="0",
    STEP="{TY} an = t + d < T ? ({TY})a[IDX(la, t + d)] : 0; {TY} G = gs[IDX(lgs, d + t)] + an * y; "
         "{TY} H = gm[IDX(lgm, t)] + G; gs[IDX(lgs, d + t)] = G; gm[IDX(lgm, t)] = H; "
         "if (has_ga) ga[IDX(lga, t)] = ga[IDX(lga, t)] + H * s[IDX(ls, t)]; "
         "if (has_gb) gb[IDX(lgb, t)] = gb[IDX(lgb, t)] + G; "
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


# -------------------------------------------------------------------------------------------------
# The elementwise time loop: one thread per (b, f) walks every frame of the loop's fused groups, member
# values read at a delay carried in registers (forward), gradients owed to earlier frames likewise
# (backward). Frames go in blocks of U whose loads are issued before any of their arithmetic.

ELEMENTWISE_SOURCE = r"""
extern "C" __global__ void {name}({args}int T, int B, int F, int P) {{
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)B * F) return;
    int b = (int)(e / F), f = (int)(e - (long long)b * F);
{init}
    for (int t0 = {first}; {more}; t0 {step} {U}) {{
{decl}
        #pragma unroll
        for (int u = 0; u < {U}; ++u) {{
            int t = t0 {sign} u;
            if ({inside}) {{
{loads}
            }}
        }}
        #pragma unroll
        for (int u = 0; u < {U}; ++u) {{
            int t = t0 {sign} u;
            if (!({inside})) break;
{body}
        }}
    }}
{tail}
}}
"""


def elementwise_nodes(loop) -> list | None:
    """The loop's member nodes in forward order, or None where a kernel cannot walk it: an item that is
    not a fused group (a GEMM), or a concat or slice (a cross-feature op)."""
    items = [it for st in loop.stages for it in st.items]
    if loop.reverse:
        items = [getattr(it, "item", None) for it in reversed(items)]
    if not all(isinstance(it, Fused) for it in items):
        return None
    return [n for it in items for n in it.nodes]


def elementwise_kernel(cell, nodes, direction: str, ctype: str, U: int = 8):
    """(name, source, arguments) of the elementwise time loop over `nodes` (forward order, one feature
    size, no concat/slice); arguments: ("val" | "grad", node) in the kernel's order, each a pointer and
    its row stride. None where a node has no kernel rule, sizes differ or a cross-feature op is present, and
    for half storage: the reference rounds each value a later frame reads and each gradient added into
    an earlier frame, which this kernel carries in registers, so half runs the loop frame by frame."""
    F = {cell.op(n).size for n in nodes}
    if len(F) != 1 or any(cell.op(n).kind not in KERNEL or cell.op(n).kind is OpKind.SLICE for n in nodes) \
            or ctype in HALF_TYPES:
        return None
    idx = {n: k for k, n in enumerate(nodes)}
    ext = list(dict.fromkeys((u, d) for n in nodes for u, d in cell.reads(n) if u not in idx))
    depth = {k: max([d for n in nodes for u, d in cell.reads(n) if idx.get(u) == k] + [0]) for k in range(len(nodes))}

    def operand(u, d, u_ix="[u]"):
        if u in idx:
            return f"v{idx[u]}" if d == 0 else f"r{idx[u]}_{d}"
        return f"x{ext.index((u, d))}{u_ix}"

    at = lambda nm, lag: f"p_{nm}[((long long)(P + t - {lag}) * B + b) * s_{nm} + f]"
    ops = lambda n: [operand(u, d) for u, d in cell.reads(n)]
    fwd = direction == "fwd"
    params = set(cell.params)
    if fwd:
        args = [("val", u) for u, _ in ext] + [("val", n) for n in nodes]
        names = [f"x{j}" for j in range(len(ext))] + [f"y{k}" for k in range(len(nodes))]
        init = [f"{ctype} r{k}_{j} = p_y{k}[((long long)(P - {j}) * B + b) * s_y{k} + f];"
                for k in depth for j in range(1, depth[k] + 1)]
        decl = [f"{ctype} x{j}[{U}];" for j in range(len(ext))]
        loads = [f"x{j}[u] = {at(f'x{j}', d)};" for j, (u, d) in enumerate(ext)]
        body = [f"{ctype} v{idx[n]} = {op_expr(KERNEL[cell.op(n).kind][0], cell, n, ops(n))};" for n in nodes]
        body += [f"{at(f'y{k}', 0)} = v{k};" for k in range(len(nodes))]
        body += [f"r{k}_{j} = {'v' + str(k) if j == 1 else f'r{k}_{j - 1}'};"
                 for k in depth for j in range(depth[k], 0, -1)]
        tail = []
    else:
        gext = [j for j, (u, _) in enumerate(ext) if u not in params]
        delayed = sorted({(idx[u], d) for n in nodes for u, d in cell.reads(n) if u in idx and d})
        args = ([("val", u) for u, _ in ext] + [("val", n) for n in nodes] + [("val", nodes[k]) for k, _ in delayed]
                + [("grad", n) for n in nodes] + [("grad", ext[j][0]) for j in gext])
        names = ([f"x{j}" for j in range(len(ext))] + [f"y{k}" for k in range(len(nodes))]
                 + [f"w{k}_{d}" for k, d in delayed] + [f"gm{k}" for k in range(len(nodes))] + [f"gx{j}" for j in gext])
        init = [f"{ctype} q{k}_{j} = 0;" for k in depth for j in range(depth[k] + 1) if depth[k]]
        decl = [f"{ctype} {nm}[{U}];" for nm in names if not nm.startswith("gx")]
        loads = [f"x{j}[u] = {at(f'x{j}', d)};" for j, (u, d) in enumerate(ext)]
        loads += [f"y{k}[u] = {at(f'y{k}', 0)};" for k in range(len(nodes))]
        loads += [f"w{k}_{d}[u] = {at(f'w{k}_{d}', d)};" for k, d in delayed]
        loads += [f"gm{k}[u] = {at(f'gm{k}', 0)};" for k in range(len(nodes))]
        body = [f"{ctype} v{k} = y{k}[u];" for k in range(len(nodes))]
        body += [f"{ctype} r{k}_{d} = w{k}_{d}[u];" for k, d in delayed]
        body += [f"{ctype} d{k} = gm{k}[u]{f' + q{k}_0' if depth[k] else ''};" for k in range(len(nodes))]
        body += [f"{ctype} a{j} = 0;" for j in gext]
        for n in reversed(nodes):
            op = cell.op(n)
            for slot, (u, d) in enumerate(cell.reads(n)):
                if u in params:
                    continue
                e = op_expr(KERNEL[op.kind][1][slot], cell, n, [operand(v, e_, "[u]") for v, e_ in cell.reads(n)],
                          g=f"d{idx[n]}", y=f"v{idx[n]}")
                target = (f"d{idx[u]}" if d == 0 else f"q{idx[u]}_{d}") if u in idx else f"a{ext.index((u, d))}"
                body.append(f"{target} += {e};")
        body += [f"{at(f'gm{k}', 0)} = d{k};" for k in range(len(nodes))]
        body += [f"{at(f'gx{j}', ext[j][1])} += a{j};" for j in gext]
        body += [f"q{k}_{j} = {f'q{k}_{j + 1}' if j < depth[k] else '0'};"
                 for k in depth if depth[k] for j in range(depth[k] + 1)]
        tail = [f"p_gm{k}[((long long)(P - {j + 1}) * B + b) * s_gm{k} + f] += q{k}_{j};"
                for k in depth for j in range(depth[k])]
    ins = [nm for nm in names if not (nm.startswith("gm") or nm.startswith("gx") or (fwd and nm.startswith("y")))]
    sig = "".join(f"{'const ' if nm in ins else ''}{ctype}* {'__restrict__ ' if nm in ins else ''}p_{nm}, "
                  f"long long s_{nm}, " for nm in names)
    text = ELEMENTWISE_SOURCE.format(
        name="{name}", args=sig, U=U, init=_indent(init, 1), decl=_indent(decl, 2), loads=_indent(loads, 4),
        body=_indent(body, 3), tail=_indent(tail, 1), first="0" if fwd else "T - 1", more="t0 < T" if fwd else "t0 >= 0",
        step="+=" if fwd else "-=", sign="+" if fwd else "-", inside="t < T" if fwd else "t >= 0")
    name = kernel_name(f"eloop_{direction}", text)
    return name, text.replace("{name}", name), args


def _indent(lines, level: int) -> str:
    return "\n".join("    " * level + ln for ln in lines)
