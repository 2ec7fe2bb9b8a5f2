"""Loop strategy 'persistent': a GEMM on a state whose weights fit on chip; on the GPU one cooperative
kernel a direction holds them in shared memory across all frames."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...ir.ops import KERNEL, MATMUL, REDUCE, OpKind
from ..items import Gemm
from .stages import frame_views, stages_plan, staged_only, walk
from .strategy import LoopStrategy


@dataclass(frozen=True)
class PersistentLoop:
    """The stages' items as one loop, on the GPU one cooperative kernel that holds the per-frame GEMMs'
    weights in shared memory across all frames (run/backends/cuda/persistent/); where a backend cannot
    (the weights do not fit on chip, B too large, no cooperative launch) it runs them frame by frame, as
    'stages'."""
    stages: tuple       # Stage, in run order, as StagesLoop's
    reverse: bool


def persistent_plan(sched, loop=None) -> tuple:
    """(forward, backward) loop items: the stages' items, each direction one PersistentLoop."""
    staged_only(sched, "persistent")
    return stages_plan(sched, loop, PersistentLoop)


def blocks(cell, loop_nodes) -> str | None:
    """Why an op of the loop rules a persistent kernel out whatever the states' classes: it splits features
    over blocks, so it runs no row reduction, concat or slice."""
    inside = set(loop_nodes)
    for n in (n for n in cell.graph if n in inside):        # in creation order
        kind = cell.op(n).kind
        if kind in REDUCE:
            return (f"op {n} ({kind.value}) reduces over features inside the loop, and a persistent kernel "
                    "splits features over blocks")
        if kind in (OpKind.CONCAT, OpKind.SLICE) or kind not in KERNEL and kind not in MATMUL:
            return f"op {n} ({kind.value}) in the loop has no rule a persistent kernel runs"
    return None


def note(sched) -> str:
    """The line under the forward loop: one cooperative kernel, or where every GEMM of the loop is head-wise, a
    kernel whose blocks own whole heads."""
    heads = {it.heads for st in sched.loop for it in st if isinstance(it, Gemm)}
    if heads and 1 not in heads:
        return (f"runs all stages as one kernel a direction on the GPU, each block owning whole heads of the "
                f"{math.gcd(*heads)} the GEMMs keep apart and some of the rows, its weights held on chip, no grid barrier "
                "(up to B = 64, 256 with loop='persistent', where a block's heads fit; else at B ≤ 8 split over more "
                "blocks, with barriers); else frame by frame, as stages")
    return ("runs all stages as one cooperative kernel a direction on the GPU, the weights held on chip "
            "(up to B = 32, the batch split in groups of at most 8 rows beyond 8; on tensor cores (half precision; "
            "float32 in TF32 where allowed, else in 3xTF32 from B = 4-32 by width) from B = 4, up to B = 16-128 by "
            "width, 256 with loop='persistent', in groups of 4 to 16 rows from B = 8; where they fit); else frame by "
            "frame, as stages (rnngraph schedule --batch B --dtype D says which)")


STRATEGY = LoopStrategy(
    name="persistent", item=PersistentLoop, needs="a general state (a GEMM on the state)",
    admits=lambda kinds: "general" in kinds, plan=persistent_plan, blocks=blocks,
    title="loop in reverse time, stages reversed, in one kernel where the GPU fits the weights on chip",
    views=frame_views, reference=walk,
    note=note,
    runs_as="stages", auto_by_reference=False)
