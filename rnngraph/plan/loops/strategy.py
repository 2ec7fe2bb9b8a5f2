"""The record of one loop strategy: everything about it that is not a backend's kernel, in one place."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class LoopStrategy:
    """How one loop strategy runs the recurrent core over time.

    A strategy's module (plan/loops/<name>.py) defines its loop item and this record; plan/loops/__init__.py
    registers it, best first; a backend that has kernels for it runs them (the cupy backend: its module of
    the same name in run/backends/cuda/), every other backend runs `reference`.
    """
    name: str
    item: type                      # the loop item kind the planner emits (forward and backward alike)
    needs: str                      # what the states' classes must be, as an error message says it
    admits: Callable                # (set of the states' class kinds) -> bool
    plan: Callable                  # (schedule) -> (forward loop items, backward loop items)
    title: str                      # the backward loop's heading in `rnngraph schedule`
    views: Callable                 # (workspace, loop item) -> what the kernels and the reference run on
    reference: Callable             # (executor, loop item, workspace, views): the run without a kernel
    blocks: Callable = lambda cell, loop_nodes: None   # -> why an op of the loop rules it out, or None
    describe: Callable | None = None    # (loop item, cell) -> its one line; None: its stages' items, listed
    note: str | Callable | None = None  # a line `rnngraph schedule` adds under the forward loop, or (schedule) -> it
    runs_as: str | None = None      # what the reference amounts to, where it is another strategy ('stages')
    auto_by_reference: bool = True  # whether 'auto' picks it where a backend runs only the reference
    sinks: bool = True              # whether its frames' fused bodies take in a hoisted GEMM's bias or scale
                                    # (plan/schedule.py, sunk): where a frame runs fused bodies anyway
    chunk_frames: int = 1024        # graph mode's chunk of time for it unless the user sets one (0: whole calls),
                                    # measured (H200, training step, chunks / whole calls): LSTM persistent
                                    # and stages, minGRU elementwise at T = 1000, 2000 and 4096, B = 1 and 64:
                                    # 0.82-1.04 at 1024 frames (1.19 elementwise at T = 2000, B = 64, the
                                    # values set aside), 0.84-1.33 at 512 (docs/performance.md)
