"""Which gradients a backward never needs zeroed, by the kernel that runs each fused group: the analysis every
backend shares (ArrayBackend.untouched_grads) over the GPU's specs (CupyBackend.backward_spec), without a GPU; and
the GPU's kernel that zeroes the runs between them. tests/test_gpu_untouched.py proves on the GPU that NaN left in
them changes nothing."""
from dataclasses import replace

import numpy as np
import pytest

from cuda_on_cpu import Emulated, needs_cxx
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
@pytest.mark.parametrize("k", [0, 3])
def test_the_zero_runs_kernel_zeroes_its_byte_runs_and_nothing_else(k):
    """Runs of an arena at any alignment (a 2-byte gradient's), shorter than 16 bytes, within one 16-byte word
    and long, run by the kernel compiled for the CPU (gather.ZERO_RUNS), with a table as zero_plan makes it; runs
    of rows zeroed from row k on (all of them at k = 0, none where k rows are the whole run), as the reference
    (ArrayBackend.zero_runs) does."""
    from test_chunk_kernels import _Kernel, _library
    rng = np.random.default_rng(0)
    a = rng.integers(1, 60000, 5000).astype(np.uint16)
    runs = [(0, 3, 0), (5, 6, 0), (9, 17, 0), (20, 1500, 0), (1501, 1502, 0), (1600, 4000, 240), (4001, 4007, 3),
            (4100, 4999, 0)]
    table, longest = zero_runs_table(np, a, runs)
    assert longest == 2 * 2400 and table.tolist()[1] == [10, 12, 0] and table.tolist()[5] == [3200, 8000, 480]
    want = a.copy()
    ArrayBackend().zero_runs(want, runs, k)
    assert (want[1600 + 240 * k:4000] == 0).all() and (want[1600:1600 + 240 * k] == a[1600:1600 + 240 * k]).all()
    assert (want[4001:4007] == (a[4001:4007] if k >= 2 else 0)).all()
    _Kernel(_library(ZERO_RUNS).rg_zero_runs)(None, None, (a, table, np.int64(len(table)), np.int64(k)))
    np.testing.assert_array_equal(a, want)
    nvrtc_compile(ZERO_RUNS, "zero_runs")


class Unzeroing(Emulated):
    """The emulator (persistent kernels run on the CPU) leaving unzeroed what the GPU's kernels leave so
    (CupyBackend.backward_spec)."""
    backward_spec = CupyBackend.backward_spec


@needs_cxx
@pytest.mark.parametrize("cell, B, dtype, tc, rows, heads", [
    ("lstm", 3, "float64", None, None, 0), ("lstm", 16, "bfloat16", None, None, 0),
    ("gru", 20, "float16", None, None, 0), ("mgu", 4, "float32", None, 2, 0),
    ("peephole_lstm", 5, "float64", None, None, 0), ("lstm", 24, "bfloat16", True, 8, 0),
    ("slstm", 2, "float32", None, None, 4), ("mh_lstm", 3, "bfloat16", None, None, 4)])
def test_the_persistent_kernels_write_every_gradient_left_unzeroed(cell, B, dtype, tc, rows, heads):
    """NaN in every span of the gradient arena the GPU's backward leaves unzeroed, after the first call, changes
    nothing in the next (ragged lengths): the kernels store each such gradient whole; and the spans hold every merged
    GEMM's output gradient (an LSTM's x- and h-products', written by the loop's group alone)."""
    pytest.importorskip("ml_dtypes")
    from rnngraph.run.executor import Executor
    from rnngraph.run.workspace import UNTOUCHED
    from test_loops import run_executor
    from test_persistent_heads import problem_arrays
    c = load_cell(cell, 8, 16, **({"heads": heads} if heads else {}))
    ex = Executor(c, Unzeroing(4, "groups" if rows else False, rows, tensor_cores=tc), loop="persistent")
    args, lengths = problem_arrays(c, 7, B, dtype), np.arange(B) % 8
    first = run_executor(ex, *args, lengths)
    spans = ex.ws.memo[UNTOUCHED]
    for a, b in spans:
        ex.ws.grad_arena[a:b] = np.nan
    second = run_executor(ex, *args, lengths)
    for k, (u, v) in enumerate(zip(first, second, strict=True)):
        assert np.array_equal(u, v), f"array {k}"
    cats = {(a, b) for it, (_, g) in ex.ws.cat.items() for a, b in spans if a == _offset(ex.ws, g)}
    assert heads or len(cats) == len(ex.ws.cat), "a merged GEMM's output gradient stays zeroed"


