"""Loop strategies: how the recurrent core runs over time, each a planner of its forward and backward loop items.

A new strategy (an elementwise time loop, a parallel scan, a persistent kernel) is one entry in LOOPS
with its own loop item kind, plus a runner in the executor and backend entries; 'auto' picks one.
"""
from __future__ import annotations

from ..errors import RnnGraphError
from ..ir.ops import OpKind
from .backward import grad_item
from .classify import ADMITS, admitted
from .items import Fused, Gemm, Pair, Stage, StagesLoop


def gemm_fused_pairs(sched) -> set:
    """Loop stages k whose lone GEMM feeds the lone fused group of stage k+1 element by element
    (every linear op of the GEMM has the group's size and is read unshifted, unsliced)."""
    cell, loop, out = sched.cell, sched.loop, set()
    for k in range(len(loop) - 1):
        (g, *rest), (f, *more) = loop[k], loop[k + 1]
        if rest or more or not isinstance(g, Gemm) or not isinstance(f, Fused):
            continue
        size = cell.op(f.nodes[0]).size
        reads = [(d, cell.op(n).kind) for n in f.nodes for u, d in cell.reads(n) if u in g.nodes]
        if set(g.sizes) == {size} and reads and all(d == 0 and kind is not OpKind.SLICE for d, kind in reads):
            out.add(k)
    return out


def _disjoint_grads(cell, stage) -> bool:
    """Whether the items of a stage add their gradients into different nodes (may overlap)."""
    seen = set()
    for it in stage:
        reads = {it.operand} if isinstance(it, Gemm) else {u for n in it.nodes for u, _ in cell.reads(n)}
        if reads & seen:
            return False
        seen |= reads
    return True


def stages_loop(sched) -> tuple:
    """(forward, backward) loop items of strategy 'stages': paired stages run as one Pair; backward
    stages run in reverse, their items reversed, overlapping only where their gradients are disjoint."""
    cell, loop, pairs = sched.cell, sched.loop, gemm_fused_pairs(sched)
    forward, k = [], 0
    while k < len(loop):
        if k in pairs:
            forward.append(Stage((Pair(loop[k][0], loop[k + 1][0]),), False))
            k += 2
        else:
            forward.append(Stage(loop[k], len(loop[k]) > 1))
            k += 1
    params = not sched.hoist_param_grads
    backward = [Stage(tuple(grad_item(cell, it, params, False) for it in reversed(st)),
                      len(st) > 1 and _disjoint_grads(cell, st)) for st in reversed(loop)]
    return StagesLoop(tuple(forward), False), StagesLoop(tuple(backward), True)


LOOPS = {"stages": stages_loop}     # strategy -> planner of its (forward, backward) loop items


def resolve_loop(name: str, classes: dict, cell: str) -> str:
    """The strategy a schedule runs: 'auto' picks the best one the cell admits and rnngraph implements
    (today 'stages'); a named one must be both, else one clear error saying which it is not."""
    admits = admitted(classes)
    if name == "auto":
        return next(s for s in admits if s in LOOPS)
    if name not in ADMITS:
        raise RnnGraphError(f"unknown loop strategy {name!r}; choose one of {', '.join(['auto', *ADMITS])}")
    if name not in admits:
        why = "; ".join(f"state {s} is {c.kind} ({c.why})" for s, c in classes.items() if c.kind not in ADMITS[name])
        raise RnnGraphError(f"cell '{cell}' does not admit loop strategy {name!r}: {why}; it admits "
                            f"{', '.join(admits)}")
    if name not in LOOPS:
        raise RnnGraphError(f"cell '{cell}' admits loop strategy {name!r}, but rnngraph does not implement it yet "
                            f"(it runs {', '.join(LOOPS)}); use loop='auto'")
    return name
