"""Loop strategy 'elementwise' on the GPU: one kernel walking time per feature, generated from the loop's
fused groups, and its runner.

Every array is addressed by frame: element (t, b, f) of a [T, B, F] view with row stride ld is
p[(t·B + b)·ld + f]; a vector parameter [F] has ld = 0. A node's buffer [P+T, B, F] holds frame t at
row P + t (the P rows before it: the frames before the call), so a read with delay d is row P + t - d.
"""
from __future__ import annotations

from ....ir.ops import KERNEL, OpKind
from ....plan.items import Fused
from .source import CTYPES, HALF_TYPES, kernel_name, op_expr

# The elementwise time loop: one thread per (b, f) walks every frame of the loop's fused groups, member
# values read at a delay carried in registers (forward), gradients owed to earlier frames likewise
# (backward). Frames go in blocks of U whose loads are issued before any of their arithmetic.

ELEMENTWISE_SOURCE = r"""
extern "C" __global__ void {name}({args}const long long* __restrict__ run, int tab, int T, int B, int F, int P) {{
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)B * F) return;
    if (run) T = (int)run[tab + 3 * run[0] + 1];        // a chunk: the running one's n frames (run/cursor.py)
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


def compile(be, cell, loop, views):
    """The whole loop as one kernel walking time per (b, f), or None where it cannot (a GEMM in the loop,
    half storage)."""
    vals, grads, P, T, B, running, _ = views
    nodes = elementwise_nodes(loop)
    made = nodes and elementwise_kernel(cell, nodes, "bwd" if loop.reverse else "fwd", CTYPES[str(vals[nodes[0]].dtype)])
    if not made:
        return None
    name, src, keys = made
    cp, F = be.xp, cell.op(nodes[0]).size
    args = be.frame_args([(vals if kind == "val" else grads)[n] for kind, n in keys], B)
    return ((be.raw(name, src), ((B * F + 127) // 128,), (128,),
             (*args, *be.running_args(running), cp.int32(T), cp.int32(B), cp.int32(F), cp.int32(P))),)
