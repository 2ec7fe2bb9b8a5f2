"""rnngraph: write a recurrent cell as a dataflow graph; rnngraph schedules it and runs it fast."""
from .cells import CELLS, GATE_ORDER, load_cell
from .errors import RnnGraphError, RnnGraphWarning
from .graph import Cell, CellGraph, Node
from .ops import Op, OpKind
from .schedule import Schedule, build_schedule

__version__ = "0.1.0"
__all__ = ["CELLS", "GATE_ORDER", "Cell", "CellGraph", "Node", "Op", "OpKind", "RnnGraphError",
           "RnnGraphWarning", "Schedule", "build_schedule", "load_cell"]
