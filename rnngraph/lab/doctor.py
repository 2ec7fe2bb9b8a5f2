"""`rnngraph doctor`: the versions rnngraph runs on, and a tiny forward-and-backward check per backend.

Every available backend and mode runs a 2-layer LSTM (T=5, B=3) forward and backward, and its
outputs, final states and all gradients are compared with the numpy float64 naive run (the spec).
A GPU that cupy cannot use is reported in one line with the fix (run.backends.gpu_problem()).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

TOL = {"float64": 1e-10, "float32": 1e-4}   # relative error, by dtype (issue 4)
CHECKS = [("numpy", "staged", "float64"), ("numpy", "staged", "float32"),
          ("cupy", "staged", "float64"), ("cupy", "staged", "float32"),
          ("cupy", "graph", "float64"), ("cupy", "graph", "float32")]


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cupy_installed() -> bool:
    return "cupy" in sys.modules or importlib.util.find_spec("cupy") is not None


def versions() -> dict:
    """python, numpy, networkx, cupy ('not installed' when absent) and torch (None when absent)."""
    import networkx
    out = {"python": platform.python_version(), "numpy": np.__version__, "networkx": networkx.__version__,
           "cupy": "not installed", "torch": _dist_version("torch")}
    if cupy_installed():
        try:
            import cupy
            out["cupy"] = cupy.__version__
        except Exception as e:
            out["cupy"] = f"installed, not importable ({type(e).__name__})"
    return out


def _try(fn):
    try:
        return fn()
    except Exception:
        return None


def cuda_info() -> dict:
    """CUDA runtime and driver versions, GPU name and memory (GiB): from cupy, else from nvidia-smi
    (then cuda_driver is the NVIDIA driver's version); None where unknown."""
    from ..run.backends.cuda.usable import cuda_version
    info = {"cuda_runtime": None, "cuda_driver": None, "gpu": None, "gpu_memory_gib": None}
    cp = _try(lambda: __import__("cupy")) if cupy_installed() else None
    if cp is not None:
        rt = cp.cuda.runtime
        info["cuda_runtime"] = _try(lambda: cuda_version(rt.runtimeGetVersion()))
        info["cuda_driver"] = _try(lambda: cuda_version(rt.driverGetVersion()))
        props = _try(lambda: rt.getDeviceProperties(0))
        if props:
            info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            info["gpu_memory_gib"] = round(props["totalGlobalMem"] / 2 ** 30, 1)
    if info["gpu"] is None and shutil.which("nvidia-smi"):
        q = _try(lambda: subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                         "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                        timeout=10).stdout.splitlines()[0].split(", "))
        if q and len(q) == 3:
            info["gpu"], info["cuda_driver"] = q[0], info["cuda_driver"] or f"NVIDIA {q[1]}"
            info["gpu_memory_gib"] = _try(lambda: round(float(q[2]) / 1024, 1))
    return info


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    """The checkout's commit ('+dirty' with local changes); RNNGRAPH_COMMIT names it where a copy
    of the tree has no .git (e.g. a tree copied to a GPU machine)."""
    if os.environ.get("RNNGRAPH_COMMIT"):
        return os.environ["RNNGRAPH_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


# -- self-check -------------------------------------------------------------------------------
def _backend(name: str, mode: str):
    from ..run.backends import get_backend
    return get_backend(name, mode)


def _run(backend: str, mode: str, dtype: str, state: dict | None = None) -> tuple:
    """(outputs and gradients as float64 numpy arrays, the layer's state_dict) of a tiny 2-layer LSTM.
    The forward and backward run twice on different inputs, so graph mode is checked on a replay."""
    from ..nn.recurrent import LSTM
    layer = LSTM(4, 8, num_layers=2, backend=_backend(backend, mode), mode=mode, dtype=dtype, seed=0)
    if state is not None:
        layer.load_state_dict(state)
    be, rng = layer.backend, np.random.default_rng(1)
    for _ in range(2):
        x, gy = rng.standard_normal((5, 3, 4)), rng.standard_normal((5, 3, 8))
        y, (h, c) = layer(be.asarray(x, dtype=dtype))
        gx, (gh, gc), grads = layer.backward(be.asarray(gy, dtype=dtype))
    arrays = [y, h, c, gx, gh, gc, *grads.values()]
    return [np.asarray(be.to_numpy(a), dtype=np.float64) for a in arrays], layer.state_dict()


def self_check(backend: str, mode: str, dtype: str) -> float:
    """The largest relative error (‖got − ref‖ / ‖ref‖ per array) against numpy float64 naive."""
    ref, state = _run("numpy", "naive", "float64")
    got, _ = _run(backend, mode, dtype, state)
    return max(float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-300)) for g, r in zip(got, ref))


# -- the command ------------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("--require-gpu", action="store_true", help="fail (status 1) when cupy cannot use a GPU")


def run(args) -> int:
    """Prints versions and one line per check; 0 when every available check passes, else 1.
    No usable GPU is reported in one line and fails only with --require-gpu."""
    from ..version import __version__
    from ..run.backends import gpu_problem
    v, c = versions(), cuda_info()
    print(f"rnngraph {__version__} doctor (commit {git_commit() or 'unknown'})")
    for k in ("python", "numpy", "networkx", "cupy", "torch"):
        print(f"  {k:<9} {v[k] or 'not installed'}")
    print(f"  {'CUDA':<9} runtime {c['cuda_runtime'] or '-'}, driver {c['cuda_driver'] or '-'}")
    gpu = f"{c['gpu']} ({c['gpu_memory_gib']} GiB)" if c["gpu"] else "none found"
    print(f"  {'GPU':<9} {gpu}")
    problem = gpu_problem()
    if problem:
        print(f"GPU not usable: {problem}")
    failed = bool(problem) and getattr(args, "require_gpu", False)
    print("self-check: 2-layer LSTM forward and backward vs numpy float64 naive (relative error)")
    for backend, mode, dtype in CHECKS:
        label = f"  {backend:<6} {mode:<7} {dtype:<8}"
        if backend == "cupy" and problem:
            print(f"{label} skipped (no usable GPU)")
            continue
        try:
            err = self_check(backend, mode, dtype)
        except Exception as e:
            print(f"{label} FAIL  {type(e).__name__}: {' '.join(str(e).splitlines())}")
            failed = True
            continue
        ok = err <= TOL[dtype]
        failed |= not ok
        print(f"{label} {'pass' if ok else 'FAIL'}  {err:.1e} (tolerance {TOL[dtype]:.0e})")
    print("doctor: " + ("problems found" if failed else "all available checks passed"))
    return 1 if failed else 0
