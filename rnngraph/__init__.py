"""rnngraph: write a recurrent cell as a dataflow graph; rnngraph schedules it and runs it fast.

The package has one floor per pipeline stage, and a floor imports only those below it:
errors/arrays → ir (ops, graph, builder, cells) → plan (the schedule) → run (workspace, executor, backends)
→ nn (layers) → train (data, char-LM, loop, checkpoints) → lab (bench, experiments, figures, CLI).
"""
import importlib

from .errors import RnnGraphError, RnnGraphWarning
from .ir.cells import CELLS, GATE_ORDER
from .ir.loading import load_cell
from .ir.builder import Cell, Node
from .ir.graph import CellGraph
from .ir.ops import Op, OpKind
from .plan.schedule import Schedule, build_schedule
from .version import __version__

SUBMODULES = ("nn", "train", "optim", "layers", "losses")     # `rnngraph.nn` etc. work after `import rnngraph`
__all__ = ["CELLS", "GATE_ORDER", "Cell", "CellGraph", "Node", "Op", "OpKind", "RnnGraphError",
           "RnnGraphWarning", "Schedule", "build_schedule", "load_cell", *SUBMODULES]


def __getattr__(name: str):
    """Imports a submodule on first use, so `import rnngraph` stays fast (PEP 562)."""
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
