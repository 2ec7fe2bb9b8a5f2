"""Gradients that are one another: where a node's only reader hands its gradient on unchanged (an add, a
subtraction's first operand, an identity), the node's gradient is its reader's. An LSTM's gate pre-activation
is the sum of two products and two biases: the gradients of linear1 (x's product), add2 (+ b_ii), linear3
(h's product), add4 (+ b_hi) and add17 (their sum) are one array, [T, B, 4H] for the four gates together.

A backend that shares gradient memory (ArrayBackend.alias_grads) stores each class once: the workspace carves
one buffer a class (a merged GEMM's output gradient where a class holds a linear op, so the per-frame and the
hoisted GEMMs read it in place, a whole merged output as a column window of another's where their columns are
the same classes in order), every backward skips the hand-ons inside a class (`skips`), a fused group stores a
class's gradient once, and a vector parameter's sum over a class already summed for another is a copy
(`twins`). A gradient that one write makes whole (`assigned`: x's, written by one GEMM) is stored there, not
added, and needs no zeroing. The plan says what is equal; the backends that share say so (the numpy one, the
reference, keeps every gradient apart).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.ops import OpKind, hands_on
from .items import Fused, Gemm, ParamSum


@dataclass(frozen=True)
class GradAliases:
    """What a schedule's gradients share: node -> the node whose buffer holds its class (`home`, a class's
    members, itself for the one that owns it), merged GEMM -> (the merged GEMM whose output gradient holds
    its own as columns, their first), the hand-ons (reader, slot) a backward skips, ParamSum -> the earlier
    ParamSum whose sum it equals, and the gradients one write makes whole."""
    home: dict = field(default_factory=dict)
    root: dict = field(default_factory=dict)        # class member -> the class's last node (its reader chain's end)
    windows: dict = field(default_factory=dict)
    skips: frozenset = frozenset()
    twins: dict = field(default_factory=dict)
    assigned: frozenset = frozenset()     # nodes whose gradient one write makes whole (_assigned): '=', not '+='

    def classes(self, order) -> list:
        """Each class's members as a list in `order` (the cell's nodes), the classes by their first member."""
        out: dict = {}
        for n in (n for n in order if n in self.home):
            out.setdefault(self.home[n], []).append(n)
        return list(out.values())

    def members(self, n: str) -> list:
        """The nodes whose gradient is n's (n among them), or [n]."""
        return [m for m, h in self.home.items() if h == self.home[n]] if n in self.home else [n]


def grad_aliases(sched, loop: bool) -> GradAliases:
    """The schedule's gradient classes. loop: whether the loop's nodes take part (its backward is stages of
    FusedGrad and GemmGrad items; a scan keeps its own gradients). Nothing for the naive schedule."""
    cell = sched.cell
    if not sched.hoist_param_grads:
        return GradAliases()
    items = list(sched.pre) + list(sched.post) + ([it for st in sched.loop for it in st] if loop else [])
    item_of = {n: it for it in items if isinstance(it, (Fused, Gemm)) for n in it.nodes}
    fixed = {*cell.inputs, *cell.outputs, *cell.params, *(p for p, _ in cell.states.values())}
    edges = []
    for c in (c for c, it in item_of.items() if isinstance(it, Fused)):
        for slot, (n, d) in enumerate(cell.reads(c)):
            reads = [u for r in cell.graph.successors(n) for u, _ in cell.reads(r) if u == n]
            if d == 0 and hands_on(cell.op(c).kind, slot) and n in item_of and n not in fixed and \
                    len(reads) == 1 and cell.op(n).size == cell.op(c).size:
                edges.append((n, c, slot))
    up = dict((n, c) for n, c, _ in edges)
    top = {}
    for n in up:
        top[n] = n
        while top[n] in up:
            top[n] = up[top[n]]
    at, windows = {}, {}        # at: class -> (primary merged GEMM, column, the linear op whose buffer holds it)
    gemms = [it for it in dict.fromkeys(item_of.values()) if isinstance(it, Gemm)]
    for g in sorted(gemms, key=lambda g: -sum(g.sizes)):
        spot = _window(g, top, at)
        if spot is not None:
            windows[g] = spot
            continue
        off = 0
        for n, f in zip(g.nodes, g.sizes):
            if n in top and at.setdefault(top[n], (g, off, n))[:2] != (g, off):
                del top[n]      # its class's buffer is elsewhere: it keeps its own, its reader adds into it
            off += f
    home = {}
    for n, r in top.items():
        home[n] = home[r] = at[r][2] if r in at else r
    skips = frozenset((c, slot) for n, c, slot in edges if n in top)
    return GradAliases(home, {**{r: r for r in top.values()}, **top}, windows, skips, _twins(sched, home),
                       _assigned(cell, item_of, home, skips))


def _assigned(cell, item_of, home, skips) -> frozenset:
    """Nodes whose gradient one backward write makes whole, so it is stored ('=', a GEMM with beta 0) and never
    needs zeroing: read at delay 0, whole, by one item besides their own (a merged GEMM's operand: x, or an MGU's
    f ⊙ h; a fused group's operand read by one other group), and by nothing else but their own group. Not an
    output, state or parameter (gradients arrive there from the caller and the frames before), nor a member of a
    class (its root stores it once)."""
    fixed, out = {*cell.outputs, *cell.params, *(p for p, _ in cell.states.values())}, set()
    for u in (u for u in cell.graph if u not in fixed and u not in home):
        writes = set()
        for r in set(cell.graph.successors(u)):
            for slot, (v, d) in enumerate(cell.reads(r)):
                whole = cell.op(r).kind is not OpKind.SLICE         # a slice writes its columns only
                if v == u and (r, slot) not in skips and not (item_of.get(r) is item_of.get(u) is not None and d == 0):
                    writes.add((item_of.get(r), d, whole))
        if len(writes) == 1 and next(iter(writes))[0] is not None and next(iter(writes))[1:] == (0, True):
            out.add(u)
    return frozenset(out)


def _window(g, top, at) -> tuple | None:
    """(primary merged GEMM, column) where each linear op of g is in a class held at the same place of one
    primary's output, in order (an LSTM's x- and h-products: the same four gates): g's output gradient is those
    columns of the primary's."""
    places = [at.get(top.get(n)) for n in g.nodes]
    if None in places:
        return None
    (p, start, _), off = places[0], places[0][1]
    for (q, col, _), f in zip(places, g.sizes):
        if (q, col) != (p, off):
            return None
        off += f
    return p, start


def _twins(sched, home) -> dict:
    """ParamSum -> an earlier one (in run order) that sums the same class's gradient by the same rule '{g}' (a
    bias of an add: b_ii's and b_hi's gradients in an LSTM); each parameter summed by one ParamSum only."""
    sums = [it for sec in sched.backward for it in sec.items if isinstance(it, ParamSum)]
    once = {p for p in (s.param for s in sums) if sum(s.param == p for s in sums) == 1}
    cell, seen, out = sched.cell, {}, {}
    for s in sums:
        key = tuple((home.get(n), cell.op(n).kind, slot) for n, slot in s.terms)
        if s.param not in once or any(h is None or not hands_on(kind, slot) for h, kind, slot in key):
            continue
        if key in seen:
            out[s] = seen[key]
        else:
            seen[key] = s
    return out
