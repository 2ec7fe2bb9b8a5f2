"""Which gradients a backward never needs zeroed, by the kernel that runs each fused group: the analysis every
backend shares (ArrayBackend.untouched_grads) over the GPU's specs (CupyBackend.backward_spec), without a GPU.
tests/test_gpu_untouched.py proves on the GPU that NaN left in them changes nothing."""
from dataclasses import replace

import pytest

from rnngraph.ir.loading import load_cell
from rnngraph.plan.items import FusedGrad, GemmGrad
from rnngraph.plan.schedule import build_schedule
from rnngraph.run.backends.base import ArrayBackend
from rnngraph.run.backends.cuda.backend import CupyBackend
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
