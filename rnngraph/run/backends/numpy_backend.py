"""The CPU reference backend: numpy, float32 or float64."""
import numpy

from .base import ArrayBackend


class NumpyBackend(ArrayBackend):
    name = "numpy"
    xp = numpy
    loops = frozenset({"stages", "elementwise", "scan", "persistent"})
    auto_loops = loops - {"persistent"}     # it runs 'persistent' as 'stages' (the reference): no reason to pick it
