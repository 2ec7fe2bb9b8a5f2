"""Loop strategy 'stages': frame by frame, stage by stage (the paper's single-stream schedule); the others
reuse its planner."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...errors import RnnGraphError
from ...ir.ops import REDUCE, OpKind
from ..backward import grad_item
from ..items import Fused, Gemm, Pair, Stage
from .strategy import LoopStrategy


@dataclass(frozen=True)
class StagesLoop:
    """Frame by frame (in reverse time when reverse), stage by stage."""
    stages: tuple       # Stage, in run order
    reverse: bool


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


def stages_plan(sched, loop=None, kind=StagesLoop) -> tuple:
    """(forward, backward) loop items, of `kind`, over the loop's stages (or `loop`): paired stages run as
    one Pair; backward stages run in reverse, their items reversed, overlapping only where their gradients
    are disjoint."""
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
    return (kind(tuple(forward), False),), (kind(tuple(backward), True),)


def staged_only(sched, name: str):
    """Raises where a strategy that runs the staged schedule's hoisted work is asked of the naive one."""
    if not sched.hoist_param_grads:
        raise RnnGraphError(f"loop strategy {name!r} runs the staged schedule (its a and b hoisted); mode 'naive' "
                            "runs loop='stages'")


class FrameViews(NamedTuple):
    """What a backend's kernels for a loop of stages run on."""
    vals: dict          # node -> its values [P+T, B, F]
    grads: dict         # node -> its gradients, likewise
    cat: dict           # merged Gemm -> (its output [P+T, B, ΣF], that output's gradient)
    wcat: dict          # merged Gemm -> (its packed weights [ΣF, K], their gradient)
    P: int              # history rows before frame 0
    T: int              # frames
    B: int              # rows
    running: tuple | None   # a chunk's workspace: (the call's cursor [.] int64, where its chunks' rows start);
                            # a kernel walking time may stop after the running chunk's n frames (run/chunks.py)
    aliases: object         # plan.aliases.GradAliases: the gradients that share a buffer in this workspace


def frame_views(ws, loop) -> FrameViews:
    return FrameViews(ws.vals, ws.grads, ws.cat, ws.wcat, ws.P, ws.T, ws.B, ws.running, ws.aliases)


def walk(run, loop, ws, views):
    """The reference of every loop of stages: each frame (in reverse for the backward), stage by stage,
    a stage's items overlapped where they may be."""
    run.walk(loop, ws, overlap=True)


STRATEGY = LoopStrategy(
    name="stages", item=StagesLoop, needs="nothing", admits=lambda kinds: True, plan=stages_plan,
    title="loop in reverse time, stages reversed", views=frame_views, reference=walk)
