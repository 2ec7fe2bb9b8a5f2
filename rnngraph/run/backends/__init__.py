"""Backends: one registry of their names, and one factory that resolves a mode into the backend it makes.

A mode is resolved here, once: 'naive' and 'staged' are eager, 'graph' records CUDA graphs; the backend
carries it (`backend.mode`), and every executor and layer over it reads it from there.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable

from ...errors import RnnGraphError, RnnGraphWarning

MODES = ("naive", "staged", "graph")    # graph: the staged schedule, recorded once as CUDA graphs and replayed


@dataclass(frozen=True)
class Entry:
    """One backend: how to make it for a mode, why it cannot run here (None: it can), the modes it runs and
    the options it takes."""
    make: Callable          # (mode, **options) -> backend
    problem: Callable       # () -> str | None
    modes: tuple
    options: tuple = ()
    fallback: bool = False  # 'auto' passing it over says so once (a missing package, not a missing device)


def _numpy(mode: str):
    from .numpy_backend import NumpyBackend
    return NumpyBackend(mode)


def _cupy(mode: str, **options):
    from .cuda.backend import CupyBackend
    return CupyBackend(mode, **options)


def _cpu(mode: str, **options):
    from .cpu.backend import CpuBackend
    return CpuBackend(mode, **options)


def cpu_problem() -> str | None:
    """None when the compiled CPU backend runs here (numba, numpy's BLAS), else one line with the fix."""
    from .cpu import jit
    return jit.problem()


def cpu_backend() -> str:
    """The name of the fastest backend for arrays in host memory: 'cpu' where it runs here, else 'numpy' (saying
    why once, as 'auto' does); for callers that hold CPU arrays on a machine that may have a GPU too."""
    problem = cpu_problem()
    if problem:
        _passed_over("cpu", problem, "numpy")
    return "numpy" if problem else "cpu"


def gpu_problem() -> str | None:
    """None when cupy and a GPU are usable, else one line saying what is wrong and how to fix it."""
    from .cuda import usable
    return usable.gpu_problem()


# by name, in the order 'auto' tries them: the first that runs here and runs the mode
_CUPY_OPTIONS = ("matmul", "lanes", "max_graphs", "max_graph_bytes", "chunk_frames", "tf32")
BACKENDS = {"cupy": Entry(_cupy, gpu_problem, MODES, _CUPY_OPTIONS),
            "cpu": Entry(_cpu, cpu_problem, ("naive", "staged"), ("blas_threads", "mkl"), fallback=True),
            "numpy": Entry(_numpy, lambda: None, ("naive", "staged"))}
CHOICES = ("auto", *sorted(BACKENDS))       # what `backend=` and `--backend` take


@functools.lru_cache(maxsize=None)
def _passed_over(name: str, problem: str, used: str):
    """The one warning a process gets when `used` runs because backend `name` cannot: why, and the fix."""
    warnings.warn(f"running the {used} backend, not the {name} backend: {problem}", RnnGraphWarning, stacklevel=4)


def get_backend(name: str = "numpy", mode: str = "staged", **options):
    """The backend `name` ('auto': the first of BACKENDS usable here that runs `mode`: cupy on a GPU, else the
    compiled 'cpu' where numba is installed, else 'numpy', the reference) made for `mode`:
    'naive', 'staged' or 'graph' (a cupy backend that records CUDA graphs). Options go to that backend
    (cupy: matmul 'cublas' | 'own', lanes, chunk_frames, max_graphs, max_graph_bytes, tf32; cpu: blas_threads, mkl;
    'auto' passes each only those it takes). Example::

        be = get_backend("auto", "graph")       # cupy recording CUDA graphs; an error naming why without a GPU
    """
    if mode not in MODES:
        raise RnnGraphError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if "capture" in options:
        raise RnnGraphError("get_backend takes the mode, not capture=: get_backend('cupy', 'graph') records "
                            "CUDA graphs")
    if name not in CHOICES:
        raise RnnGraphError(f"unknown backend {name!r}; choose one of {', '.join(repr(c) for c in CHOICES)}")
    if name == "auto":
        usable = [n for n, e in BACKENDS.items() if e.problem() is None]
        name = next((n for n in usable if mode in BACKENDS[n].modes), None)
        if name is None:
            why = "; ".join(f"{n}: {e.problem()}" for n, e in BACKENDS.items() if mode in e.modes and e.problem())
            raise RnnGraphError(f"mode {mode!r} needs a backend that runs it, and none can run here ({why})")
        options = {k: v for k, v in options.items() if k in BACKENDS[name].options}
        for n in list(BACKENDS)[:list(BACKENDS).index(name)]:
            if BACKENDS[n].fallback and mode in BACKENDS[n].modes:
                _passed_over(n, BACKENDS[n].problem(), name)
    entry = BACKENDS[name]
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        raise RnnGraphError(f"the {name} backend takes no option {', '.join(unknown)}; it takes "
                            f"{', '.join(entry.options) or 'none'}")
    if mode not in entry.modes:
        runs = [n for n, e in BACKENDS.items() if mode in e.modes]
        raise RnnGraphError(f"mode {mode!r} runs on the {', '.join(runs)} backend, not on {name}; use 'staged' for "
                            "eager execution")
    problem = entry.problem()
    if problem:
        raise RnnGraphError(problem)
    return entry.make(mode, **options)
