"""Loop strategies: how the recurrent core runs over time, each one record (strategy.LoopStrategy) in a
module of its own, registered here best first; 'auto' picks the first a cell admits.

Adding a strategy is its module here (its loop item, planner, reference and record), one line below, and,
for a kernel on the GPU, a module of the same name in run/backends/cuda/.
"""
from __future__ import annotations

from ...errors import RnnGraphError
from . import elementwise, persistent, scan, stages
from .elementwise import ElementwiseLoop
from .persistent import PersistentLoop
from .scan import ScanLoop
from .stages import StagesLoop, gemm_fused_pairs
from .strategy import LoopStrategy

STRATEGIES = {s.name: s for s in (scan.STRATEGY, elementwise.STRATEGY, persistent.STRATEGY, stages.STRATEGY)}
NAMES = ("auto", *STRATEGIES)       # what `loop=` and `--loop` take
BY_ITEM = {s.item: s for s in STRATEGIES.values()}

__all__ = ["BY_ITEM", "NAMES", "STRATEGIES", "ElementwiseLoop", "LoopStrategy", "PersistentLoop", "ScanLoop",
           "StagesLoop", "admitted", "blocked", "gemm_fused_pairs", "resolve_loop", "strategy_of"]


def strategy_of(loop_item) -> LoopStrategy:
    """The record of the strategy a loop item belongs to."""
    return BY_ITEM[type(loop_item)]


def blocked(cell, loop_nodes) -> dict:
    """{strategy: why} for the strategies an op of the loop rules out whatever the states' classes."""
    return {s.name: why for s in STRATEGIES.values() if (why := s.blocks(cell, loop_nodes))}


def admitted(classes: dict, blocked: dict | None = None) -> tuple:
    """The loop strategies whose requirement the states' classes meet and no op of the loop blocks
    (`blocked`: strategy -> why), best first (stages always)."""
    kinds = {c.kind for c in classes.values()}
    return tuple(s.name for s in STRATEGIES.values() if s.admits(kinds) and s.name not in (blocked or {}))


def resolve_loop(name: str, classes: dict, cell: str, runs=tuple(STRATEGIES), staged: bool = True,
                 blocked: dict | None = None) -> str:
    """The strategy a schedule runs: 'auto' picks the best one the cell admits among those the backend
    `runs` ('stages' for the naive schedule); a named one must be one the cell admits, else one clear
    error (saying which state, or which op of the loop (`blocked`: strategy -> why), stops it)."""
    admits = admitted(classes, blocked)
    if name == "auto":
        return next((s for s in admits if s in runs), "stages") if staged else "stages"
    if name not in STRATEGIES:
        raise RnnGraphError(f"unknown loop strategy {name!r}; choose one of {', '.join(NAMES)}")
    if name in (blocked or {}):
        raise RnnGraphError(f"cell '{cell}' does not admit loop strategy {name!r}: {blocked[name]}; "
                            f"it admits {', '.join(admits)}")
    if name not in admits:
        states = "; ".join(f"state {s} is {c.kind} ({c.why})" for s, c in classes.items())
        raise RnnGraphError(f"cell '{cell}' does not admit loop strategy {name!r}: it needs {STRATEGIES[name].needs}; "
                            f"{states}; it admits {', '.join(admits)}")
    return name
