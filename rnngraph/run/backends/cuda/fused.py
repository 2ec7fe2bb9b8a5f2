"""One generated kernel per fused elementwise group, forward and backward, built from the op table's
kernel rules (ir/ops.py KERNEL).

A fused kernel runs one thread per element (row r, feature f) of the group's [N, F] values. Every
argument is a pointer with a row stride (0 for a vector parameter [F], which broadcasts). Names:
  x<k>  external operand values        v<k>  member values (inputs of the backward kernel)
  y<k>  member values written (fwd)    gm<k> member gradients, read, then overwritten with the total
  gx<k> gradients of external operands, accumulated (+=, or atomicAdd where frames meet)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ....ir.ops import KERNEL, OpKind
from ....plan.backward import arriving, kept_grads, kept_values
from .source import kernel_name, math_type, op_expr

FUSED_SOURCE = r"""
extern "C" __global__ void {name}({args}long long rows, int F) {{
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * F) return;
    long long r = e / F;
    int f = (int)(e - r * F);
{body}
}}
"""


@dataclass(frozen=True)
class KernelSpec:
    """A generated fused kernel: argument names and the arrays that feed them, body and stores."""
    inputs: tuple      # keys: ("val", node) member value, or ("ext", (u, d, cols)) external value
    outputs: tuple     # keys: ("out", node) / ("grad", node) / ("gext", (u, d, cols))
    in_names: tuple
    out_names: tuple
    body: tuple        # C statements over locals
    stores: tuple      # (output name, local, "=" or "+=")
    parts: tuple = ()  # (name, S): a gradient read here also arrives as float32 parts [S, rows, F] (split.py)

    def arrivals(self) -> list:
        """The member gradients (gm<k>) the body reads: each sum arriving from outside, loaded before the body."""
        return [nm for nm in self.out_names if nm.startswith("gm") and self._reads(nm)]

    def read_inputs(self) -> list:
        """The input names the body or the stores read (a backward reads only the values its rules' templates use)."""
        return [nm for nm in self.in_names if self._reads(nm)]

    def _reads(self, nm: str) -> bool:
        return re.search(rf"\b{nm}\b", " ".join(self.body + tuple(v for _, v, _ in self.stores))) is not None

    def olds(self, at, ctype: str, loaded: dict | None = None) -> list:
        """Loads of what the '+=' stores add to, issued with the other loads: after each other's stores
        (which the compiler keeps in order: the pointers may alias) they would wait a load latency each.
        loaded: '<name>_old' -> a register already holding one."""
        return [f"{ctype} {nm}_old = {(loaded or {}).get(nm + '_old') or at(nm)};"
                for nm, _, op in self.stores if op == "+="]

    def writes(self, at) -> list:
        """The stores: '=', '+=' (onto the value olds() loaded) or an atomic add."""
        return [f"atomicAdd(&{at(nm)}, {v});" if op == "atomic" else f"{at(nm)} = {nm}_old + {v};" if op == "+="
                else f"{at(nm)} = {v};" for nm, v, op in self.stores]

    def launch_shape(self, rows: int, F: int) -> tuple:
        """(grid, block): a thread per element."""
        return ((rows * F + 127) // 128,), (128,)

    def args(self, ctype: str) -> str:
        """The kernel's parameters: a pointer to element type ctype and a row stride per name, inputs read-only."""
        return ("".join(f"const {ctype}* __restrict__ p_{nm}, long long s_{nm}, " for nm in self.in_names)
                + "".join(f"{ctype}* p_{nm}, long long s_{nm}, " for nm in self.out_names)
                + "".join(f"const float* __restrict__ pp_{nm}, " for nm, _ in self.parts))

    def part_sums(self) -> list:
        """Lines adding each gradient's parts to it, in order (the kernel's rows and features address them)."""
        return [f"{nm} += pp_{nm}[({s} * rows + r) * F + f];" for nm, S in self.parts for s in range(S)]

    def source(self, ctype: str) -> tuple[str, str]:
        """(kernel name, CUDA source) for element type ctype (CTYPES' values)."""
        at, mt, args = (lambda nm: f"p_{nm}[r * s_{nm} + f]"), math_type(ctype), self.args(ctype)
        lines = [f"{mt} {nm} = {at(nm)};" for nm in self.in_names]
        lines += [f"{mt} {nm} = {at(nm)};" for nm in self.arrivals()] + self.part_sums()
        lines += self.olds(at, mt) + [ln.replace("T ", f"{mt} ") for ln in self.body] + self.writes(at)
        text = FUSED_SOURCE.format(name="{name}", args=args, body="\n".join("    " + ln for ln in lines))
        name = kernel_name("fused", text)
        return name, text.replace("{name}", name)


def externals(cell, nodes):
    """Ordered external reads (u, delay, cols) of a group; cols is the (start, stop) of a slice read."""
    members, out = set(nodes), []
    for n in nodes:
        op = cell.op(n)
        for u, d in cell.reads(n):
            if u in members and d == 0:
                continue
            key = (u, d, op.attrs if op.kind is OpKind.SLICE else None)
            if key not in out:
                out.append(key)
    return out


def operands(cell, n, idx, ext):
    """C names of node n's operands: member values v<k> or external values x<k>."""
    op, names = cell.op(n), []
    for u, d in cell.reads(n):
        if u in idx and d == 0:
            names.append(f"v{idx[u]}")
        else:
            names.append(f"x{ext.index((u, d, op.attrs if op.kind is OpKind.SLICE else None))}")
    return names


def fusable(cell, nodes) -> bool:
    """Whether a group becomes one generated kernel (every op has an expression rule)."""
    return all(cell.op(n).kind in KERNEL for n in nodes)


def fused_forward_kernel(cell, nodes) -> KernelSpec:
    idx = {n: k for k, n in enumerate(nodes)}
    ext = externals(cell, nodes)
    body = tuple(f"T v{idx[n]} = {op_expr(KERNEL[cell.op(n).kind][0], cell, n, operands(cell, n, idx, ext))};"
                 for n in nodes)
    return KernelSpec(tuple(("ext", e) for e in ext), tuple(("out", n) for n in nodes),
                      tuple(f"x{k}" for k in range(len(ext))), tuple(f"y{k}" for k in range(len(nodes))),
                      body, tuple((f"y{k}", f"v{k}", "=") for k in range(len(nodes))))


def backward_io(cell, nodes, param_names, atomic: bool) -> dict:
    """What a group's reverse-mode kernel reads and writes (the KernelSpec fields but its body), and
    idx (member -> k), ext (external reads) and gext (the externals that get gradients, by index)."""
    idx = {n: k for k, n in enumerate(nodes)}
    ext = externals(cell, nodes)
    gext = [k for k, e in enumerate(ext) if e[0] not in param_names]
    several = {u for u, _, _ in ext if sum(e[0] == u for e in ext) > 1} if atomic else set()
    stores = [(f"gm{k}", f"d{k}", "=") for k in range(len(nodes))]
    stores += [(f"gx{k}", f"a{k}", "atomic" if ext[k][0] in several else "+=") for k in gext]
    spec = dict(inputs=tuple([("ext", e) for e in ext] + [("val", n) for n in nodes]),
                outputs=tuple([("grad", n) for n in nodes] + [("gext", ext[k]) for k in gext]),
                in_names=tuple([f"x{k}" for k in range(len(ext))] + [f"v{k}" for k in range(len(nodes))]),
                out_names=tuple([f"gm{k}" for k in range(len(nodes))] + [f"gx{k}" for k in gext]), stores=tuple(stores))
    return {"spec": spec, "idx": idx, "ext": ext, "gext": gext}


def fused_backward_kernel(cell, nodes, param_names, atomic: bool = False, aliases=None) -> KernelSpec:
    """Reverse-mode kernel of a group; gradients of parameters are left to hoisted reductions. atomic:
    gradients of a node read at several delays are added atomically (threads of two frames meet). Where
    gradients share buffers (aliases: plan/aliases.py), the (node, slot) hand-ons into an external operand whose
    gradient is the node's own buffer are skipped (an external gradient nothing adds to is not an output), and an
    external gradient this group alone writes is stored, not added."""
    skips, assigned = (aliases.skips, aliases.assigned) if aliases else ((), ())
    io = backward_io(cell, nodes, param_names, atomic)
    idx, ext, gext = io["idx"], io["ext"], io["gext"]
    body = [f"T d{idx[n]} = gm{idx[n]};" for n in nodes]
    body += [f"T a{k} = 0;" for k in gext]
    added = set()
    for n in reversed(nodes):
        op, ops = cell.op(n), operands(cell, n, idx, ext)
        for slot, ((u, d), name) in enumerate(zip(cell.reads(n), ops)):
            if u in param_names or name[0] == "x" and (n, slot) in skips:
                continue
            e = op_expr(KERNEL[op.kind][1][slot], cell, n, ops, g=f"d{idx[n]}", y=f"v{idx[n]}")
            body.append(f"{'d' if name[0] == 'v' else 'a'}{name[1:]} += {e};")
            added.add(name)
    spec = KernelSpec(body=tuple(body), **io["spec"])
    unused = {f"gx{k}" for k in gext if f"x{k}" not in added}
    alone = {f"gx{k}" for k in gext if ext[k][0] in assigned or sole_read(cell, ext[k], nodes)}
    if not unused and not alone:
        return spec
    keep = [j for j, nm in enumerate(spec.out_names) if nm not in unused]
    return replace(spec, outputs=tuple(spec.outputs[j] for j in keep), out_names=tuple(spec.out_names[j] for j in keep),
                   stores=tuple((nm, v, "=" if nm in alone else op) for nm, v, op in spec.stores if nm not in unused),
                   body=tuple(ln for ln in spec.body if ln not in {f"T a{nm[2:]} = 0;" for nm in unused}))


def sole_read(cell, e, nodes) -> bool:
    """Whether external read e = (u, delay, columns) of a group of `nodes` is u's one read anywhere: by a member,
    whole, at delay 0, u neither an output nor a state (gradients arrive there from the caller and later frames).
    The group's store of u's gradient is then its one write (an LSTM's gate products': the merged GEMMs' output
    gradients), so it stores it ('='), never adds, and u's buffer needs no zeroing (ArrayBackend.untouched_grads)."""
    u, d, cols = e
    reads = [(r, v) for r in set(cell.graph.successors(u)) for v, _ in cell.reads(r) if v == u]
    return d == 0 and cols is None and len(reads) == 1 and reads[0][0] in nodes and \
        cell.op(reads[0][0]).kind is not OpKind.SLICE and cell.op(u).size == cell.op(reads[0][0]).size and \
        u not in cell.outputs and u not in {p for p, _ in cell.states.values()}


def stored_only(cell, nodes, direction: str, spec: KernelSpec, aliases=None) -> KernelSpec:
    """A group's spec storing only what the rest of the step reads: a forward the values of
    plan.backward.kept_values (an LSTM's loop group 7 of its 17), a backward the gradients of kept_grads (those a
    parameter's sum reads: 4 of 17; where gradients share buffers (aliases), a class's once). A dropped gradient's
    arriving sum is still read where one arrives (plan.backward.arriving), else it starts at zero, unread. Used by
    the compiled CPU loops and the GPU's persistent kernels, whose passes over memory these bound."""
    kept = kept_values(cell, nodes) if direction == "fwd" else kept_grads(cell, nodes, aliases)
    drop = [k for k, (kind, n) in enumerate(spec.outputs) if kind in ("out", "grad") and n not in kept]
    outs = [k for k in range(len(spec.outputs)) if k not in drop]
    come = arriving(cell, nodes)
    read = [k for k in drop if spec.outputs[k][0] == "grad" and spec.outputs[k][1] in come]
    zero = {nm for nm, (kind, n) in zip(spec.out_names, spec.outputs) if kind == "grad" and n not in come}
    starts = {f"T d{nm[2:]} = {nm};": f"T d{nm[2:]} = 0;" for nm in zero}     # fused_backward_kernel's first lines
    body = tuple(starts.get(ln, ln) for ln in spec.body)
    return replace(spec, outputs=tuple(spec.outputs[k] for k in outs), out_names=tuple(spec.out_names[k] for k in outs),
                   stores=tuple(st for st in spec.stores if st[0] not in {spec.out_names[k] for k in drop}),
                   inputs=spec.inputs + tuple(spec.outputs[k] for k in read),
                   in_names=spec.in_names + tuple(spec.out_names[k] for k in read), body=body)
