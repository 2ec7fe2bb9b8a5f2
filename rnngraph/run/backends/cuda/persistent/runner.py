"""Loop strategy 'persistent' on the cupy backend: whether this GPU runs a loop's persistent kernel
(kernels.py; cooperative, or per head an ordinary launch) at this B and dtype, else why not, and the
launches that run it."""
from __future__ import annotations

import functools
import os
import warnings

from .....arrays import float_dtype
from .....errors import RnnGraphError, RnnGraphWarning
from ....settings import count
from ..source import CTYPES
from .heads import one_head
from .kernels import ZERO_SOURCE, persistent_kernel
from .mma import MMA_ROWS
from .phases import MAX_ROWS, block_counts, loop_heads, phases, problem
from .sums import sums_launch

_KERNELS: dict = {}      # (id(cell), loop, ctype, rows a block, blocks, groups, tensor cores, 3xTF32) -> (cell, kernel)
_REFUSED: set = set()
# Measured on an H200 (bfloat16 LSTM, H = 512, T = 100, training step; docs/performance.md): 64 blocks ran the
# one-group tensor-core kernel fastest of 16, 32, 64 and 132 at B = 16 to 256 (B = 64: 3.7 ms, against 4.1 on 132).
TENSOR_CORE_BLOCKS = 64
# Beyond 16 rows full matrices split the batch into row groups (full_groups): of at most GROUP_ROWS rows, at least
# GROUPS groups where B allows. Measured first (same LSTM, training ms, rows a group 8 / 16 / 32; 'stages', cuDNN
# float16): B = 32 1.65 / 1.81 / 2.19 (2.12, 1.32); B = 64 2.57 / 2.32 / 2.91 (2.66, 2.04); B = 128 3.70 / 3.66 / 3.86
# (3.57, 3.23). With the weights in registers and tagged words, groups of 8 rows measured faster where they run
# (bfloat16, H = 512, T = 100, training ms, groups of at most 16 rows / of 8, alternating in one process:
# experiments/persistent_rows.py, `experiments/gpu_checks.sh bench rows`): GRU B = 48 0.872 / 0.792, B = 64 0.972 /
# 0.848, B = 96 1.212 / 1.085; MGU B = 48 1.209 / 1.090, B = 64 1.429 / 1.140, B = 96 1.571 / 1.407; LSTM B = 96 1.567
# / 1.451; H = 768 (loop 'persistent') MGU B = 48 1.645 / 1.506, B = 64 1.766 / 1.560. Everywhere else the same kernel
# ran (the LSTM's weights in registers at 16 rows a group, RESIDENT_ROWS, come first). At H = 256 (groups of 16 / of
# 8): bfloat16 LSTM B = 64 0.742 / 0.663, B = 96 0.804 / 0.769, B = 128 0.854 / 0.812; GRU 0.686 / 0.620, 0.758 /
# 0.703, 0.795 / 0.742; MGU 1.042 / 0.954, 1.154 / 1.036, 1.179 / 1.062; float32 B = 64 in 3xTF32 LSTM 1.432 / 1.261,
# GRU 1.363 / 1.232, MGU 1.830 / 1.503, in TF32 0.982-1.125 / 0.891-1.022 (all three 13-15% faster).
GROUP_ROWS, GROUPS = 8, 4
# Beyond ONE_TILE rows (one MMA tile), a B that splits into no row groups (B = 17, 31, any prime) runs one group of
# B rows: the batch on one group's blocks. Such a call runs padded to the next multiple of GROUP_ROWS (batch_rows),
# its added sequences of length 0. Measured on an H200 (float32 LSTM in 3xTF32, H = 256, T = 1000, training ms, one
# group / the padded B exact): B = 17 12.0 / 8.44 (24), B = 31 17.1 / 8.85 (32); padded, B = 17 and 31 take 0.96x
# and 1.03x of B = 32 (an H100, experiments/results/bench/batch_curve.json).
ONE_TILE = 16
# Down to groups of GROUP_FEWEST rows: at B = 8 and 16 groups put the batch on more SMs (each group its own blocks).
# Measured (bfloat16 LSTM, T = 100, training ms, one group / groups of 8 rows / of 4): H = 512 B = 8 0.886 / - / 0.893,
# B = 16 1.057 / 0.991 / 0.913; H = 768 B = 8 1.019 / - / 0.954, B = 16 1.285 / 1.061 / - (groups of 4 hold their
# weights in shared memory; the resident groups of 8 run); at T = 1024 (FlashRNN's shape) B = 16 H = 768 10.36 / 8.31.
# Later, there, 2 groups of 8 rows (weights in registers, 48 blocks each) against 4 of 4 (shared memory): LSTM 7.07 /
# 10.96, GRU 6.74 / 9.38; H = 1024 B = 16 (T = 100) one group in registers 1.515 against 2 of 8 in shared 1.476.
GROUP_FEWEST = 4
# A group's weights in registers on fewer blocks (_held): down to 3/4 of the blocks full_groups gives, where they still
# fit there. Fewer blocks stage each frame's operand fewer times from L2 and meet at a cheaper barrier. Measured
# (bfloat16 LSTM, H = 768, B = 16, 2 groups of 8 rows, 64 blocks a group / 48): µs a frame forward 2.34 / 2.36,
# backward 5.45 / 4.94 (slope T = 100 -> 1000); training ms at T = 1024 8.27 / 7.72 (a second run 8.22 / 7.79), T = 100
# B = 8 0.90 / 0.90, B = 16 1.14 / 1.05, B = 32 1.50 / 1.47, GRU B = 16 0.95 / 0.98 (each the mean of two runs).
FEWER_BLOCKS = (3, 4)
# Where a later choice of rows and blocks holds every GEMM's weights in registers (resident.py) and the first does not,
# the later one runs, if its groups have at most RESIDENT_ROWS rows. Measured on an H200 (bfloat16 LSTM, T = 100,
# training ms, the first choice / the resident one): H = 768 B = 32 1.70 (4 groups of 8 rows on 32 blocks) / 1.59 (2
# groups of 16 on 64); H = 1024 B = 16 2.09 (64 blocks) / 1.86 (128). Larger groups in registers measured slower:
# H = 768 B = 64 2.24 (4 of 16) / 2.70 (2 of 32, resident), H = 512 B = 128 2.02 (8 of 16) / 1.98 (4 of 32) / 3.37 (2
# of 64).
RESIDENT_ROWS = 16
# 'auto' runs the tensor-core kernel of full matrices up to B rows by the width of the cell (its largest phase's
# units: H for an LSTM), 'stages' beyond. Measured on an H200 (bfloat16 LSTM, T = 100, training ms, persistent /
# stages; experiments/gpu_checks.sh bench tensor_cores wide): H = 512 B = 128 2.45 / 2.55, B = 256 4.47 / 3.40;
# H = 768 B = 32 2.03 / 2.08 (a second run 2.23 / 2.17); H = 1024 B = 32 2.61 / 2.53, B = 64 4.16 / 3.12 (B = 16 not
# measured). With the weights' fewer blocks and bulk staging (cuDNN float16 beside them): H = 768 B = 48 2.01 / 2.25 /
# 1.92, B = 64 2.14 / 2.40 / 2.25, B = 96 3.24 / 2.83 / 3.32, B = 128 3.69 / 2.99 / 4.13; H = 1024 B = 64 3.26 / 2.75 /
# 2.52. With stages' d-operand products in parts (split.py; persistent / stages): H = 512 B = 48 1.03 / 1.42, B = 64
# 1.17 / 1.53, B = 96 1.64 / 1.66, B = 128 1.80 / 1.87; H = 768 B = 32 1.41 / 1.59, B = 48 1.79 / 1.76, B = 64 2.05 /
# 1.78, B = 96 2.93 / 2.12, B = 128 3.57 / 2.39. Wider cells follow the last row.
AUTO_TENSOR_CORE_ROWS = ((512, 128), (768, 32), (1024, 16))     # (units up to, B up to)
# On CUDA cores (float32) groups of at most MAX_ROWS rows, measured (LSTM, H = 512, training ms, persistent /
# stages / cuDNN float32): B = 16 2.31 / 3.37 / 4.97, B = 32 3.40 / 4.04 / 5.88; 'auto' runs them up to
# AUTO_CUDA_CORE_ROWS (B = 64 at H = 512 needs 280 KiB of shared memory a block).
AUTO_CUDA_CORE_ROWS = 32
# Full matrices in half storage on tensor cores from 4 rows (a 16-row tile, the rows past B masked), measured on an
# H200 (bfloat16 LSTM, H = 512, T = 100, training step, CUDA cores against tensor cores): B = 1 0.985 / 1.007 ms,
# B = 4 1.385 / 1.005, B = 8 1.832 / 1.173.
TENSOR_CORES_FROM = 4
# float32 where TF32 is not allowed: on tensor cores in 3xTF32 (three TF32 MMAs a product, mma.SPLIT) from SPLIT_FROM
# rows by the cell's width, CUDA cores below; 'auto' runs it up to AUTO_SPLIT_ROWS rows, 'stages' beyond. Measured on an
# H200 (float32 LSTM, T = 100, training ms, CUDA cores / 3xTF32 / stages / cuDNN float32): H = 512 B = 4 1.39 / 1.63 /
# 2.18 / -, B = 8 1.85 / 1.92 / 2.46 / 4.53, B = 16 2.25 / 2.39 / 3.10 / 4.71, B = 32 3.20 / 3.01 / 3.80 / 5.87, B = 64
# - / 4.17 / 4.79 / 5.90, B = 128 - / 7.19 / 6.73 / 7.21; H = 768 B = 16 3.98 / 3.65 / 4.57, B = 32 - / 5.99 / 5.43;
# H = 1024 B = 16 - / 4.85 / 5.71, B = 32 - / 8.53 / 7.25; H = 256 B = 64 (T = 1000) 17.7 / 16.7 / 26.0. Later, at
# H = 256 (T = 1000, CUDA cores / 3xTF32): B = 2 5.96 / 6.97, B = 4 7.92 / 7.48, B = 8 9.96 / 7.66, B = 16 10.07 / 8.03,
# B = 24 11.89 / 8.62, B = 32 12.50 / 9.37, B = 48 16.39 / 11.89, B = 64 17.40 / 13.09.
SPLIT_FROM = ((256, 4), (512, 32), (1024, 16))     # (units up to, from B rows)
AUTO_SPLIT_ROWS = ((512, 64), (1024, 16))       # (units up to, B up to)
MMA_CAPABILITY = 80     # the tensor-core kernels' mma.sync m16n8k16 in half and cp.async need compute capability 8.0
# Per head (a block owns whole heads, so rows split over blocks too), measured on an H200 (sLSTM 12 heads of 64,
# T = 1024, training step, docs/performance.md): bfloat16 B = 16 on CUDA cores at 1, 2, 4, 8 rows a block 12.1
# (192 blocks: two waves), 8.9 (96 blocks), 17.8, 47.1 ms, on tensor cores in one block 17.0; B = 64 at 8 rows
# 62.7, on tensor cores 16 rows a block 35.6 ('stages' 38.4); float32 B = 16 at 2 rows 17.0 ('stages' 54.3). Later, at
# 2 rows a block (96 blocks) B = 16 trained in 4.23 ms on CUDA cores against 7.47 on tensor cores (the 16-row tile
# padded; RNNGRAPH_PERSISTENT_TENSOR_CORES=1), the multi-head LSTM in 3.97 against 7.61.
HEAD_TENSOR_CORE_ROWS = 16
HEAD_TENSOR_CORES_FROM = 32     # B = 16 in bfloat16: CUDA cores (2 rows a block) trained faster than tensor cores
AUTO_HEAD_ROWS = 64             # 'auto' runs a per-head kernel up to this B (measured there), 'stages' beyond


