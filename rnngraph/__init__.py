"""rnngraph: write a recurrent cell as a dataflow graph; rnngraph schedules it and runs it fast."""
import importlib

from .cells import CELLS, GATE_ORDER, load_cell
from .errors import RnnGraphError, RnnGraphWarning
from .graph import Cell, CellGraph, Node
from .ops import Op, OpKind
from .schedule import Schedule, build_schedule

__version__ = "0.1.0"
SUBMODULES = ("layers", "losses", "nn", "optim")   # `rnngraph.nn` etc. work after `import rnngraph`
__all__ = ["CELLS", "GATE_ORDER", "Cell", "CellGraph", "Node", "Op", "OpKind", "RnnGraphError",
           "RnnGraphWarning", "Schedule", "build_schedule", "load_cell", *SUBMODULES]


def __getattr__(name: str):
    """Imports a submodule on first use, so `import rnngraph` stays fast (PEP 562)."""
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
