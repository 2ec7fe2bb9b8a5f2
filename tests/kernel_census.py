"""Every CUDA source the generators make for the built-in cells, by label: what tests/test_kernel_sources.py
holds against the digests stored in tests/kernel_sources.json, so moving or reshaping the generators
cannot change a byte of what the GPU compiles.

Run `python tests/kernel_census.py --write` (from the repository root) only where a change to a kernel is
meant; the diff of kernel_sources.json then lists every source that changed."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from rnngraph import CELLS, build_schedule, load_cell
from rnngraph.plan.items import Fused, FusedGrad, Pair, ParamSum
from rnngraph.plan.loops import ElementwiseLoop, PersistentLoop, ScanLoop
from rnngraph.run.backends.cuda.chunks import chunk_source
from rnngraph.run.backends.cuda.elementwise import elementwise_kernel, elementwise_nodes
from rnngraph.run.backends.cuda.matmul import matmul_source
from rnngraph.run.backends.cuda.pair import pair_kernel
from rnngraph.run.backends.cuda.param_grad import param_grad_kernel
from rnngraph.run.backends.cuda.persistent.kernels import ZERO_SOURCE, persistent_kernel
from rnngraph.run.backends.cuda.persistent.heads import one_head
from rnngraph.run.backends.cuda.persistent.phases import block_counts, loop_heads, phases, problem
from rnngraph.run.backends.cuda.rows import group_kernel, row_group
from rnngraph.run.backends.cuda.scan import scan_source
from rnngraph.run.backends.cuda.x3 import SPLIT
from rnngraph.run.backends.cuda.source import CTYPES

STORED = Path(__file__).with_name("kernel_sources.json")
SIZES = (8, 64)             # input size, hidden size of every cell in the census
ROWS = (1, 3, 8)            # B of the persistent kernels; half storage also on tensor cores:
MMA_ROWS = (64,)
HALF = {"rg_bf16": "bfloat16", "rg_f16": "float16"}
BLOCKS = 132                # SMs of the H200: the persistent kernels' block count at most


def _fused(cell, item, direction):
    return group_kernel(cell, item.nodes, direction)


def _items(sched):
    """Every plan item of a schedule, loops' stage items included, forward then backward."""
    for sec in (*sched.forward, *sched.backward):
        for it in sec.items:
            yield it
            for st in getattr(it, "stages", ()):
                yield from st.items


def _sources(name: str, cell, sched, ctype: str):
    """(label, source) of every kernel the cupy backend would build for this schedule in element type ctype."""
    for it in _items(sched):
        if isinstance(it, Fused):
            spec = _fused(cell, it, "fwd")
            if spec:
                yield f"fused fwd {it.nodes}", spec.source(ctype)[1]
        elif isinstance(it, FusedGrad):
            spec = _fused(cell, it.item, "bwd_atomic" if it.atomic else "bwd")
            if spec:
                yield f"fused bwd{' atomic' if it.atomic else ''} {it.item.nodes}", spec.source(ctype)[1]
        elif isinstance(it, Pair):
            spec = _fused(cell, it.fused, "fwd")
            if spec and not row_group(cell, it.fused.nodes):
                yield f"pair {it.gemm.nodes}", pair_kernel(spec, it.gemm, ctype)[1]
        elif isinstance(it, ParamSum):
            for n, slot in it.terms:
                yield f"param grad {n}.{slot}", param_grad_kernel(cell, n, slot, ctype)[1]
        elif isinstance(it, ElementwiseLoop):
            nodes = elementwise_nodes(it)
            made = nodes and elementwise_kernel(cell, nodes, "bwd" if it.reverse else "fwd", ctype)
            if made:
                yield f"elementwise {'bwd' if it.reverse else 'fwd'}", made[1]
        elif isinstance(it, PersistentLoop) and problem(cell, it) is None:
            tc = ctype in HALF          # tensor cores: half storage, full matrices or head-wise one head a block
            groups = phases(cell, it)
            for k, G in enumerate(block_counts(cell, it, BLOCKS)):     # per head first, where head-wise
                more = MMA_ROWS if tc and (loop_heads(groups) == 1 or one_head(groups, G)) else ()
                for B in ROWS + more:
                    yield (f"persistent {'bwd' if it.reverse else 'fwd'} B={B}{f' G={G}' if k else ''}",
                           persistent_kernel(cell, it, ctype, B, G).source)
                if k == 0:                  # rows split over blocks, 4 groups (per head, or full matrices)
                    for B in (2,) + more:
                        yield (f"persistent {'bwd' if it.reverse else 'fwd'} B={B}x4",
                               persistent_kernel(cell, it, ctype, B, G, 4).source)
        elif isinstance(it, ScanLoop):
            yield f"scan {'bwd' if it.reverse else 'fwd'}", scan_source("bwd" if it.reverse else "fwd", ctype)[0]


def census() -> dict:
    """label -> sha256 of the source, over every built-in cell, loop strategy it admits and element type."""
    out = {}
    for ctype in CTYPES.values():
        for kind in ("gemv", "gemm"):
            out[f"{ctype} matmul {kind}"] = matmul_source(kind, ctype)
        out[f"{ctype} chunk boundary"] = chunk_source(ctype)
        for name in sorted(CELLS):
            cell = load_cell(name, *SIZES)
            for loop in build_schedule(cell).loop_strategies:
                for label, src in _sources(name, cell, build_schedule(cell, loop=loop), ctype):
                    out[f"{ctype} {name} {loop}: {label}"] = src
    out["persistent zero"] = ZERO_SOURCE
    out["3xTF32 split"] = SPLIT
    return {k: hashlib.sha256(v.encode()).hexdigest() for k, v in sorted(out.items())}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/kernel_census.py --write   (rewrites tests/kernel_sources.json)")
    STORED.write_text(json.dumps(census(), indent=1) + "\n")
    print(f"wrote {STORED} ({len(census())} sources)")