def compile(be, cell, loop, views):
    """The launches running `loop` on the executor's views: zeroing the barrier counter (and numbering the
    launch), then the cooperative kernel (per head the kernel alone), then the sums of the parameters' gradients it
    takes (sums.py); None where why_not() says why not."""
    vals, grads, cat, wcat, P, T, B, running, _ = views
    dtype = next(iter(cat.values()))[0].dtype
    if why_not(be, cell, loop, B, dtype):
        return None
    cp, k = be.xp, kernel(be, cell, loop, B, dtype)
    part = cp.empty((B, k.sum_columns), cp.float64 if dtype == cp.float64 else cp.float32)    # each row's sums
    pick = {"val": vals.__getitem__, "grad": grads.__getitem__, "cat": lambda it: cat[it][0],
            "dcat": lambda it: cat[it][1], "w": lambda it: wcat[it][0],
            "xb": lambda n: cp.zeros((2, B, cell.op(n).size), cp.uint64),     # tagged words, two frames
            "xh": lambda n: cp.zeros((2, B, cell.op(n).size), cp.uint32),     # ... tagged half words
            "sums": lambda _: part}
    args = []
    for kind, key in k.args:
        a = pick[kind](key)
        args += [a] if kind in ("w", "xb", "xh", "sums") else be.frame_args([a], B)
    bar = cp.zeros(1 + k.row_groups, cp.uint32)     # launch number, each row group's barrier count; kept with the launch
    raw = be.raw(k.name, k.source, cooperative=k.cooperative)
    raw.max_dynamic_shared_size_bytes = k.smem
    tail = (*be.running_args(running), cp.int32(T), cp.int32(P))
    run = (functools.partial(raw, shared_mem=k.smem), (k.blocks,), (k.threads,), (bar, *args, *tail))
    zero = (be.raw("rg_persist_zero", ZERO_SOURCE), (1,), (1,), (bar, cp.int32(k.row_groups)))
    added = (sums_launch(be, part, [(grads[u], c) for (_, u), c in k.sums]),) if k.sums else ()
    return ((zero, run) if k.cooperative else (run,)) + added


