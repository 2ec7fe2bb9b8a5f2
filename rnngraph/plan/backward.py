"""The backward plan: post reversed, the loop in reverse time, hoisted parameter-gradient reductions, pre
reversed and the shared-weight accumulation, decided once from a schedule's forward sections."""
from __future__ import annotations

from collections import Counter

from ..ir.ops import KERNEL, MATMUL, OpKind
from .items import FusedGrad, Gemm, GemmGrad, ParamSum, Section, SharedWeight, WeightGrad


def grad_item(cell, it, params: bool, all_frames: bool):
    """The backward item of a forward item. Over all frames, a fused group's kernel has one thread per
    (frame, row, feature): where it reads a node outside the group at several delays, threads of two
    frames add into one row of that node's gradient (atomic adds); where a member reads another member
    at a delay, one frame's gradient needs another's first, so the group runs op by op instead."""
    if isinstance(it, Gemm):
        return GemmGrad(it, params)
    if not all_frames:
        return FusedGrad(it, params)
    members = set(it.nodes)
    reads = {r for n in it.nodes for r in cell.reads(n) if cell.op(r[0]).kind is not OpKind.PARAM}
    if any(u in members and d for u, d in reads):
        return FusedGrad(it, params, one_kernel=False)
    outside = [u for u, _ in reads if u not in members]
    return FusedGrad(it, params, atomic=len(set(outside)) < len(outside))


def reductions(cell, items) -> list:
    """Parameter gradients of `items` reduced once over all frames: one GEMM per merged GEMM (its
    weights together), one sum per vector parameter of a fused group (in the order its reads are first evaluated)."""
    out = []
    for it in items:
        if isinstance(it, Gemm):
            out.append(WeightGrad(it))
            continue
        terms: dict = {}
        for n in it.nodes:
            for slot, (u, _) in enumerate(cell.reads(n)):
                if cell.op(u).kind is OpKind.PARAM:
                    terms.setdefault(u, []).append((n, slot))
        out += [ParamSum(it, p, tuple(ts)) for p, ts in terms.items()]
    return out


def kept_values(cell, nodes) -> set:
    """The members of a fused group whose values a forward must store: the cell's outputs and states, those
    read outside the group or at a delay, and those a gradient reads, by the kernel rules' gradient templates
    (ir/ops.py KERNEL: '{y}' its own output, '{k}' a reader's operand k; a product's reads its operands, never its
    own value; another op without a rule reads all). The others live only inside the group's pass, as an add of two
    products does in an LSTM's gates; so do the products of a pair given with its group (nodes: both), which only
    adds read."""
    members, states = set(nodes), {p for p, _ in cell.states.values()}
    reads = lambda kind: " ".join(KERNEL[kind][1]) if kind in KERNEL else "{0} {1}" if kind in MATMUL else None  # noqa
    keep = set()
    for n in nodes:
        own = reads(cell.op(n).kind)
        if n in cell.outputs or n in states or own is None or "{y}" in own:
            keep.add(n)
            continue
        for c in set(cell.graph.successors(n)):
            theirs = reads(cell.op(c).kind)
            slots = [k for k, (u, d) in enumerate(cell.reads(c)) if u == n]
            if c not in members or theirs is None or any(cell.reads(c)[k][1] for k in slots) or \
                    any(f"{{{k}}}" in theirs for k in slots):
                keep.add(n)
                break
    return keep


def read_back(cell) -> set:
    """The nodes whose values a backward reads (kept_values of the whole graph): a chunk of a call sets these
    aside for its backward and no others (run/chunks.py), as an LSTM's products and gate sums, which only adds
    read, are not."""
    return kept_values(cell, [n for n in cell.graph if cell.op(n).kind is not OpKind.PARAM])


