"""The measurement API behind `rnngraph bench` (the command is bench_command.py): rnngraph's modes against cuDNN
and a torch eager loop.

time_ms() times one callable (CUDA events on the GPU), measure() times one (cell, implementation,
sizes) forward and training step, machine_info() says where it ran. A training step is forward plus
backward with input and weight gradients, against a fixed random grad_y. Example::

    from rnngraph.lab.bench import measure
    r = measure("lstm", "graph", T=100, B=1, H=512)   # {"forward_ms": …, "train_ms": …, …}

torch (lab/references.py) and cupy are imported only when a measurement needs them.
"""
from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..version import __version__
from ..ir.loading import load_cell
from ..plan.schedule import build_schedule
from ..errors import RnnGraphError

IMPLS = ("naive", "staged", "graph", "cudnn", "torch_eager", "jax_scan", "rnngraph_torch", "torch_compile", "flashrnn",
         "flashrnn_cuda", "torch_cpu")
MODES = IMPLS[:3]                                   # the rnngraph implementations
DTYPES = ("float32", "float64", "bfloat16", "float16")
DEFAULT_IMPLS = (*IMPLS[:5], "torch_cpu")   # jax_scan (linear-diagonal cells only), rnngraph_torch, torch_compile,
                                            # flashrnn(_cuda): when asked for
DEFAULT_CELLS = ("lstm", "peephole_lstm", "layernorm_lstm", "min_gru", "mgu")
QUICK = {"T": [8], "B": [2], "H": [16], "repeats": 3, "warmup": 1}
_TF32 = {"on": False}


# -- timing -----------------------------------------------------------------------------------
def time_ms(fn, *, repeats: int = 20, warmup: int = 3, device: str = "cpu") -> list[float]:
    """Milliseconds of each of `repeats` calls of fn, after `warmup` untimed calls. device 'gpu':
    CUDA events around each call on the current stream (cupy's when a GPU is usable to cupy, else
    torch's), synchronising after each; 'cpu': time.perf_counter."""
    if device not in ("cpu", "gpu"):
        raise RnnGraphError(f"device must be 'cpu' or 'gpu', got {device!r}")
    for _ in range(warmup):
        fn()
    if device == "cpu":
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    return _time_cupy(fn, repeats) if gpu_problem() is None else _time_torch(fn, repeats)


def _time_cupy(fn, repeats):
    import cupy
    cupy.cuda.Device().synchronize()
    out = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(cupy.cuda.get_current_stream())
        fn()
        stop.record(cupy.cuda.get_current_stream())
        stop.synchronize()
        out.append(float(cupy.cuda.get_elapsed_time(start, stop)))
    return out


def _time_torch(fn, repeats):
    import torch
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(float(start.elapsed_time(stop)))
    return out


@functools.lru_cache(maxsize=None)
def gpu_problem() -> str | None:
    """run.backends.gpu_problem(), asked once per process."""
    from ..run import backends
    return backends.gpu_problem()


@functools.lru_cache(maxsize=None)
def torch_problem() -> str | None:
    """None when torch imports, else why not."""
    try:
        import torch  # noqa: F401
    except Exception as e:
        return f"torch is not importable ({type(e).__name__}: {e})"
    return None


def set_tf32(on: bool) -> None:
    """TF32 for float32 matmuls: torch's allow_tf32 flags (which rnngraph.torch follows), CUPY_TF32 (which cupy
    reads when it is imported, so call this first) and rnngraph's own cuBLAS handle (Cublas.tf32)."""
    _TF32["on"] = bool(on)
    os.environ["CUPY_TF32"] = "1" if on else "0"
    if torch_problem() is None:
        _torch_tf32()


def _torch_tf32():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = _TF32["on"]
    torch.backends.cudnn.allow_tf32 = _TF32["on"]


