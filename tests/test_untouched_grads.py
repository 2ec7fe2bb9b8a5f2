"""Which gradients a backward never needs zeroed, by the kernel that runs each fused group: the analysis every
backend shares (ArrayBackend.untouched_grads) over the GPU's specs (CupyBackend.backward_spec), without a GPU; and
the GPU's kernel that zeroes the runs between them. tests/test_gpu_untouched.py proves on the GPU that NaN left in
them changes nothing."""
from dataclasses import replace

import numpy as np
import pytest

from cuda_on_cpu import needs_cxx
from nvrtc import nvrtc_compile
from rnngraph.ir.loading import load_cell
from rnngraph.plan.items import FusedGrad, GemmGrad
from rnngraph.plan.schedule import build_schedule
from rnngraph.run.backends.base import ArrayBackend
from rnngraph.run.backends.cuda.backend import CupyBackend
from rnngraph.run.backends.cuda.gather import ZERO_RUNS, zero_runs_table
from rnngraph.run.backends.cuda.rows import row_group


class Specs(ArrayBackend):
    """The shared analysis over the GPU's kernel specs (no cupy needed to ask them)."""
    backward_spec = CupyBackend.backward_spec


def steps(cell, loop: str, inside: bool) -> list:
    """(step, loop or None) of a schedule's backward: the loop's fused groups run in its kernel (inside) or
    each frame's own; hoisted ones alone."""
    out = []
    for it in (it for sec in build_schedule(cell, loop=loop).backward for it in sec.items):
        if hasattr(it, "stages"):
            out += [(s, it if inside else None) for st in it.stages for s in st.items
                    if isinstance(s, (FusedGrad, GemmGrad))]
        elif isinstance(it, (FusedGrad, GemmGrad)):
            out.append((it, None))
    return out


def test_an_lstms_persistent_kernel_leaves_its_gates_and_sums_unzeroed_but_not_its_states():
    cell = load_cell("lstm", 8, 16)
    free = Specs().untouched_grads(cell, steps(cell, "persistent", True))
    assert {"i", "f", "g", "o"} <= free
    assert not free & {"c", "h", "x"}     # c and h arrive from the next frame; x's gradient is the caller's
    assert free == Specs().untouched_grads(cell, steps(cell, "stages", False))   # frame by frame: the same kernels


@pytest.mark.parametrize("cell, loop", [("min_gru", "elementwise"), ("sru", "elementwise"), ("min_gru", "scan")])
def test_a_loop_kernel_that_reads_every_members_gradient_leaves_its_members_zeroed(cell, loop):
    """The elementwise loop's kernel loads each member's gradient and adds onto it; the scan's kernels keep no
    spec: their members stay zeroed, and only hoisted groups' (scan: minGRU's gates) go unzeroed."""
    c = load_cell(cell, 8, 16)
    members = {n for s, lp in steps(c, loop, True) if lp is not None and isinstance(s, FusedGrad) for n in s.item.nodes}
    free = Specs().untouched_grads(c, steps(c, loop, True))
    assert not free & members
    if loop == "scan":
        assert {"z"} <= free


def test_row_atomic_and_parameter_summing_kernels_keep_no_spec():
    cell = load_cell("layernorm_lstm", 8, 16)
    rows = [(s, lp) for s, lp in steps(cell, "stages", False) if isinstance(s, FusedGrad) and
            row_group(cell, s.item.nodes)]
    assert rows and all(Specs().backward_spec(cell, s, lp, None) is None for s, lp in rows)
    lstm = load_cell("lstm", 8, 16)
    s = next(s for s, _ in steps(lstm, "stages", False) if isinstance(s, FusedGrad))
    for flags in ({"atomic": True}, {"params": True}, {"one_kernel": False}):
        assert Specs().backward_spec(lstm, replace(s, **flags), None, None) is None
    assert Specs().backward_spec(lstm, s, None, None) is not None


@needs_cxx
def test_the_zero_runs_kernel_zeroes_its_byte_runs_and_nothing_else():
    """Runs of an arena at any alignment (a 2-byte gradient's), shorter than 16 bytes, within one 16-byte word
    and long, run by the kernel compiled for the CPU (gather.ZERO_RUNS), with a table as zero_plan makes it."""
    from test_chunk_kernels import _Kernel, _library
    rng = np.random.default_rng(0)
    a = rng.integers(1, 60000, 5000).astype(np.uint16)
    runs = [(0, 3), (5, 6), (9, 17), (20, 1500), (1501, 1502), (1600, 4999)]
    table, longest = zero_runs_table(np, a, runs)
    assert longest == 2 * 3399 and table.tolist()[1] == [10, 12]
    want = a.copy()
    for s, e in runs:
        want[s:e] = 0
    _Kernel(_library(ZERO_RUNS).rg_zero_runs)(None, None, (a, table, np.int64(len(table))))
    np.testing.assert_array_equal(a, want)
    nvrtc_compile(ZERO_RUNS, "zero_runs")