def kept_grads(cell, nodes, aliases=None) -> set:
    """The members of a fused group whose gradients its backward must store: those reading a parameter, whose
    sums over frames are the parameter's gradient (reductions: ParamSum). Every other member's gradient is
    spent inside the group's pass, on its operands'. Where gradients share buffers (aliases: plan/aliases.py),
    a class's buffer is stored once, as its root's gradient, by the group holding the root where a member reads
    the root (its gradient grows in this pass; else the buffer holds it already) and something else reads the
    buffer (a member outside the group, a parameter's sum)."""
    kept = {n for n in nodes if any(cell.op(u).kind is OpKind.PARAM for u, _ in cell.reads(n))}
    if not aliases or not aliases.home:
        return kept
    members, out = set(nodes), {n for n in kept if n not in aliases.home}
    for r in {aliases.root[n] for n in members if n in aliases.root}:
        same = set(aliases.members(r))
        handed = any(u == r and d == 0 for c in members for u, d in cell.reads(c))
        if r in members and handed and (not same <= members or kept & same):
            out.add(r)
    return out


def arriving(cell, nodes) -> set:
    """The members of a fused group whose gradients arrive from outside its pass: the cell's outputs and states
    (the caller's output and final-state gradients), and those read outside the group or at a delay. Every other
    member's gradient starts at zero in the group's backward (nothing else writes it)."""
    members, states = set(nodes), {p for p, _ in cell.states.values()}
    return {n for n in nodes if n in cell.outputs or n in states or
            any(c not in members or d for c in cell.graph.successors(n) for u, d in cell.reads(c) if u == n)}


def shared_weights(cell) -> set:
    """Weights read by several linear ops: each op's block of the merged gradient is added into one."""
    reads = Counter(cell.reads(n)[1][0] for n in cell.graph if cell.op(n).kind in MATMUL)
    return {w for w, k in reads.items() if k > 1}


def backward_sections(sched, loop) -> tuple:
    """The backward plan's sections in run order; loop holds the loop strategy's backward items, in run order."""
    cell, hoist = sched.cell, sched.hoist_param_grads
    loop_items = [it for st in sched.loop for it in st]
    shared = shared_weights(cell)
    gemms = [it for it in sched.items if isinstance(it, Gemm)]
    accumulate = [SharedWeight(it, w, sum(it.sizes[:k]), sum(it.sizes[:k + 1]))
                  for it in gemms for k, w in enumerate(it.weights) if w in shared]
    return (Section("post", tuple(grad_item(cell, it, not hoist, True) for it in reversed(sched.post))),
            Section("loop", loop, per_frame=True),
            Section("reduce", tuple(reductions(cell, loop_items + list(sched.post)) if hoist else ())),
            Section("pre", tuple([grad_item(cell, it, not hoist, True) for it in reversed(sched.pre)] +
                                 (reductions(cell, sched.pre) if hoist else []))),
            Section("shared", tuple(accumulate)))


def next_frame_readers(sched) -> dict:
    """GemmGrad step -> the FusedGrad step that reads the gradient it adds, at the next frame the backward runs:
    per-frame products whose operand is read one frame back (an LSTM's dh@t-1), whose operand is a member of one
    group of the same loop, run as one kernel. The product may leave its sum to that reader (run/executor.py)."""
    out = {}
    for sec in sched.backward:
        for loop in (sec.items if sec.per_frame else ()):
            steps = [it for st in getattr(loop, "stages", ()) for it in st.items]
            for s in (s for s in steps if isinstance(s, GemmGrad) and s.item.delay == 1 and s.item.heads == 1):
                readers = [f for f in steps if isinstance(f, FusedGrad) and s.item.operand in f.item.nodes]
                if len(readers) == 1 and readers[0].one_kernel and not readers[0].params:
                    out[s] = readers[0]
    return out


def capture_problem(sched) -> str | None:
    """Why a whole backward body cannot be recorded (an item over all frames runs op by op, with
    temporaries), or None."""
    for sec in sched.backward:
        for it in sec.items:
            if isinstance(it, FusedGrad) and not it.one_kernel:
                return f"op {it.item.nodes[0]} of {sec.name} reads a member of its fused group at a delay"
    return None
