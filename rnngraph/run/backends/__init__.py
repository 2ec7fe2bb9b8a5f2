"""Backends: one factory that picks the array library and sets its one option that modes imply (capture)."""
from __future__ import annotations

from ...errors import RnnGraphError

MODES = ("naive", "staged", "graph")    # graph: the staged schedule, recorded once as CUDA graphs and replayed
GRAPH_ONLY = ("mode 'graph' runs on a cupy backend made for it, get_backend('cupy', 'graph'), and only "
              "there; use 'staged' for eager execution")


def get_backend(name: str = "numpy", mode: str = "staged", **options):
    """'numpy', 'cupy', or 'auto' (cupy when a usable GPU is present, else numpy), set up for `mode`:
    'graph' means a cupy backend that records CUDA graphs (capture=True); this is the one place that
    rule lives. Options go to the cupy backend: matmul ('cublas' | 'own'), lanes (CUDA streams)."""
    check_mode(mode)
    if "capture" in options:
        raise RnnGraphError("get_backend takes the mode, not capture=: get_backend('cupy', 'graph') records "
                            "CUDA graphs")
    if name not in ("numpy", "cupy", "auto"):
        raise RnnGraphError(f"unknown backend {name!r}; choose 'numpy', 'cupy' or 'auto'")
    if name != "numpy":
        from .cupy_backend import CupyBackend, gpu_problem
        problem = gpu_problem()
        if problem is None:
            return CupyBackend(capture=mode == "graph", **options)
        if name == "cupy":
            raise RnnGraphError(problem)
    if mode == "graph":
        raise RnnGraphError(GRAPH_ONLY)
    from .numpy_backend import NumpyBackend
    return NumpyBackend()


def check_mode(mode: str, backend=None) -> None:
    """Raises unless `mode` is known and (given a backend) the backend records exactly when mode is 'graph'."""
    if mode not in MODES:
        raise RnnGraphError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if backend is not None and (mode == "graph") != (backend.records is not None):
        raise RnnGraphError(GRAPH_ONLY)
