"""A persistent backward's parameter sums, taken inside its kernel (kernels.py): the gradient of a vector parameter
that a dfused phase's members read (a bias, a diagonal weight) is the sum over all frames and rows of each reading
member's backward rule (plan.items.ParamSum). Each thread adds its elements' terms, frame by frame, in registers,
and stores them once, after its last frame, into part [rows, columns] (float32, or float64 in double): row b of
the frame, the parameter's columns from its offset. A second launch (SUMS_SOURCE) adds each column's rows in order
into the parameter's gradient. The terms read the members' gradients rounded as stored, as the ParamSum reads them,
so the two differ only in the order of the sum. Nothing is read back from memory: the ParamSum's pass over all T·B
rows of the gradients, and its second kernel, are gone, and the executor skips the ParamSums a compiled loop takes
(Executor._loop). No atomics: every element has one thread, and the rows are added in order.

Measured on an H200 (bfloat16, T = 100, H = 512, training ms, the ParamSums after the loop / the sums in it, two
processes each, alternating): LSTM B = 8 0.695-0.699 / 0.667-0.671, B = 64 1.10-1.20 / 1.07, B = 128 1.74-1.77 /
1.69; GRU B = 8 0.64-0.71 / 0.62-0.63, B = 64 0.90-0.98 / 0.85, B = 128 1.32-1.47 / 1.29; the LSTM at FlashRNN's shape
(T = 1024, B = 16, H = 768; three each) 7.10-7.25 / 7.08-7.12, cuDNN float16 beside them 7.00-7.12.

A term joins only where its rule reads what the body has in locals (the members' gradients d<k>, the inputs it
loads) and the phase's walk gives each thread fixed elements (one, or `per` unrolled: elements.prefetch); the
others stay ParamSums. A kernel whose blocks own whole heads takes none: its threads hold their weight rows in
registers, and the accumulators beside them made it slower (bfloat16, T = 1024, B = 16, H = 768 in 12 heads,
training ms, without / with them, two processes each, alternating): sLSTM 3.05-3.16 / 3.46-3.56, the multi-head
LSTM 2.87-2.96 / 2.98-3.00.
"""
from __future__ import annotations

import re

from .....ir.ops import KERNEL, OpKind
from ..fused import externals, operands
from ..source import CTYPES, math_type, op_expr, rounded
from .phases import THREADS, block_units, sources

SUMS_SOURCE = r"""
extern "C" __global__ void rg_persist_sums_{S}(const {T}* __restrict__ part, int rows, int cols,
        const long long* __restrict__ table, int terms) {{
    // per parameter q (table[4q ..]: its gradient's pointer, its first column in part, its features, 0):
    // grad[f] += part[0, c + f] + part[1, c + f] + ..., in row order
    for (int q = blockIdx.y; q < terms; q += gridDim.y) {{
        {S}* grad = ({S}*)table[4 * q];
        const int c = (int)table[4 * q + 1], F = (int)table[4 * q + 2];
        for (int f = blockIdx.x * blockDim.x + threadIdx.x; f < F; f += gridDim.x * blockDim.x) {{
            {T} total = 0;
            for (int r = 0; r < rows; ++r) total += part[(long long)r * cols + c + f];
            grad[f] = grad[f] + total;
        }}
    }}
}}
"""


def terms(cell, p, st: str) -> list:
    """[(parameter, C expression)] of dfused phase p's vector parameters whose every term its body can add: each
    parameter's terms (its reading members' rules, plan.backward.reductions' order) summed, over the body's locals,
    the members' gradients rounded as stored (type st), as the ParamSum reads them."""
    nodes = p.item.nodes
    spec, _ = sources(cell, nodes, "bwd")
    idx, ext = {n: k for k, n in enumerate(nodes)}, externals(cell, nodes)
    have = {f"d{k}" for k in range(len(nodes))} | set(spec.read_inputs())
    found: dict = {}
    for n in nodes:
        op = cell.op(n)
        for slot, (u, _) in enumerate(cell.reads(n)):
            if cell.op(u).kind is OpKind.PARAM:
                e = op_expr(KERNEL[op.kind][1][slot], cell, n, operands(cell, n, idx, ext),
                            g=rounded(f"d{idx[n]}", st), y=f"v{idx[n]}")
                ok = set(re.findall(r"\b[dvx]\d+\b", e)) <= have and cell.params[u] == (op.size,)
                found.setdefault(u, []).append(e if ok else None)
    return [(u, " + ".join(f"({e})" for e in es)) for u, es in found.items() if None not in es]


