"""The CPU reference backend: numpy, float32 or float64."""
import numpy

from .base import ArrayBackend


class NumpyBackend(ArrayBackend):
    name = "numpy"
    xp = numpy
    loops = frozenset({"stages", "elementwise", "scan", "persistent"})

    @property
    def auto_loops(self) -> frozenset:
        """It runs 'persistent' as 'stages' (the reference), so auto has no reason to pick it here."""
        return self.loops - {"persistent"}
