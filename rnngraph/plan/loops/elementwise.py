"""Loop strategy 'elementwise': no cross-feature op on the recurrent path (IndRNN, SRU's c), so one kernel
can walk time for each feature, its delayed values in registers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .stages import stages_plan, staged_only
from .strategy import LoopStrategy


@dataclass(frozen=True)
class ElementwiseLoop:
    """The stages' items as one loop (one kernel where a backend compiles it, each thread walking time for
    its features); a backend that does not runs them frame by frame."""
    stages: tuple       # Stage, in run order, as StagesLoop's
    reverse: bool


def elementwise_plan(sched, loop=None) -> tuple:
    """(forward, backward) loop items: the stages' items, each direction one ElementwiseLoop."""
    staged_only(sched, "elementwise")
    return stages_plan(sched, loop, ElementwiseLoop)


class ElementViews(NamedTuple):
    """What a backend's kernel for an elementwise loop runs on (the fields as stages.FrameViews')."""
    vals: dict          # node -> its values [P+T, B, F]
    grads: dict         # node -> its gradients, likewise
    P: int
    T: int
    B: int
    running: tuple | None
    aliases: object


def frame_by_frame(run, loop, ws, views):
    """The reference: the stages' items frame by frame, in order (bit for bit what 'stages' computes)."""
    run.walk(loop, ws, overlap=False)


STRATEGY = LoopStrategy(
    name="elementwise", item=ElementwiseLoop, needs="every state linear_diagonal or elementwise",
    admits=lambda kinds: kinds <= {"linear_diagonal", "elementwise"}, plan=elementwise_plan,
    title="loop in reverse time, each feature on its own (stages listed)",
    views=lambda ws, loop: ElementViews(ws.vals, ws.grads, ws.P, ws.T, ws.B, ws.running,
                                                          ws.aliases), reference=frame_by_frame)
