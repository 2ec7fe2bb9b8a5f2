"""Loop strategy 'persistent' on the cupy backend: whether this GPU runs a loop's persistent kernel
(kernels.py; cooperative, or per head an ordinary launch) at this B and dtype, else why not, and the
launches that run it."""
from __future__ import annotations

import functools
import os
import warnings

from .....arrays import float_dtype
from .....errors import RnnGraphWarning
from ..source import CTYPES
from .heads import one_head
from .kernels import ZERO_SOURCE, persistent_kernel
from .mma import MMA_ROWS
from .phases import MAX_ROWS, block_counts, loop_heads, phases, problem

_KERNELS: dict = {}      # (id(cell), loop, ctype, B, blocks) -> (cell, persistent_kernels.Persistent)
_REFUSED: set = set()
# Measured on an H200 (bfloat16 LSTM, H = 512, T = 100, training step; docs/performance.md): 64 blocks ran the
# tensor-core kernel fastest of 16, 32, 64 and 132 at B = 16 to 256 (B = 64: 3.7 ms, against 4.1 on 132 blocks);
# 'auto' runs it up to B = 16 (1.51-1.57 ms, 'stages' 1.76) and 'stages' beyond (B = 64: 2.6 against 3.7 ms).
TENSOR_CORE_BLOCKS = 64
AUTO_TENSOR_CORE_ROWS = 16


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
    facts = device(be.xp.cuda.Device().id)
    why = fit(cell, loop, B, dtype, facts["MultiProcessorCount"], facts["MaxSharedMemoryPerBlockOptin"])
    if why is None and kernel(be, cell, loop, B, dtype).cooperative and not facts.get("CooperativeLaunch", 0):
        return refused("this GPU cannot launch cooperative kernels")
    return why


def fit(cell, loop, B: int, dtype, sms: int, smem: int) -> str | None:
    """Why a GPU of `sms` SMs and `smem` bytes of shared memory per block runs `loop` frame by frame at B rows
    of dtype, or None: what no persistent kernel runs, B, or the weights and rows exceeding shared memory."""
    why, rows = problem(cell, loop), max_rows(cell, loop, dtype)
    if why or B > rows:
        return why or f"B={B} rows: a persistent kernel takes at most {rows} in {float_dtype(dtype, half=True).name}"
    groups = phases(cell, loop)
    heads = sorted({p.heads for g in groups for p in g if p.heads > 1})
    if B > MAX_ROWS and heads and not one_head(groups, block_counts(cell, loop, sms)[0]):
        return (f"B={B} rows: on tensor cores a block runs one head of every head-wise GEMM, and "
                + (f"this loop's GEMMs have {' and '.join(map(str, heads))} heads" if len(heads) > 1 else
                   f"this GPU's {sms} SMs are fewer than the loop's {heads[0]} heads"))
    need = chosen(cell, loop, B, dtype, sms, smem).smem
    if need > smem:
        return (f"its weights and rows need {need / 1024:.0f} KiB of shared memory per block at B={B}, "
                f"more than the {smem / 1024:.0f} KiB the GPU has")
    return None


def gpu_loop(cell, loop, B: int, dtype, sms: int, smem: int, auto: bool = True) -> str:
    """What runs `loop` (a PersistentLoop) at B rows of dtype on such a GPU, for loop='auto' or (auto False)
    loop='persistent', in words: 'persistent (tensor cores)', 'persistent (CUDA cores)' or 'stages: <why>'."""
    why = fit(cell, loop, B, dtype, sms, smem) or (auto and _slower(B))
    if why:
        return f"stages: {why}"
    return "persistent (tensor cores)" if B > MAX_ROWS else "persistent (CUDA cores)"


def _slower(B: int) -> str | None:
    if B > max(MAX_ROWS, AUTO_TENSOR_CORE_ROWS):
        return (f"at B={B} > {AUTO_TENSOR_CORE_ROWS} rows the tensor-core persistent kernel measured slower than "
                "stages (loop='persistent' runs it)")
    return None


def max_rows(cell, loop, dtype) -> int:
    """The batch rows a persistent kernel takes: on tensor cores for half storage (full matrices, or head-wise
    ones a head a block), else (float32, float64) on CUDA cores."""
    return MMA_ROWS if float_dtype(dtype, half=True).itemsize == 2 else MAX_ROWS


def kernel(be, cell, loop, B: int, dtype):
    """The generated kernel for this GPU."""
    facts = device(be.xp.cuda.Device().id)
    return chosen(cell, loop, B, dtype, facts["MultiProcessorCount"], facts["MaxSharedMemoryPerBlockOptin"])


def chosen(cell, loop, B: int, dtype, sms: int, smem: int):
    """The kernel for a GPU of `sms` SMs and `smem` bytes of shared memory a block: the first of
    phases.block_counts (per head first, where the GEMMs are head-wise; on tensor cores fewer blocks first,
    tensor_core_blocks) whose shared memory fits, else the last."""
    ctype = CTYPES[float_dtype(dtype, half=True).name]
    counts = block_counts(cell, loop, sms)
    if B > MAX_ROWS and loop_heads(phases(cell, loop)) > 1:
        counts = counts[:1]             # one head a block (fit says where that is not the first)
    elif B > MAX_ROWS:
        counts = [G for G in dict.fromkeys(tensor_core_blocks(B, sms) + counts) if G <= counts[-1]]
    made = [_made(cell, loop, ctype, B, G) for G in counts]
    return next((k for k in made if k.smem <= smem), made[-1])


def tensor_core_blocks(B: int, sms: int) -> list:
    """Block counts for a tensor-core kernel, best first: TENSOR_CORE_BLOCKS (measured), then more where their
    weights do not fit. RNNGRAPH_PERSISTENT_BLOCKS, where set, is tried first (for measuring)."""
    given = os.environ.get("RNNGRAPH_PERSISTENT_BLOCKS")
    return ([int(given)] if given else []) + [G for G in (TENSOR_CORE_BLOCKS, 2 * TENSOR_CORE_BLOCKS) if G <= sms]


def auto_problem(be, cell, loop, B: int, dtype) -> str | None:
    """Why 'auto' runs this loop frame by frame although the persistent kernel would run: beyond
    AUTO_TENSOR_CORE_ROWS rows the tensor-core kernel measured slower than 'stages'; None where it runs."""
    return _slower(B) if why_not(be, cell, loop, B, dtype) is None else None


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
