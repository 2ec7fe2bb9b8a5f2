"""rnngraph: write a recurrent cell as a dataflow graph; rnngraph schedules it and runs it fast.

The package has one floor per pipeline stage, and a floor imports only those below it:
errors/arrays → ir (ops, graph, builder, cells) → plan (the schedule) → run (workspace, executor, backends)
→ nn (layers) → train (data, char-LM, loop, checkpoints) → lab (bench, experiments, figures, CLI).
"""
import importlib
import importlib.abc
import importlib.util
import sys

from .errors import RnnGraphError, RnnGraphWarning
from .ir.cells import CELLS, GATE_ORDER, load_cell
from .ir.builder import Cell, Node
from .ir.graph import CellGraph
from .ir.ops import Op, OpKind
from .plan.schedule import Schedule, build_schedule
from .version import __version__

MOVED = {"optim": "nn.optim", "layers": "nn.layers", "losses": "nn.losses"}   # public before the floors
SUBMODULES = ("nn", "train", *MOVED)        # `rnngraph.nn` etc. work after `import rnngraph`
__all__ = ["CELLS", "GATE_ORDER", "Cell", "CellGraph", "Node", "Op", "OpKind", "RnnGraphError",
           "RnnGraphWarning", "Schedule", "build_schedule", "load_cell", *SUBMODULES]


def __getattr__(name: str):
    """Imports a submodule on first use, so `import rnngraph` stays fast (PEP 562)."""
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{MOVED.get(name, name)}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import rnngraph.optim` (and layers, losses) loads the module's home in rnngraph.nn."""

    def find_spec(self, fullname, path, target=None):
        package, _, name = fullname.rpartition(".")
        return importlib.util.spec_from_loader(fullname, self) if package == __name__ and name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}")

    def exec_module(self, module):
        """The import system has just given the real module the alias's spec: give it its own back."""
        module.__spec__ = importlib.util.spec_from_file_location(module.__name__, module.__file__)


sys.meta_path.append(_MovedFinder())