def loop_sums(be, cell, loop, B: int, dtype) -> frozenset:
    """The (fused group, parameter) pairs whose gradient sums the kernel running `loop` at B rows of dtype takes
    itself (sums.py), where it runs: their ParamSums are not run (Executor._loop)."""
    return frozenset() if why_not(be, cell, loop, B, dtype) else \
        frozenset(key for key, _ in kernel(be, cell, loop, B, dtype).sums)


def why_not(be, cell, loop, B: int, dtype) -> str | None:
    """Why this GPU runs `loop` frame by frame at B rows of dtype, or None: what no persistent kernel runs,
    B, no cooperative launch (said once in a warning), or shared memory too small for the weights in dtype."""
    facts = gpu_of(be)
    why = fit(cell, loop, B, dtype, *gpu_facts(facts), tf32=allows_tf32(be))
    if why is None and kernel(be, cell, loop, B, dtype).cooperative and not facts.get("CooperativeLaunch", 0):
        return refused("this GPU cannot launch cooperative kernels")
    return why


def fit(cell, loop, B: int, dtype, sms: int, smem: int, mma: bool = True, tf32: bool = False) -> str | None:
    """Why a GPU of `sms` SMs and `smem` bytes of shared memory per block (`mma`: whether it runs the tensor-core
    kernels; `tf32`: float32 may run on them in TF32) runs `loop` frame by frame at B rows of dtype, or None: what
    no persistent kernel runs, B, or the weights and rows exceeding shared memory."""
    why = problem(cell, loop)
    if why or B > MMA_ROWS:
        return why or f"B={B} rows: a persistent kernel takes at most {MMA_ROWS}"
    short = "" if mma or float_dtype(dtype, half=True).itemsize != 2 else \
        f" on this GPU (tensor cores need compute capability {MMA_CAPABILITY // 10}.{MMA_CAPABILITY % 10})"
    k = chosen(cell, loop, B, dtype, sms, smem, mma, tf32)
    if k is None:
        return (f"B={B} rows: on CUDA cores a persistent kernel's blocks take at most {MAX_ROWS} rows, and B splits "
                f"into no such row groups on {sms} SMs{short}")
    if k.shared > smem:
        return (f"its weights and rows need {k.shared / 1024:.0f} KiB of shared memory per block at B={B}, "
                f"more than the {smem / 1024:.0f} KiB the GPU has{short}")
    return None


