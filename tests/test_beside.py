"""The GEMM gradients after the persistent backward, run beside it span by span (Executor._beside, spans; on the GPU
persistent/beside.py): the kernel tells its frames walked at each frame's first barrier (kernels.walked), and the
GEMMs read and write the spans' rows (Workspace Frames), half storage summing the weights' gradients in float32.
Here the emulator runs the kernels on the CPU and the spans one after the other (ArrayBackend.launch_beside),
against numpy's loop; tests/test_gpu_beside.py runs them on a side stream."""
import numpy as np
import pytest

from cuda_on_cpu import Emulated, needs_cxx
from nvrtc import nvrtc_compile
from rnngraph import load_cell
from rnngraph.plan.items import GemmGrad, WeightGrad
from rnngraph.plan.loops import PersistentLoop
from rnngraph.plan.schedule import build_schedule
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cuda.persistent.beside import WALKED_SOURCE, Launch
from rnngraph.run.backends.cuda.persistent.kernels import ZERO_SOURCE, persistent_kernel
from rnngraph.run.executor import BESIDE_SPANS, Executor, spans
from rnngraph.run.workspace import BESIDE, Frames
from test_loops import run_executor
from test_persistent_heads import assert_agree, problem_arrays
from test_persistent_sums import reread_bias


class Walked(Emulated):
    """The emulator, its compiled backward loops' launches marked as telling their frames walked; `spans` counts the
    spans run beside them."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.spans = 0

    def compile(self, cell, item, views, per_frame):
        out = super().compile(cell, item, views, per_frame)
        if out is None or not (isinstance(item, PersistentLoop) and item.reverse):
            return out
        told = Launch(out)
        told.walked = ("emulated", 1)
        return told

    def loop_walked(self, launch) -> bool:
        return getattr(launch, "walked", None) is not None

    def launch_beside(self, launch, spans):
        self.spans += len(spans)
        super().launch_beside(launch, spans)


@pytest.mark.parametrize("T", range(1, 30))
def test_the_spans_cover_the_frames_last_first_each_once_its_frames_are_walked(T):
    got = spans(T)
    assert len(got) == min(T, BESIDE_SPANS) and got[-1][0] is None
    frames = [t for _, fr in got for t in range(fr.t0, fr.t0 + fr.n)]
    assert sorted(frames) == list(range(T))
    assert [fr.t0 for _, fr in got] == sorted((fr.t0 for _, fr in got), reverse=True)
    assert all(walked == T - fr.t0 for walked, fr in got[:-1]) and got[-1][1].t0 == 0


@needs_cxx
@pytest.mark.parametrize("cell, T, B, dtype, rows", [
    ("lstm", 9, 3, "float64", None), ("lstm", 17, 16, "bfloat16", None), ("lstm", 2, 4, "float32", None),
    ("gru", 11, 5, "float16", None), ("mgu", 9, 4, "float64", 2), ("peephole_lstm", 10, 2, "float32", None),
    ("lstm", 12, 24, "bfloat16", 8)])
def test_the_gemms_beside_the_loop_give_numpys_gradients(cell, T, B, dtype, rows):
    """Every array agrees with numpy's loop (half: within a rounding), ragged lengths too; the input's and the
    weights' GEMM gradients ran beside the loop, in min(T, 8) spans."""
    pytest.importorskip("ml_dtypes")
    c = load_cell(cell, 8, 16)
    be = Walked(4, "groups" if rows else False, rows)
    ex, ref = Executor(c, be, loop="persistent"), Executor(c, get_backend("numpy"), loop="stages")
    args, lengths = problem_arrays(c, T, B, dtype), np.arange(B) % (T + 1)
    for ragged in (None, lengths):
        assert_agree(run_executor(ex, *args, ragged), run_executor(ref, *args, ragged), dtype)
    beside = ex.ws.memo[BESIDE]
    assert beside and {type(it) for it in beside} == {GemmGrad, WeightGrad} and be.spans == 2 * min(T, BESIDE_SPANS)


@needs_cxx
def test_nothing_runs_beside_a_loop_followed_by_a_fused_group():
    """reread's hoisted group (tanh(W·x + b)) comes after the loop in the backward and reads what the loop wrote:
    everything after the loop waits for its end."""
    c = reread_bias()
    be = Walked(4)
    ex, ref = Executor(c, be, loop="persistent"), Executor(c, get_backend("numpy"), loop="stages")
    args = problem_arrays(c, 6, 3, "float64")
    assert_agree(run_executor(ex, *args), run_executor(ref, *args), "float64")
    assert ex.ws.memo[BESIDE] == frozenset() and be.spans == 0


def test_a_span_reads_its_frames_rows():
    """Workspace.at(buf, Frames(t0, n), d): rows of frames t0 - d .. t0 + n - 1 - d, [n·B, F]."""
    from rnngraph.run.workspace import Workspace
    c = load_cell("lstm", 3, 4)
    ws = Workspace(build_schedule(c), get_backend("numpy"), 7, 2, "float64")
    buf = np.arange((ws.P + 7) * 2 * 4, dtype=np.float64).reshape(ws.P + 7, 2, 4)
    np.testing.assert_array_equal(ws.at(buf, Frames(2, 3), 1), buf[ws.P + 1:ws.P + 4].reshape(6, 4))
    np.testing.assert_array_equal(ws.at(buf, Frames(0, 7)), ws.at(buf, None))


@pytest.mark.parametrize("cell", ["lstm", "gru", "mgu"])
def test_a_backward_with_a_barrier_a_frame_tells_its_frames_walked_and_the_sources_compile(cell):
    """The backward's kernel tells its frames walked once a frame, after the first barrier; the forward's and a
    per-head kernel's do not; the wait and the zeroing compile with NVRTC."""
    c = load_cell(cell, 8, 16)
    fwd, bwd = build_schedule(c, loop="persistent").forward[1].items[0], \
        build_schedule(c, loop="persistent").backward[1].items[0]
    k = persistent_kernel(c, bwd, "float", 4, 4)
    assert k.tells_walked and k.source.count("walked(count + 1, s,") == 1 and k.bar_words == 3
    assert not persistent_kernel(c, fwd, "float", 4, 4).tells_walked
    assert persistent_kernel(c, bwd, "float", 4, 4, 2).bar_words == 5
    heads = load_cell("slstm", 8, 16, heads=4)
    hb = build_schedule(heads, loop="persistent").backward[1].items[0]
    assert not persistent_kernel(heads, hb, "float", 4, 4).tells_walked       # a block a head: no barrier
    nvrtc_compile(WALKED_SOURCE, "walked")
    nvrtc_compile(ZERO_SOURCE, "zero")