def phase_sums(cell, p, st: str, per: int, G: int, B: int, summed: list, cols: dict, load: list,
               after: list) -> list:
    """The lines adding dfused phase p's parameter terms each frame (storage type st; G blocks of B rows), where its
    walk gives each thread fixed elements (one, or `per` unrolled); its registers declared in `load`, its stores after
    the last frame in `after`, [((its group, parameter), register)] added to `summed`, each register's columns (the
    phase's units) to `cols`; kernels.persistent_kernel gathers them."""
    each = -(-(-(-p.units // G) * B) // THREADS)        # the elements a thread walks
    found = terms(cell, p, st) if p.kind == "dfused" and (each == 1 or per == each) else []
    if not found:
        return []
    regs = {}
    for u, e in found:              # one register an expression (terms alike share one)
        regs.setdefault(e, f"ps{len(cols) + len(regs)}")
        summed.append(((p.item, u), regs[e]))
    for r in regs.values():         # each register's columns in part: the phase's units, after those before
        cols[r] = (sum(w for _, w in cols.values()), p.units)
    load.append(declare(list(regs.values()), per))
    after.append((p, [(r, cols[r][0]) for r in regs.values()], per))
    return adds(list(regs.items()), per)


def declare(regs: list, per: int) -> str:
    """The accumulators (registers `regs`, each thread's `per` elements'), before the kernel's first frame."""
    size = f"[{per}]" if per > 1 else ""
    return "    " + " ".join(f"CT {r}{size} = {{}};" for r in regs)


def adds(pairs: list, per: int) -> list:
    """The lines adding a frame's terms [(expression, register)], in the phase's element walk after its body."""
    at = "[i]" if per > 1 else ""
    return [f"            {r}{at} += {e};" for e, r in pairs]


def stores(p, pairs: list, per: int, part: str, width: int, row: str) -> str:
    """The lines after the last frame storing each element's sums [(register, column)] into part [rows, width], at
    row `row` + b (row: the block's first row and ' + ', or '' for one group) and the register's column + f."""
    walk = ["        for (int e = tid; e < nu * NB; e += NT) {"] if per == 1 else \
        ["        #pragma unroll", f"        for (int i = 0; i < {per}; ++i) {{",
         "            const int e = tid + i * NT;", "            if (e >= nu * NB) break;"]
    at = "[i]" if per > 1 else ""
    lines = [f"    {{  {block_units(p.units)}", *walk, "            const int b = e / nu, f = u0 + e - b * nu;"]
    lines += [f"            {part}[(long long)({row}b) * {width} + {c} + f] = {r}{at};" for r, c in pairs]
    return "\n".join(lines + ["        }", "    }"])


def sums_launch(be, part, grads: list) -> tuple:
    """The launch adding part [rows, columns]'s rows into each gradient [(array [F], its first column in part)]."""
    cp, ctype = be.xp, CTYPES[str(grads[0][0].dtype)]
    table = cp.asarray([v for g, c in grads for v in (g.data.ptr, c, g.shape[0], 0)], cp.int64)
    kernel = be.raw(f"rg_persist_sums_{ctype}", SUMS_SOURCE.format(S=ctype, T=math_type(ctype)))
    F = max(g.shape[0] for g, _ in grads)
    return (kernel, (-(-F // 128), len(grads)), (128,),
            (part, cp.int32(part.shape[0]), cp.int32(part.shape[1]), table, cp.int32(len(grads))))