def gpu_loop(cell, loop, B: int, dtype, sms: int, smem: int, mma: bool = True, auto: bool = True,
             tf32: bool = False) -> str:
    """What runs `loop` (a PersistentLoop) at B rows of dtype on such a GPU, for loop='auto' or (auto False)
    loop='persistent', float32 in TF32 where `tf32` allows, in words: 'persistent (tensor cores)', 'persistent
    (tensor cores in TF32)', 'persistent (CUDA cores)' (with ', weights in registers' where every GEMM's weights sit
    there, resident.py, ', R groups of r rows' where full matrices split the batch, full_groups, and ', B padded
    to Bp rows' where the call runs more rows, padded_rows) or 'stages: <why>'."""
    why = fit(cell, loop, B, dtype, sms, smem, mma, tf32)
    k = None if why else chosen(cell, loop, B, dtype, sms, smem, mma, tf32)
    why = why or auto and _slower(cell, loop, B, k)
    if why:
        return f"stages: {why}"
    Bp = padded_rows(cell, loop, B, dtype, sms, smem, mma, tf32)
    k = k if Bp == B else chosen(cell, loop, Bp, dtype, sms, smem, mma, tf32)
    groups = f", {k.row_groups} groups of {Bp // k.row_groups} rows" if k.row_groups > 1 and k.cooperative else ""
    groups += f", B padded to {Bp} rows" if Bp != B else ""
    how = " in 3xTF32" if k.split else " in TF32" if k.tensor_cores and float_dtype(dtype, half=True).itemsize == 4 \
        else ""
    held = ", weights in registers" if k.resident else ""
    return f"persistent ({'tensor' if k.tensor_cores else 'CUDA'} cores{how}{held}{groups})"


