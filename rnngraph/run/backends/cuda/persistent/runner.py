"""Loop strategy 'persistent' on the cupy backend: whether this GPU runs a loop's persistent kernel
(kernels.py; cooperative, or per head an ordinary launch) at this B and dtype, else why not, and the
launches that run it."""
from __future__ import annotations

import functools
import warnings

from .....errors import RnnGraphWarning
from ..source import CTYPES
from .kernels import ZERO_SOURCE, persistent_kernel
from .phases import MAX_ROWS, block_counts, problem

_KERNELS: dict = {}      # (id(cell), loop, ctype, B, blocks) -> (cell, persistent_kernels.Persistent)
_REFUSED: set = set()


def compile(be, cell, loop, views):
    """The launches running `loop` on the executor's views: zeroing the barrier counter (and numbering the
    launch), then the cooperative kernel (per head the kernel alone); None where why_not() says why not."""
    vals, grads, cat, wcat, P, T, B = views
    dtype = next(iter(cat.values()))[0].dtype
    if why_not(be, cell, loop, B, dtype):
        return None
    cp, k = be.xp, kernel(be, cell, loop, B, dtype)
    pick = {"val": vals.__getitem__, "grad": grads.__getitem__, "cat": lambda it: cat[it][0],
            "dcat": lambda it: cat[it][1], "w": lambda it: wcat[it][0],
            "xb": lambda n: cp.zeros((2, B, cell.op(n).size), cp.uint64)}     # tagged words, two frames
    args = []
    for kind, key in k.args:
        a = pick[kind](key)
        args += [a] if kind in ("w", "xb") else be.frame_args([a], B)
    bar = cp.zeros(2, cp.uint32)            # barrier count, launch number; kept with the launch (the memo)
    raw = be.raw(k.name, k.source, cooperative=k.cooperative)
    raw.max_dynamic_shared_size_bytes = k.smem
    run = (functools.partial(raw, shared_mem=k.smem), (k.blocks,), (k.threads,), (bar, *args, cp.int32(T), cp.int32(P)))
    return ((be.raw("rg_persist_zero", ZERO_SOURCE), (1,), (1,), (bar,)), run) if k.cooperative else (run,)


def why_not(be, cell, loop, B: int, dtype) -> str | None:
    """Why this GPU runs `loop` frame by frame at B rows of dtype, or None: what no persistent kernel runs,
    B, no cooperative launch (said once in a warning), or shared memory too small for the weights in dtype."""
    why = problem(cell, loop)
    if why or B > MAX_ROWS:
        return why or f"B={B} rows: a persistent kernel takes at most {MAX_ROWS}"
    facts, k = device(be.xp.cuda.Device().id), kernel(be, cell, loop, B, dtype)
    if k.cooperative and not facts.get("CooperativeLaunch", 0):
        return refused("this GPU cannot launch cooperative kernels")
    need, have = k.smem, facts["MaxSharedMemoryPerBlockOptin"]
    if need > have:
        return (f"its weights and rows need {need / 1024:.0f} KiB of shared memory per block at B={B}, "
                f"more than the {have / 1024:.0f} KiB the GPU has")
    return None


def kernel(be, cell, loop, B: int, dtype):
    """The generated kernel for this GPU: the first of phases.block_counts (per head first, where the GEMMs
    are head-wise) whose shared memory fits, else the last of them."""
    facts = device(be.xp.cuda.Device().id)
    made = [_made(cell, loop, CTYPES[str(dtype)], B, G) for G in block_counts(cell, loop, facts["MultiProcessorCount"])]
    return next((k for k in made if k.smem <= facts["MaxSharedMemoryPerBlockOptin"]), made[-1])


def _made(cell, loop, ctype: str, B: int, G: int):
    key = (id(cell), loop, ctype, B, G)
    if key not in _KERNELS:
        _KERNELS[key] = (cell, persistent_kernel(cell, loop, ctype, B, G))
    return _KERNELS[key][1]


@functools.lru_cache(maxsize=None)
def device(index: int) -> dict:
    """The attributes of GPU `index` (SMs, shared memory, cooperative launch), read once."""
    import cupy
    return cupy.cuda.Device(index).attributes


def refused(why: str) -> str:
    """A persistent kernel the GPU refuses: said once per process in a warning, and returned."""
    if why not in _REFUSED:
        _REFUSED.add(why)
        warnings.warn(f"loop strategy 'persistent' runs frame by frame: {why}", RnnGraphWarning, stacklevel=4)
    return why
