"""The CPU reference backend: numpy, float32 or float64 (half storage through ml_dtypes)."""
import numpy

from .base import ArrayBackend


class NumpyBackend(ArrayBackend):
    name = "numpy"
    xp = numpy