def gpu_facts(facts: dict) -> tuple:
    """(SMs, shared memory bytes a block, whether it runs the tensor-core kernels) of a GPU's attributes."""
    return facts["MultiProcessorCount"], facts["MaxSharedMemoryPerBlockOptin"], facts["ComputeCapability"] >= MMA_CAPABILITY


def _slower(cell, loop, B: int, k) -> str | None:
    """Why 'auto' runs stages where kernel k would run B rows, or None."""
    if loop_heads(phases(cell, loop)) > 1:
        return (f"at B={B} > {AUTO_HEAD_ROWS} rows the per-head persistent kernel is not measured against stages "
                "(loop='persistent' runs it)") if B > AUTO_HEAD_ROWS else None
    units = max(p.units for g in phases(cell, loop) for p in g)
    most = by_width(AUTO_SPLIT_ROWS if k.split else AUTO_TENSOR_CORE_ROWS, units)
    if k.tensor_cores and B > most:
        return (f"at B={B} > {most} rows the tensor-core persistent kernel{' in 3xTF32' if k.split else ''} of width "
                f"{units} measured no faster than stages (loop='persistent' runs it)")
    if not k.tensor_cores and B > AUTO_CUDA_CORE_ROWS:
        return (f"at B={B} > {AUTO_CUDA_CORE_ROWS} rows the persistent kernel on CUDA cores is not measured against "
                "stages (loop='persistent' runs it)")
    return None


def by_width(table: tuple, units: int) -> int:
    """A measured table's rows ((units up to, rows), ...) for a cell whose largest phase has `units` units: the
    first row whose units reach them, else the last (wider cells follow it)."""
    return next((rows for width, rows in table if units <= width), table[-1][1])


