"""The persistent backward's parameter sums taken in its kernel (run/backends/cuda/persistent/sums.py), run on the
CPU (cuda_on_cpu.py) against numpy's loop: the kernel's rows of sums (filled with NaN before it runs, so an element
it did not store shows), then its sums launch, in place of the ParamSums it takes, which the executor skips."""
import numpy as np
import pytest

from cuda_on_cpu import Emulated, needs_cxx
from nvrtc import nvrtc_compile
from rnngraph import Cell, load_cell
from rnngraph.plan.items import ParamSum
from rnngraph.plan.schedule import build_schedule
from rnngraph.run import handlers
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cuda.persistent import sums
from rnngraph.run.backends.cuda.persistent.kernels import persistent_kernel
from rnngraph.run.backends.cuda.persistent.phases import phases
from rnngraph.run.executor import HANDLERS, Executor
from rnngraph.run.workspace import LOOP_SUMS
from test_loops import run_executor
from test_persistent import loops
from test_persistent_heads import assert_agree, problem_arrays


def reread_bias(H=16):
    """h = tanh(tanh(W·x + b) + U·h_prev + b): b read by the hoisted group and by the loop's, so it has a ParamSum
    in each."""
    c = Cell("reread")
    x, h = c.input("x", 8), c.state("h", H)
    b = c.param("b", (H,))
    u = c.tanh(c.linear(x, "W", H) + b)
    hn = c.tanh(u + c.linear(h, "U", H) + b, name="h")
    c.bind(h, hn)
    c.output(hn)
    return c.build()


def sums_run(monkeypatch, be):
    """The parameters whose ParamSums the handler runs on backend be (not skipped for the loop's kernel), in the
    calls after this."""
    ran = []

    def counted(ex, step, ws, t):
        if ex.backend is be and (step.item, step.param) not in ws.memo.get(LOOP_SUMS, ()):
            ran.append(step.param)
        return handlers.param_sum(ex, step, ws, t)
    monkeypatch.setitem(HANDLERS, ParamSum, counted)
    return ran


@needs_cxx
@pytest.mark.parametrize("cell, B, dtype, tc, rows", [
    ("lstm", 16, "bfloat16", None, None), ("lstm", 3, "float64", None, None), ("gru", 20, "float16", None, None),
    ("peephole_lstm", 4, "float32", None, None), ("lstm", 24, "bfloat16", True, 8), ("mgu", 4, "float64", None, 2)])
def test_the_kernel_sums_the_loop_parameters_in_place_of_their_param_sums(cell, B, dtype, tc, rows, monkeypatch):
    """Every parameter the loop's dfused phases read is summed by the backward kernel where its body has what the term
    reads, in chunks of 4 frames and ragged lengths, in row groups where asked (each block storing its group's rows);
    each gradient agrees with numpy's; only the ParamSums of the others run."""
    pytest.importorskip("ml_dtypes")
    c = load_cell(cell, 8, 16)
    be = Emulated(4, "groups" if rows else False, rows, tensor_cores=tc)
    ran = sums_run(monkeypatch, be)
    ex, ref = Executor(c, be, loop="persistent", chunk=4), Executor(c, get_backend("numpy"), loop="stages", chunk=4)
    args, lengths = problem_arrays(c, 9, B, dtype), np.arange(B) % 10
    got, want = run_executor(ex, *args, lengths), run_executor(ref, *args, lengths)
    assert_agree(got, want, dtype)
    taken = {u for (_, u), _ in be.ran[-1].sums}
    rest = {"w_co"} if cell == "peephole_lstm" else set()     # its term reads c's value, which the body does not load
    assert taken == {u for u in c.params if c.params[u] == (16,)} - rest and set(ran) == rest
    assert be.walked[-3:] == [4, 4, 1]       # the backward: the last chunk first


@needs_cxx
def test_a_parameter_read_outside_the_loop_too_keeps_that_sum():
    """b's loop term is the kernel's, its term in the hoisted group's the ParamSum's: both, once each."""
    c = reread_bias()
    sched = build_schedule(c, loop="persistent")
    owners = [it for sec in sched.backward for it in sec.items if isinstance(it, ParamSum) and it.param == "b"]
    be = Emulated(4)
    ex, ref = Executor(c, be, loop="persistent"), Executor(c, get_backend("numpy"), loop="stages")
    args = problem_arrays(c, 6, 3, "float64")
    assert_agree(run_executor(ex, *args), run_executor(ref, *args), "float64")
    taken = {key for key, _ in be.ran[-1].sums}
    assert len(owners) == 2 and sum((it.item, "b") in taken for it in owners) == 1


def test_terms_are_the_rules_on_the_gradients_as_stored_and_the_source_compiles():
    """An LSTM's bias terms are its gate sums' gradients, rounded as stored in half precision; a peephole's reads
    the cell's earlier value; the kernel with them compiles for sm_90, storing each register once after its last
    frame."""
    lstm = load_cell("lstm", 8, 64)
    dfused = next(p for g in phases(lstm, loops(lstm)[1]) for p in g if p.kind == "dfused")
    nodes = dfused.item.nodes
    want = [(u, f"(d{nodes.index(n)})") for n in nodes for u, _ in lstm.reads(n) if u in lstm.params]
    assert sums.terms(lstm, dfused, "float") == want and len(want) == 8
    assert sums.terms(lstm, dfused, "rg_bf16") == [(u, f"(rg_rounded<rg_bf16>({e[1:-1]}))") for u, e in want]
    peep = load_cell("peephole_lstm", 8, 64)
    dfused = next(p for g in phases(peep, loops(peep)[1]) for p in g if p.kind == "dfused")
    found = dict(sums.terms(peep, dfused, "float"))
    assert {"w_ci", "w_cf"} <= set(found) and all(" * x" in found[w] for w in ("w_ci", "w_cf"))
    k = persistent_kernel(lstm, loops(lstm)[1], "rg_bf16", 16, 8, 2, True)
    assert len(k.sums) == 8 and k.sum_columns == 8 * 64 and ("sums", "part") in k.args
    assert k.source.count("= ps0;") == 1 and k.source.count("ps0 += ") == 2     # the prologue's frame, the loop's
    nvrtc_compile(k.source, k.name)
    nvrtc_compile(sums.SUMS_SOURCE.format(S="rg_bf16", T="float"), "rg_persist_sums_rg_bf16")


def test_kernels_of_blocks_owning_whole_heads_leave_the_sums_to_param_sums():
    """Per head the threads hold their weight rows in registers, and the accumulators measured slower there."""
    c = load_cell("slstm", 64, 64, heads=4)
    assert persistent_kernel(c, loops(c)[1], "rg_bf16", 2, 4).sums == ()