@needs_cxx
@pytest.mark.parametrize("name", ["lstm", "delays"])
def test_a_padded_chunk_zeroes_what_its_walking_loop_stores(name):
    """In chunks whose loop walks only the running chunk's n frames, a chunk of 5 frames in a workspace of 8 zeroes
    the rows from 5 on of what the loop's kernel stores (an LSTM's merged GEMMs' output gradients), so that frames
    5..7 read zeros, not the chunk after's (the backward runs last chunk first), and leaves the rows before unzeroed:
    the kernel stores them whole; a full chunk leaves all of them unzeroed as a whole call does, and what no kernel
    touches (an LSTM's gates) goes unzeroed in both. NaN in every span left unzeroed by a full chunk after a call of
    13 frames (chunks walking 5, then 8) changes nothing in the next, against whole calls; nor does it in the
    spans a padded chunk leaves, where it reaches no more than the rows before 5 (of P + 8 rows: the P history rows
    and frames 0 .. 4 - P; frames 5 - P .. 4, which the loop walks, are zeroed too, a margin as wide as the longest
    delay: 1 for the LSTM, 2 for a cell reading h two frames back): starting its zeroing P + 1 rows later leaves
    frame 5 as the full chunk's backward, run first, left it, which the loop never walks and the parameters' sums
    read."""
    from rnngraph.run.executor import Executor
    from rnngraph.run.workspace import PADDED, UNTOUCHED
    from test_persistent_heads import delay_cell, problem_arrays
    cell = load_cell("lstm", 3, 4) if name == "lstm" else delay_cell()
    be = Unzeroing(None, False)         # blocks at once: the kernel has grid barriers
    chunked, whole = Executor(cell, be, loop="persistent", chunk=8), Executor(cell, Unzeroing(), loop="persistent")
    params, x, init, gy, gf = problem_arrays(cell, 13, 3, "float64")
    lengths = np.array([13, 6, 1])
    inside = (np.arange(13)[:, None] < lengths[None, :])[..., None]        # [T, B, 1]: outputs past a length differ
    args = params, x, init, gy * inside, gf
    want = _run(whole, args, lengths)
    first = _run(chunked, args, lengths)
    ws = chunked.ws
    assert chunked.chunks.last is None and be.walked == [5, 8, 8, 5] and ws.T == 8 and ws.running is not None

    def nodes(w, key) -> set:       # the gradients whose spans memo[key] holds
        at = {_offset(w, g): n for n, g in w.grads.items() if g.ndim == 3} | \
             {_offset(w, g): f"{it.operand} products" for it, (_, g) in w.cat.items()}
        return {at[a] for a, *_ in w.memo[key]}
    products, gates = {"x products", "h products"}, {"i", "f", "g", "o"}
    assert nodes(ws, UNTOUCHED) == nodes(whole.ws, UNTOUCHED) and ws.memo[PADDED]
    if name == "lstm":
        assert nodes(ws, UNTOUCHED) >= products | gates
        assert nodes(ws, PADDED) >= products and not gates & nodes(ws, PADDED)
    P = ws.P
    assert P == (1 if name == "lstm" else 2) and all(row == (b - a) // (P + 8) for a, b, row in ws.memo[PADDED])
    for a, b in ws.memo[UNTOUCHED]:
        ws.grad_arena[a:b] = np.nan
    second = _run(chunked, args, lengths)
    for k, (u, v, w) in enumerate(zip(first, second, want, strict=True)):
        assert np.array_equal(u, v), f"array {k}"
        np.testing.assert_allclose(u * inside if k == 0 else u, w * inside if k == 0 else w, rtol=1e-10,
                                   atol=1e-12, err_msg=f"array {k}")
    for a, b, row in ws.memo[PADDED]:       # only what a padded chunk leaves: the rows before 5
        ws.grad_arena[a:b] = 0
        ws.grad_arena[a:a + 5 * row] = np.nan
    assert np.array_equal(np.concatenate([a.ravel() for a in _run(chunked, args, lengths)]),
                          np.concatenate([a.ravel() for a in second]))
    late = [(a, b, row) for a, b, row in ws.memo[PADDED]]
    ws.memo[PADDED][:] = [(a + (P + 1) * row, b, row) for a, b, row in late]    # from row P + 6: frame 5 as it was
    ws.memo.pop(("zero", "gradients"))
    assert not np.array_equal(np.concatenate([a.ravel() for a in _run(chunked, args, lengths)]),
                              np.concatenate([a.ravel() for a in second]))


def _offset(ws, g) -> int:
    """Where gradient buffer g starts in ws's gradient arena, in elements."""
    return (g.__array_interface__["data"][0] - ws.grad_arena.__array_interface__["data"][0]) // g.itemsize


def _run(ex, args, lengths) -> list:
    """Every array of a forward and backward of ex, in the ladder's chunks where it runs chunks."""
    params, x, init, gy, gf = args
    outs, fins = ex.forward(params, {"x": x}, init, lengths, ladder=True)
    got = [outs["h"].copy(), *(fins[s].copy() for s in sorted(fins))]
    gx, g0, gp = ex.backward({"h": gy}, gf)
    return got + [gx["x"].copy(), *(g0[s].copy() for s in sorted(g0)), *(gp[n].copy() for n in sorted(gp))]
