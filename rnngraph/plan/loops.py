"""Loop strategies: how the recurrent core runs over time, each a planner of its forward and backward loop items.

A strategy is one entry in LOOPS with its own loop item kind, plus a runner in the executor and the
backends that run it (their `loops`); 'auto' picks one.
"""
from __future__ import annotations

from ..errors import RnnGraphError
from ..ir.ops import REDUCE, OpKind
from .backward import grad_item
from .classify import ADMITS, admitted
from .items import ElementwiseLoop, Fused, Gemm, Pair, PersistentLoop, ScanLoop, Stage, StagesLoop


def gemm_fused_pairs(cell, loop) -> set:
    """Loop stages k whose lone GEMM feeds the lone fused group of stage k+1 element by element
    (every linear op of the GEMM has the group's size and is read unshifted, unsliced; the group has no
    row reduction)."""
    out = set()
    for k in range(len(loop) - 1):
        (g, *rest), (f, *more) = loop[k], loop[k + 1]
        if rest or more or not isinstance(g, Gemm) or not isinstance(f, Fused):
            continue
        size = cell.op(f.nodes[0]).size
        reads = [(d, cell.op(n).kind) for n in f.nodes for u, d in cell.reads(n) if u in g.nodes]
        rows = any(cell.op(n).kind in REDUCE for n in f.nodes)      # a row kernel: a block per row, not per feature
        if set(g.sizes) == {size} and reads and not rows and all(d == 0 and kind is not OpKind.SLICE
                                                                 for d, kind in reads):
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


def stages_loop(sched, loop=None) -> tuple:
    """(forward, backward) loop items of strategy 'stages' over the loop's stages (or `loop`): paired
    stages run as one Pair; backward stages run in reverse, their items reversed, overlapping only where
    their gradients are disjoint."""
    cell = sched.cell
    loop = sched.loop if loop is None else loop
    pairs = gemm_fused_pairs(cell, loop)
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
    return (StagesLoop(tuple(forward), False),), (StagesLoop(tuple(backward), True),)


def _staged_only(sched, name: str):
    if not sched.hoist_param_grads:
        raise RnnGraphError(f"loop strategy {name!r} runs the staged schedule (its a and b hoisted); mode 'naive' "
                            "runs loop='stages'")


def _whole(kind, name: str):
    """The planner of a strategy that runs the stages' items as one loop item per direction, of `kind`."""
    def plan(sched, loop=None) -> tuple:
        _staged_only(sched, name)
        (forward,), (backward,) = stages_loop(sched, loop)
        return (kind(forward.stages, False),), (kind(backward.stages, True),)
    plan.__doc__ = f"(forward, backward) loop items of strategy {name!r}: the stages' items, each direction one loop item."
    return plan


elementwise_loop = _whole(ElementwiseLoop, "elementwise")
persistent_loop = _whole(PersistentLoop, "persistent")


def scan_loop(sched) -> tuple:
    """(forward, backward) loop items of strategy 'scan': one chain (p, m, a, b, d) per linear-diagonal
    state, where p = m + b and m = a ⊙ p@t-d, scanned over all frames; the rest of the loop (the other
    states, which may read the scanned ones) runs after it, per feature where every other state is
    elementwise, else frame by frame; its backward runs before the reverse scan."""
    _staged_only(sched, "scan")
    scanned = {s: c for s, c in sched.state_classes.items() if c.kind == "linear_diagonal"}
    chains = tuple((sched.cell.states[s][0], c.m, c.a, c.b, c.delay) for s, c in scanned.items())
    done = {n for p, m, *_ in chains for n in (p, m)}
    stages = (tuple(filter(None, (_without(it, done) for it in stage))) for stage in sched.loop)
    rest = tuple(filter(None, stages))          # the loop's stages without the scanned nodes, none left empty
    forward, backward = (ScanLoop(chains, False),), (ScanLoop(chains, True),)
    if not rest:
        return forward, backward
    others = {c.kind for s, c in sched.state_classes.items() if s not in scanned}
    f, b = (elementwise_loop if others <= {"elementwise"} else stages_loop)(sched, rest)
    return forward + f, b + backward


def _without(it, nodes: set):
    """A loop item without the given nodes (a fused group loses them; None when nothing is left)."""
    if not isinstance(it, Fused):
        return it
    keep = tuple(n for n in it.nodes if n not in nodes)
    return Fused(keep) if keep else None


LOOPS = {"stages": stages_loop, "elementwise": elementwise_loop, "scan": scan_loop,     # planners, by strategy
         "persistent": persistent_loop}


def resolve_loop(name: str, classes: dict, cell: str, runs=tuple(ADMITS), staged: bool = True,
                 blocked: dict | None = None) -> str:
    """The strategy a schedule runs: 'auto' picks the best one the cell admits among those the backend
    `runs` ('stages' for the naive schedule); a named one must be one the cell admits, else one clear
    error (saying which state, or which op of the loop (`blocked`: strategy -> why), stops it)."""
    admits = admitted(classes, blocked)
    if name == "auto":
        return next((s for s in admits if s in runs), "stages") if staged else "stages"
    if name not in ADMITS:
        raise RnnGraphError(f"unknown loop strategy {name!r}; choose one of {', '.join(['auto', *ADMITS])}")
    if name in (blocked or {}):
        raise RnnGraphError(f"cell '{cell}' does not admit loop strategy {name!r}: {blocked[name]}; "
                            f"it admits {', '.join(admits)}")
    if name not in admits:
        need, _ = ADMITS[name]
        states = "; ".join(f"state {s} is {c.kind} ({c.why})" for s, c in classes.items())
        raise RnnGraphError(f"cell '{cell}' does not admit loop strategy {name!r}: it needs {need}; {states}; "
                            f"it admits {', '.join(admits)}")
    return name
