"""CUDA source of a fused group that holds a row reduction (SUM, MEAN: a layer norm's mean and variance):
one block per row, so the reduction never leaves the block and the group's per-feature work runs beside
it, in one kernel.

The block's NT threads own the row's features f = tid + q·NT, q < Q (Q·NT ≥ F, both fixed when the
source is made from the group's size F), each member value a register array [Q]. An elementwise member
is its kernel rule (ir/ops.py KERNEL) applied per q; a reduction adds the operand's Q values per thread,
then the block's partial sums in a fixed order (warp shuffles, then warps in turn), so a run is bit for
bit reproducible, and the value is broadcast back to every feature, as the op keeps its operand's size.
The backward is the reverse: an elementwise member's rule per q; a reduction's operand gets the block
sum of the reduction's gradient (its VJP broadcasts it back). Arguments and names are the per-element
fused kernel's (fused.py), so the backends pass the same arrays.
"""
from __future__ import annotations

from dataclasses import dataclass

from ....ir.ops import KERNEL, REDUCE, OpKind
from .fused import KernelSpec, backward_io, externals, fusable, fused_backward_kernel, fused_forward_kernel, operands, \
    stored_only
from .source import ROW_REDUCTION, kernel_name, math_type, op_expr

ROW_THREADS = 256           # a block's threads at most; fewer (a multiple of 32) for rows narrower than that

ROW_SOURCE = r"""
#define Q {Q}
#define NT {NT}
template <typename T> static __device__ __forceinline__ T {SUM}(T s, T* red) {{
    // the block's sum of every thread's s, in one fixed order; every thread gets it
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0;
    for (int w = 0; w < NT / 32; ++w) s += red[w];
    __syncthreads();
    return s;
}}
extern "C" __global__ void __launch_bounds__(NT) {name}({args}long long rows, int F) {{
    // one block per row r; thread tid owns features tid + q * NT, q < Q
    __shared__ {T} red[32];
    const long long r = blockIdx.x;
    const int tid = threadIdx.x;
{body}
}}
"""


@dataclass(frozen=True)
class RowSpec(KernelSpec):
    """A fused group with a row reduction, run one block per row: the per-element spec's arguments and
    stores, a body whose lines starting with FOR_Q run for each of a thread's features, the block's
    threads and the features each owns."""
    threads: int = ROW_THREADS
    per_thread: int = 1

    def source(self, ctype: str) -> tuple[str, str]:
        """(kernel name, CUDA source) for element type ctype (kernels.CTYPES' values)."""
        mt, at, args = math_type(ctype), (lambda nm: f"p_{nm}[r * s_{nm} + f]"), self.args(ctype)
        loaded = list(self.in_names) + [nm for nm in self.out_names if nm.startswith("gm")]
        lines = [f"{mt} {nm}[Q];" for nm in loaded]
        lines += _each_q([f"{nm}[q] = f < F ? ({mt}){at(nm)} : ({mt})0;" for nm in loaded])
        for ln in self.body:
            lines += _each_q([ln[len(FOR_Q):]]) if ln.startswith(FOR_Q) else [ln.replace("T ", f"{mt} ")]
        lines += _each_q(["if (f < F) " + (f"atomicAdd(&{at(nm)}, {v}[q]);" if op == "atomic" else
                                            f"{at(nm)} = {at(nm)} + {v}[q];" if op == "+=" else f"{at(nm)} = {v}[q];")
                          for nm, v, op in self.stores])
        text = ROW_SOURCE.format(name="{name}", SUM=ROW_REDUCTION, Q=self.per_thread, NT=self.threads, T=mt,
                                 args=args, body="\n".join("    " + ln for ln in lines))
        name = kernel_name("row", text)
        return name, text.replace("{name}", name)

    def launch_shape(self, rows: int, F: int) -> tuple:
        """(grid, block): a block per row."""
        return (rows,), (self.threads,)


FOR_Q = "@q "   # a body line evaluated for each of a thread's features q (f = tid + q·NT)


def _each_q(lines: list) -> list:
    return ["#pragma unroll", "for (int q = 0; q < Q; ++q) {", "    const int f = tid + q * NT;", "    (void)f;"] + \
        ["    " + ln for ln in lines] + ["}"]


def row_group(cell, nodes) -> bool:
    """Whether a fused group holds a row reduction and so runs as a row kernel (its other ops have rules)."""
    kinds = {cell.op(n).kind for n in nodes}
    return bool(kinds & REDUCE) and all(k in KERNEL or k in REDUCE for k in kinds)