# -- one measurement --------------------------------------------------------------------------
def measure(cell, impl: str, *, T: int = 100, B: int = 1, H: int = 512, D: int | None = None, layers: int = 1,
            dtype: str = "float32", repeats: int = 20, warmup: int = 3, what=("forward", "train"),
            seed: int = 0, loop: str = "auto", cell_options: dict | None = None) -> dict:
    """Times one implementation of one cell: forward and/or a training step, median of `repeats`.

    cell: a built-in name, 'module:function' or a cell function; cell_options: its own keywords, e.g.
    {"heads": 12} (recorded as given). impl: one of IMPLS; loop: the loop strategy of rnngraph's
    implementations (the one that ran is recorded as loop_strategy). Returns the configuration plus backend,
    forward_ms / train_ms (medians) and forward_all / train_all (every repeat), or the configuration plus
    'skipped': why, when the implementation is not available here (no GPU, no torch, no cuDNN equivalent).
    """
    impl_name = impl
    impl, dtype = impl_dtype(impl, dtype)
    D, opts = D or H, dict(cell_options or {})
    first = load_cell(cell, D, H, **opts)
    res = {"impl": impl_name, "cell": first.name, "T": T, "B": B, "H": H, "D": D, "layers": layers, "dtype": dtype,
           **({"cell_options": opts} if opts else {})}
    why = unavailable(impl, first)
    if why:
        return {**res, "skipped": why}
    if impl in MODES:
        res["loop"] = loop          # as asked; the one that ran is loop_strategy, and loop_note says why
        fns, backend, device, extra = _rnngraph_fns(cell, impl, T, B, H, D, layers, dtype, seed, loop, opts)
    elif impl in ("jax_scan", "flashrnn", "flashrnn_cuda") and layers != 1:
        return {**res, "skipped": f"the {impl} peer runs one layer"}
    elif impl == "jax_scan":
        from .jax_refs import jax_fns
        fns, backend, device, extra = jax_fns(first.name, T, B, H, D, dtype, seed, _TF32["on"])
    elif impl in ("flashrnn", "flashrnn_cuda"):
        from .flashrnn_refs import flashrnn_fns
        _torch_tf32()
        fns, backend, device, extra = flashrnn_fns(first, impl, T, B, H, D, dtype, seed)
    else:
        from .references import torch_fns
        _torch_tf32()
        fns, backend, device, extra = torch_fns(cell, impl, T, B, H, D, layers, dtype, seed, opts)
    res.update(backend=backend, device=device, tf32=_TF32["on"], **{k: v for k, v in extra.items() if not callable(v)})
    if impl in MODES:           # the first call builds kernels and workspaces (and records, in graph mode)
        first = lambda: (fns[what[-1]](), _backend(impl).synchronize())
        res["first_s"] = round(time_ms(first, repeats=1, warmup=0, device="cpu")[0] / 1e3, 3)
    for w in ("forward", "train"):
        times = time_ms(fns[w], repeats=repeats, warmup=warmup, device=device) if w in what else []
        res[f"{w}_ms"] = statistics.median(times) if times else None
        res[f"{w}_all"] = times
    res.update({k: v() for k, v in extra.items() if callable(v)})      # what ran, read after it ran
    return res


def impl_dtype(impl: str, dtype: str) -> tuple:
    """(implementation, dtype) of an --impls entry: 'cudnn' runs at the run's dtype, 'cudnn@float16' at
    float16 (a peer in another precision, timed in the same process)."""
    name, _, at = impl.partition("@")
    if name not in IMPLS or (at and at not in DTYPES):
        raise RnnGraphError(f"unknown implementation {impl!r}; choose from {', '.join(IMPLS)}, each optionally "
                            f"with @dtype ({', '.join(DTYPES)}), e.g. cudnn@float16")
    return name, at or dtype


def unavailable(impl: str, cell) -> str | None:
    """Why `impl` cannot run `cell` here, or None."""
    if impl == "graph" and gpu_problem():
        return f"needs a usable GPU: {gpu_problem()}"
    if impl in MODES:
        return None
    if impl == "jax_scan":
        from .jax_refs import CELLS, jax_problem
        if not _is_builtin(cell, tuple(CELLS)):
            return f"the JAX peer has these cells only: {', '.join(CELLS)}"
        return jax_problem()
    if torch_problem():
        return torch_problem()
    if impl in ("flashrnn", "flashrnn_cuda"):
        from .flashrnn_refs import flashrnn_problem
        return flashrnn_problem(impl, cell)
    if impl in ("cudnn", "torch_cpu"):
        import torch
        if not _is_builtin(cell, ("lstm", "gru", "rnn_tanh", "rnn_relu")):
            return "no torch.nn layer for this cell (torch.nn has lstm, gru, rnn_tanh, rnn_relu)"
        if impl == "cudnn" and not torch.cuda.is_available():
            return f"needs torch with CUDA (torch {torch.__version__} sees no GPU)"
    return None


