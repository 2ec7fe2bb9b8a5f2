"""How each recurrent state depends on itself, read off the graph: the class that says how its loop may run.

- linear_diagonal: s_t = a_t ⊙ s_{t-d} + b_t with a_t and b_t free of every state (hoisted, inputs or
  parameters), in any operand order the builder produces; a parallel scan over time can run it, before
  the rest of the loop (other states may read it).
- elementwise: no cross-feature op (linear, concat, slice) on the state's recurrence, so each feature
  is its own recurrence and one thread can walk time for it.
- general: everything else (the LSTM's W_hh·h): frame by frame, stage by stage, or in one persistent
  kernel that keeps the per-frame GEMMs' weights on chip.

A state's heads: where the only cross-feature ops on its recurrence are head-wise linear ops (block-diagonal
weights), their heads split every value on it into equal blocks, and block h of each reads only block h of
the values before it: each head (each of gcd of their head counts) is a recurrence of its own. A full
linear, concat, slice or row reduction on the recurrence joins all features: no heads (None), as also where
it has no head-wise linear op (an elementwise recurrence needs none: every feature is on its own).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from ..ir.graph import CellGraph
from ..ir.ops import REDUCE, OpKind

CROSS_FEATURE = {OpKind.LINEAR, OpKind.HEAD_LINEAR, OpKind.CONCAT, OpKind.SLICE} | REDUCE


@dataclass(frozen=True)
class StateClass:
    """One state's class; for linear_diagonal also d and the nodes of p = m + b, m = a ⊙ p@t-d."""
    kind: str
    why: str                    # one line, as `rnngraph schedule` prints it
    a: str | None = None
    b: str | None = None
    delay: int = 0
    m: str | None = None        # the product a ⊙ p@t-d
    heads: int | None = None    # the heads its recurrence keeps apart (see above), or None


def classify(cell: CellGraph, pre: set) -> dict:
    """state -> StateClass; `pre` is the set of hoisted nodes (state-free by construction)."""
    g = cell.graph
    free = pre | {n for n in g if cell.op(n).kind in (OpKind.INPUT, OpKind.PARAM)}
    cores = {n: c for c in nx.strongly_connected_components(g) for n in c}
    out = {}
    for s, (p, _) in cell.states.items():
        cycle = cores[p] if len(cores[p]) > 1 or g.has_edge(p, p) else set()
        if not cycle:
            out[s] = StateClass("elementwise", "no recurrence through it")
            continue
        linear = _linear_diagonal(cell, p, cycle, free)
        cross = [n for n in g if n in cycle and cell.op(n).kind in CROSS_FEATURE]     # in creation order
        heads = _heads(cell, cross)
        if linear:
            out[s] = linear
        elif heads:
            out[s] = StateClass("general", f"its recurrence has head-wise linear ops only ({', '.join(cross)}): "
                                           f"{heads} heads, each a recurrence of its own", heads=heads)
        elif cross:
            out[s] = StateClass("general", f"its recurrence has cross-feature ops ({', '.join(cross)})")
        else:
            out[s] = StateClass("elementwise", "its recurrence is elementwise: each feature on its own")
    return out


def _heads(cell, cross: list) -> int | None:
    """The heads a recurrence whose cross-feature ops are `cross` keeps apart: the gcd of their head counts
    where all are head-wise linear ops (and it is above 1), else None."""
    if not cross or any(cell.op(n).kind is not OpKind.HEAD_LINEAR for n in cross):
        return None
    k = math.gcd(*(cell.op(n).attrs[0] for n in cross))
    return k if k > 1 else None


def _linear_diagonal(cell, p: str, cycle: set, free: set) -> StateClass | None:
    """p = a ⊙ p@t-d + b (either order in the add and in the product) with a and b state-free, else None."""
    if cell.op(p).kind is not OpKind.ADD or len(cycle) != 2:
        return None
    for (m, dm), (b, db) in _both_orders(cell.reads(p)):
        if dm or db or b not in free or cell.op(m).kind is not OpKind.MUL:
            continue
        for (a, da), (s, d) in _both_orders(cell.reads(m)):
            if s == p and d >= 1 and a in free and da == 0:
                return StateClass("linear_diagonal", f"{p} = {a} ⊙ {p}@t-{d} + {b}, with {a} and {b} state-free",
                                  a, b, d, m)
    return None


def _both_orders(reads: list) -> list:
    return [(reads[0], reads[1]), (reads[1], reads[0])] if len(reads) == 2 else []