def head_rows(B: int, tensor_cores: bool, blocks: int, sms: int) -> int:
    """The rows a block of a per-head kernel (`blocks` blocks a row group) runs of B, the rest in more blocks: on
    tensor cores (possible: half storage, one head a block) from HEAD_TENSOR_CORES_FROM rows on, the fewest blocks
    of at most HEAD_TENSOR_CORE_ROWS rows that split B evenly, more than MAX_ROWS each; else, on CUDA cores, the
    fewest rows dividing B whose blocks all fit on the `sms` SMs at once (a block runs every frame: a second wave
    waits for the first), at most MAX_ROWS. RNNGRAPH_PERSISTENT_ROWS, where set, is the rows wanted (measuring)."""
    given = rows_setting()
    if tensor_cores and (given or HEAD_TENSOR_CORE_ROWS * (B >= HEAD_TENSOR_CORES_FROM)) > MAX_ROWS:
        want = given or HEAD_TENSOR_CORE_ROWS
        rows = [B // R for R in range(-(-B // want), B + 1) if B % R == 0 and B // R > MAX_ROWS]
        if rows:
            return rows[0]
    divisors = [d for d in range(1, min(B, MAX_ROWS) + 1) if B % d == 0]
    if given:
        return max(d for d in divisors if d <= given)
    return next((d for d in divisors if blocks * (B // d) <= sms), divisors[-1])


def kernel(be, cell, loop, B: int, dtype):
    """The generated kernel for this GPU."""
    return chosen(cell, loop, B, dtype, *gpu_facts(gpu_of(be)), allows_tf32(be))


def batch_rows(be, cell, loop, B: int, dtype) -> int:
    """The rows this GPU runs a call of B sequences as (padded_rows): B, or more."""
    return padded_rows(cell, loop, B, dtype, *gpu_facts(gpu_of(be)), allows_tf32(be))


def padded_rows(cell, loop, B: int, dtype, sms: int, smem: int, mma: bool = True, tf32: bool = False) -> int:
    """The rows to run B sequences as on a GPU of `sms` SMs and `smem` bytes of shared memory a block: the next
    multiple of GROUP_ROWS where the tensor-core kernel of full matrices would run B > ONE_TILE rows as one group
    and runs that multiple in row groups (measured beside ONE_TILE), else B."""
    Bp = -(-B // GROUP_ROWS) * GROUP_ROWS
    if B <= ONE_TILE or Bp == B or Bp > MMA_ROWS or fit(cell, loop, B, dtype, sms, smem, mma, tf32):
        return B
    k = chosen(cell, loop, B, dtype, sms, smem, mma, tf32)
    if not k.tensor_cores or k.row_groups > 1 or not k.cooperative or fit(cell, loop, Bp, dtype, sms, smem, mma, tf32):
        return B
    return Bp if chosen(cell, loop, Bp, dtype, sms, smem, mma, tf32).row_groups > 1 else B


def allows_tf32(be) -> bool:
    """Whether backend be lets float32 products round their inputs to TF32 (its cuBLAS handle's setting, which
    rnngraph.torch takes from torch's allow_tf32 and `rnngraph bench --tf32` sets)."""
    return bool(getattr(getattr(be, "blas", None), "tf32", False))


def chosen(cell, loop, B: int, dtype, sms: int, smem: int, mma: bool = True, tf32: bool = False):
    """The kernel for a GPU of `sms` SMs and `smem` bytes of shared memory a block (`mma`: tensor cores usable;
    `tf32`: float32 may run on them in TF32):
    the first of phases.block_counts whose shared memory fits, else the last (None: none runs B): per head first
    where the GEMMs are head-wise (its rows split over blocks, head_rows; beyond MAX_ROWS the only one); for full
    matrices row groups first where B splits into them (full_groups), then one group, on tensor cores fewer blocks
    first (tensor_core_blocks), on CUDA cores only up to MAX_ROWS rows; on tensor cores the first of those whose
    weights all sit in registers (Persistent.resident) at most RESIDENT_ROWS rows a group, where one does (measured
    beside RESIDENT_ROWS)."""
    ctype = CTYPES[float_dtype(dtype, half=True).name]
    counts, groups = block_counts(cell, loop, sms), phases(cell, loop)
    if loop_heads(groups) > 1:          # per head first: its rows split over blocks (head_rows)
        tc = mma and float_dtype(dtype, half=True).itemsize == 2 and one_head(groups, counts[0])
        rows = head_rows(B, tc, counts[0], sms)
        setting = tensor_core_setting()
        few = tc and rows <= MAX_ROWS and setting == "1"     # tensor cores at few rows a block
        cores = (not tc or setting == "0") and rows <= MAX_ROWS      # ... and none, not even in warp roles
        apart = _made(cell, loop, ctype, rows, counts[0], B // rows,
                      tensor_cores=True if few else False if cores else None)
        if apart.shared <= smem or B > MAX_ROWS or len(counts) == 1:
            return apart
        counts = counts[1:]             # heads too large for a block: split over more blocks, with barriers
    units = max(p.units for g in groups for p in g)
    tc = mma and loop_heads(groups) == 1 and full_tensor_cores(B, dtype, tf32, units)
    split = tc and ctype == "float" and not tf32        # float32 on tensor cores where TF32 is not allowed: 3xTF32
    made = [_held(cell, loop, ctype, rows, G, B // rows, split, units) if tc else
            _made(cell, loop, ctype, rows, G, B // rows, tc, split) for rows, G in full_groups(B, tc, sms, units)]
    if tc:
        counts = [G for G in dict.fromkeys(tensor_core_blocks(B, sms) + counts) if G <= counts[-1]]
    made += [_made(cell, loop, ctype, B, G, 1, tc, split) for G in counts] if tc or B <= MAX_ROWS else []
    fits = [k for k in made if k.shared <= smem]
    return next((k for k in fits if k.resident and B // k.row_groups <= RESIDENT_ROWS), fits[0] if fits else
                made[-1] if made else None)


def _held(cell, loop, ctype: str, rows: int, G: int, row_groups: int, split: bool, units: int):
    """The tensor-core kernel of `row_groups` groups of `rows` rows on G blocks each, or, where its weights all sit in
    registers and RNNGRAPH_PERSISTENT_BLOCKS is unset, on the fewest blocks down to FEWER_BLOCKS of G that divide the
    units and still hold them there."""
    k = _made(cell, loop, ctype, rows, G, row_groups, True, split)
    if not k.resident or blocks_setting():
        return k
    fewer = (_made(cell, loop, ctype, rows, g, row_groups, True, split)
             for g in range(-(-G * FEWER_BLOCKS[0] // FEWER_BLOCKS[1]), G) if units % g == 0)
    return next((f for f in fewer if f.resident), k)


def full_groups(B: int, tc: bool, sms: int, units: int) -> list:
    """(rows, blocks) of each row group to try, best first, for a kernel of full matrices at B rows whose largest
    phase has `units` units, where B splits into groups of GROUP_FEWEST rows or more on tensor cores (`tc`), or
    exceeds MAX_ROWS on CUDA cores (else []): groups of the most rows dividing B up to GROUP_ROWS on tensor cores (in
    at least GROUPS groups where B allows), MAX_ROWS on CUDA cores, then of more rows (fewer groups, more blocks
    each: the weights split finer), each group on its share of the SMs (on tensor cores at most TENSOR_CORE_BLOCKS),
    as many blocks as divide the units where that loses at most a quarter of them. RNNGRAPH_PERSISTENT_ROWS, where
    set, is the rows wanted, RNNGRAPH_PERSISTENT_BLOCKS the most blocks a group (for measuring)."""
    most, given, fewest = MMA_ROWS if tc else MAX_ROWS, rows_setting(), GROUP_FEWEST if tc else 1
    if B <= min(given or (fewest if tc else MAX_ROWS), most):
        return []
    cap = min(given or (min(GROUP_ROWS, max(B // GROUPS, fewest)) if tc else MAX_ROWS), most)
    rows = [d for d in range(1 if given else fewest, min(B - 1, most) + 1) if B % d == 0 and B // d <= sms]
    rows = [d for d in rows if d <= cap][-1:] + [d for d in rows if d > cap]
    out, blocks = [], blocks_setting()
    for r in rows:
        bound = min(units, sms // (B // r), blocks or (TENSOR_CORE_BLOCKS if tc else sms))
        out.append((r, next((g for g in range(bound, bound * 3 // 4 - 1, -1) if units % g == 0), bound)))
    return out


def rows_setting() -> int | None:
    """RNNGRAPH_PERSISTENT_ROWS, the rows a block (a row group) wanted, where set (for measuring)."""
    return count("RNNGRAPH_PERSISTENT_ROWS", "rows")


def blocks_setting() -> int | None:
    """RNNGRAPH_PERSISTENT_BLOCKS, the blocks wanted (a row group's most), where set (for measuring)."""
    return count("RNNGRAPH_PERSISTENT_BLOCKS", "blocks")


def full_tensor_cores(B: int, dtype, tf32: bool = False, units: int = 512) -> bool:
    """Whether a persistent kernel of full matrices runs its GEMMs on tensor cores at B rows of dtype: in half
    storage, and float32 in TF32 where `tf32` allows, from TENSOR_CORES_FROM rows (beyond MAX_ROWS always: CUDA
    cores take no more in groups of rows); float32 where TF32 is not allowed in 3xTF32 from SPLIT_FROM's rows for
    a cell whose largest phase has `units` units. Where set, RNNGRAPH_PERSISTENT_TENSOR_CORES (1 or 0) says so for
    B ≤ MAX_ROWS, and for float32 in 3xTF32 at any B (0: CUDA cores, in groups of rows beyond MAX_ROWS, each product
    rounded as float32 rounds it)."""
    size, given = float_dtype(dtype, half=True).itemsize, tensor_core_setting()
    if size == 4 and not tf32:
        return given == "1" if given is not None else B >= by_width(SPLIT_FROM, units)
    if size != 2 and size != 4:
        return False
    return B > MAX_ROWS or (given == "1" if given is not None else B >= TENSOR_CORES_FROM)


def tensor_core_setting() -> str | None:
    """RNNGRAPH_PERSISTENT_TENSOR_CORES (1 or 0), where set: whether kernels of full matrices at B ≤ MAX_ROWS rows
    run on tensor cores, and (1) per-head kernels at that many rows a block too (for measuring)."""
    given = os.environ.get("RNNGRAPH_PERSISTENT_TENSOR_CORES")
    if given is not None and given not in ("0", "1"):
        raise RnnGraphError(f"RNNGRAPH_PERSISTENT_TENSOR_CORES must be 1 or 0, got {given!r}")
    return given


def tensor_core_blocks(B: int, sms: int) -> list:
    """Block counts for a tensor-core kernel, best first: TENSOR_CORE_BLOCKS (measured), then more where their
    weights do not fit. RNNGRAPH_PERSISTENT_BLOCKS, where set, is tried first (for measuring)."""
    given = blocks_setting()
    return ([given] if given else []) + [G for G in (TENSOR_CORE_BLOCKS, 2 * TENSOR_CORE_BLOCKS) if G <= sms]


def auto_problem(be, cell, loop, B: int, dtype) -> str | None:
    """Why 'auto' runs this loop frame by frame although the persistent kernel would run: beyond
    AUTO_TENSOR_CORE_ROWS (AUTO_SPLIT_ROWS in 3xTF32) the tensor-core kernel of full matrices measured no faster than 'stages', beyond
    AUTO_CUDA_CORE_ROWS the CUDA-core one and beyond AUTO_HEAD_ROWS a per-head one are not measured; None where
    it runs."""
    return _slower(cell, loop, B, kernel(be, cell, loop, B, dtype)) if why_not(be, cell, loop, B, dtype) is None else None


def _made(cell, loop, ctype: str, B: int, G: int, row_groups: int = 1, tensor_cores: bool | None = None,
          split: bool = False):
    key = (id(cell), loop, ctype, B, G, row_groups, tensor_cores, split)
    if key not in _KERNELS:
        _KERNELS[key] = (cell, persistent_kernel(cell, loop, ctype, B, G, row_groups, tensor_cores, split))
    return _KERNELS[key][1]


def gpu_of(be) -> dict:
    """The attributes of the GPU backend be runs on (device)."""
    return device(be.xp.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def device(index: int) -> dict:
    """The attributes of GPU `index` (SMs, shared memory, cooperative launch) and its compute capability (90 for
    9.0, as ComputeCapability), read once."""
    import cupy
    gpu = cupy.cuda.Device(index)
    return {**gpu.attributes, "ComputeCapability": int(gpu.compute_capability)}


def refused(why: str) -> str:
    """A persistent kernel the GPU refuses: said once per process in a warning, and returned."""
    if why not in _REFUSED:
        _REFUSED.add(why)
        warnings.warn(f"loop strategy 'persistent' runs frame by frame: {why}", RnnGraphWarning, stacklevel=4)
    return why