def _is_builtin(cell, names) -> bool:
    """Whether `cell` is the built-in cell of its name (the same graph), and one of `names`."""
    if cell.name not in names:
        return False
    ref = load_cell(cell.name, cell.inputs[next(iter(cell.inputs))], cell.op(cell.outputs[0]).size)
    edges = [{(u, v, d["slot"], d["delay"]) for u, v, d in c.graph.edges(data=True)} for c in (cell, ref)]
    return dict(cell.graph.nodes(data="op")) == dict(ref.graph.nodes(data="op")) and edges[0] == edges[1]


@functools.lru_cache(maxsize=None)
def _backend(impl: str):
    """One backend object per rnngraph mode and process: 'auto's (cupy on a GPU, else the compiled cpu backend,
    else numpy)."""
    from ..run.backends import get_backend
    return get_backend("auto", impl)


def _rnngraph_fns(cell, impl, T, B, H, D, layers, dtype, seed, loop="auto", cell_options=None):
    from ..nn.recurrent import Recurrent
    be = _backend(impl)
    if getattr(be, "blas", None) is not None:
        be.blas.tf32 = _TF32["on"]            # --tf32: rnngraph's float32 GEMMs as torch's
    layer = Recurrent(cell, D, H, num_layers=layers, backend=be, mode=impl, dtype=dtype, seed=seed, loop=loop,
                      **(cell_options or {}))
    rng = np.random.default_rng(seed)
    x = be.asarray(rng.standard_normal((T, B, D)), dtype=dtype)
    F = layer.cells[-1].op(layer.cells[-1].outputs[0]).size
    gy = be.asarray(rng.standard_normal((T, B, F)), dtype=dtype)

    def train():
        layer(x)
        layer.backward(gy)
    where = "gpu" if be.name == "cupy" else "cpu"
    extra = {"loop_strategy": lambda: layer.loop_strategy, "loop_note": lambda: layer.loop_note}
    if where == "gpu":          # the persistent kernel that ran: its cores and groups of rows (`rnngraph schedule --batch`)
        extra["gpu_loop"] = lambda: _gpu_loop(layer, loop, B, dtype) if layer.loop_strategy == "persistent" else None
    return {"forward": lambda: layer(x), "train": train}, be.name, where, extra


def _gpu_loop(layer, loop: str, B: int, dtype: str) -> str:
    from .gpu_loop import gpu_loop
    return gpu_loop(build_schedule(layer.cells[0], loop=loop), B, dtype, auto=loop == "auto",
                    tf32=_TF32["on"]).rsplit(", on ", 1)[0]


# -- where it ran -----------------------------------------------------------------------------
def machine_info() -> dict:
    """Device name, driver and CUDA runtime, library versions, rnngraph commit, date, command line."""
    from .doctor import cpu_name, cuda_info, git_commit, versions
    from ..run.backends.cpu.blas import cpu_info
    info = {"rnngraph": __version__, **versions(), **cuda_info(), "cpu": cpu_info()}
    if torch_problem() is None:
        import torch
        info.update(torch_cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version()
                    if torch.cuda.is_available() else None, torch_allow_tf32={
                        "matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32})
        if info.get("gpu") is None and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    prog = "rnngraph" if Path(sys.argv[0]).name in ("__main__.py", "rnngraph") else f"python {sys.argv[0]}"
    info.update(device=info.get("gpu") or cpu_name(), gpu_problem=gpu_problem(), commit=git_commit(),
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command=" ".join([prog, *sys.argv[1:]]),
                tf32=_TF32["on"], cupy_tf32=os.environ.get("CUPY_TF32", "0"))
    return info


# -- the command ------------------------------------------------------------------------------