def _shape(cell, nodes) -> dict:
    F = cell.op(nodes[0]).size
    threads = min(ROW_THREADS, -(-F // 32) * 32)
    return {"threads": threads, "per_thread": -(-F // threads)}


def _reduce(cell, n, operand: str, out: str, add: bool = False) -> list:
    """Lines: out [Q] (+)= the reduction n (SUM or MEAN) of operand [Q] over the row, broadcast."""
    scale = "" if cell.op(n).kind is OpKind.SUM else " / F"
    return ["{", "    T s = 0;", *["    " + ln for ln in _each_q([f"if (f < F) s += {operand}[q];"])],
            f"    s = {ROW_REDUCTION}(s, red){scale};",
            *["    " + ln for ln in _each_q([f"{out}[q] {'+=' if add else '='} s;"])], "}"]


def row_forward_kernel(cell, nodes) -> RowSpec:
    idx = {n: k for k, n in enumerate(nodes)}
    ext = externals(cell, nodes)
    body = []
    for n in nodes:
        k, names = idx[n], operands(cell, n, idx, ext)
        body.append(f"T v{k}[Q];")
        if cell.op(n).kind in REDUCE:
            body += _reduce(cell, n, names[0], f"v{k}")
        else:
            body.append(FOR_Q + f"v{k}[q] = {op_expr(KERNEL[cell.op(n).kind][0], cell, n, [f'{nm}[q]' for nm in names])};")
    return RowSpec(tuple(("ext", e) for e in ext), tuple(("out", n) for n in nodes),
                   tuple(f"x{k}" for k in range(len(ext))), tuple(f"y{k}" for k in range(len(nodes))),
                   tuple(body), tuple((f"y{k}", f"v{k}", "=") for k in range(len(nodes))), **_shape(cell, nodes))


def row_backward_kernel(cell, nodes, param_names, atomic: bool = False) -> RowSpec:
    """The reverse of row_forward_kernel, with the per-element backward's arguments and stores
    (kernels.backward_io); parameters' gradients are left to the hoisted reductions."""
    io = backward_io(cell, nodes, param_names, atomic)
    idx, ext, gext = io["idx"], io["ext"], io["gext"]
    body = [ln for k in range(len(nodes)) for ln in (f"T d{k}[Q];", FOR_Q + f"d{k}[q] = gm{k}[q];")]
    body += [ln for j in gext for ln in (f"T a{j}[Q];", FOR_Q + f"a{j}[q] = 0;")]
    for n in reversed(nodes):
        op, names = cell.op(n), operands(cell, n, idx, ext)
        for slot, ((u, _), name) in enumerate(zip(cell.reads(n), names)):
            if u in param_names:
                continue
            target = ("d" if name[0] == "v" else "a") + name[1:]
            if op.kind in REDUCE:
                body += _reduce(cell, n, f"d{idx[n]}", target, add=True)
            else:
                e = op_expr(KERNEL[op.kind][1][slot], cell, n, [f"{nm}[q]" for nm in names],
                            g=f"d{idx[n]}[q]", y=f"v{idx[n]}[q]")
                body.append(FOR_Q + f"{target}[q] += {e};")
    return RowSpec(body=tuple(body), **io["spec"], **_shape(cell, nodes))


def group_kernel(cell, nodes, direction: str):
    """The kernel spec the GPU runs for a fused group in direction 'fwd', 'bwd' or 'bwd_atomic' (parameter
    gradients summed inside, naive mode's loop): a row kernel where the group holds a row reduction, else the
    elementwise kernel, which stores only what the rest of the step reads (fused.stored_only; minGRU's
    backward over all frames: 7 of 23 arrays at T = 4096). None where an op has no kernel rule."""
    if row_group(cell, nodes):
        return row_forward_kernel(cell, nodes) if direction == "fwd" else \
            row_backward_kernel(cell, nodes, set(cell.params), direction == "bwd_atomic")
    if not fusable(cell, nodes):
        return None
    if direction == "bwd_atomic":
        return fused_backward_kernel(cell, nodes, set(cell.params), True)
    spec = fused_forward_kernel(cell, nodes) if direction == "fwd" else \
        fused_backward_kernel(cell, nodes, set(cell.params))
    return stored_only(cell, nodes, direction, spec)
