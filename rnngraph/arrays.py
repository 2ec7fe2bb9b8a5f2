"""Array-module helpers shared by layers, losses and optimizers: numpy or cupy, chosen by the array."""
from __future__ import annotations

import sys

import numpy

from .errors import RnnGraphError

FLOAT_DTYPES = ("float32", "float64")


def array_module(a):
    """numpy or cupy, whichever owns `a`. Never imports cupy: if cupy is not loaded, `a` cannot be a cupy array.

    >>> array_module(numpy.zeros(3)) is numpy
    True
    """
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return cupy.get_array_module(a)
    return numpy


def float_dtype(dtype) -> numpy.dtype:
    """'float32' / 'float64' (or the numpy dtypes) as a numpy dtype; anything else is an error."""
    try:
        dt = numpy.dtype(dtype)
    except TypeError as e:
        raise RnnGraphError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype!r}") from e
    if dt.name not in FLOAT_DTYPES:
        raise RnnGraphError(f"dtype must be one of {FLOAT_DTYPES}, got {dt.name!r}")
    return dt


def to_numpy(a) -> numpy.ndarray:
    """A host numpy copy of `a` (numpy or cupy), for checkpoints."""
    get = getattr(a, "get", None)
    return get() if callable(get) and not isinstance(a, numpy.ndarray) else numpy.array(a, copy=True)


def make_rng(seed=None, rng=None) -> numpy.random.Generator:
    """The numpy Generator a module draws from: `rng` as given, or a new one from `seed` (not both)."""
    if rng is not None and seed is not None:
        raise RnnGraphError("pass either seed or rng, not both")
    if rng is not None:
        if not isinstance(rng, numpy.random.Generator):
            raise RnnGraphError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        return rng
    return numpy.random.default_rng(seed)
