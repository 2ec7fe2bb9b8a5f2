"""Backends: a small object per array library. The executor never branches on which one it has."""
from __future__ import annotations

from ...errors import RnnGraphError


def get_backend(name: str = "numpy", **options):
    """'numpy', 'cupy', or 'auto' (cupy when a usable GPU is present, else numpy). Options go to
    the cupy backend: capture (record CUDA graphs), matmul ('cublas' | 'own'), lanes (CUDA streams)."""
    if name == "numpy":
        from .numpy_backend import NumpyBackend
        return NumpyBackend()
    if name in ("cupy", "auto"):
        from .cupy_backend import CupyBackend, gpu_problem
        problem = gpu_problem()
        if problem is None:
            return CupyBackend(**options)
        if name == "auto":
            from .numpy_backend import NumpyBackend
            return NumpyBackend()
        raise RnnGraphError(problem)
    raise RnnGraphError(f"unknown backend {name!r}; choose 'numpy', 'cupy' or 'auto'")
