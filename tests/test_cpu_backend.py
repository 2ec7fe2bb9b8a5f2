"""The compiled CPU backend ('cpu', run/backends/cpu) against the numpy reference: every built-in cell and loop
strategy, ragged lengths, chunked calls, dropout and cells reading up to 3 frames back give numpy's outputs,
final states and gradients (float64 to 1e-12, float32 to 1e-5, bfloat16 to its rounding), with its GEMMs in
MKL on rnngraph's threads (where MKL is installed; and with every GEMM and memset split over them, however
small) and in numpy's BLAS; its generated sources are deterministic; and without numba 'auto'
falls back to numpy, saying so once.

Every test uses the same sizes (3 inputs, 5 features), so the compiled functions are shared through numba's
cache: a loop's source does not depend on T or B."""
import warnings

import numpy as np
import pytest

from rnngraph import RnnGraphError, RnnGraphWarning
from rnngraph.ir.cells import CELLS
from rnngraph.ir.loading import load_cell
from rnngraph.plan.loops.stages import frame_views
from rnngraph.nn import Recurrent
from rnngraph.run import backends
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cpu import blas, jit
from rnngraph.run.backends.cpu.stages import ITEMS, Loop
from rnngraph.run.executor import Executor
from test_classify import LINEAR_FORMS, one_state
from test_history import skip_cell

pytest.importorskip("numba")

TOL = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 2e-2}
COMPILED = set(CELLS) - {"layernorm_lstm", "layernorm_gru"}     # their row reductions run numpy's reference
STRATEGIES = [("min_gru", "scan"), ("min_gru", "elementwise"), ("qrnn", "elementwise"), ("indrnn", "elementwise"),
              ("sru", "elementwise"), ("lstm", "persistent"), ("gru", "stages"), ("mgu", "persistent")]


def close(a, b, tol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape
    scale = max(float(np.abs(b).max(initial=0)), 1e-300)
    assert float(np.abs(a - b).max(initial=0)) <= tol * scale, float(np.abs(a - b).max()) / scale


@pytest.fixture(params=["mkl", "mkl, all split", "numpy's BLAS"])
def cpu_blas(request, monkeypatch):
    """A cpu backend: its GEMMs in MKL on rnngraph's threads (a loop's rows split, larger work only), the same
    with every GEMM and memset split too, or in numpy's BLAS."""
    if request.param.startswith("mkl"):
        if not isinstance(blas.mkl(), blas.Mkl):
            pytest.skip(f"no MKL: {blas.mkl()}")
        monkeypatch.setattr(blas, "SPLIT_WORK", 0 if request.param == "mkl, all split" else blas.SPLIT_WORK)
        be = get_backend("cpu")
        assert isinstance(be.mkl, blas.Mkl) and be.threads.own == (blas.threads() > 1)
        return be
    return get_backend("cpu", mkl=False)


def twins(cell, loop="auto", dtype="float64", backend="cpu", **kw):
    """(numpy layer, cpu layer) with the same parameters."""
    kw = {"num_layers": 2, "bidirectional": True, "dtype": dtype, "seed": 2, "loop": loop, **kw}
    ref, cpu = Recurrent(cell, 3, 5, backend="numpy", **kw), Recurrent(cell, 3, 5, backend=backend, **kw)
    cpu.load_state_dict(ref.state_dict())
    return ref, cpu


def calls(layer, xs, lengths=None):
    """Every array of a run over the calls xs, the state carried across them: outputs, finals, and the
    gradients of inputs, initial state and parameters under random output and final gradients."""
    rng, out, state = np.random.default_rng(7), [], None
    for x in xs:
        y, fin = layer(x, state, lengths)
        fins = fin if isinstance(fin, tuple) else (fin,)
        gfin = tuple(rng.standard_normal(f.shape).astype(f.dtype) for f in fins)
        gx, g0, grads = layer.backward(rng.standard_normal(y.shape).astype(y.dtype), gfin if len(gfin) > 1 else gfin[0])
        out += [y, *fins, gx, *(g0 if isinstance(g0, tuple) else (g0,)), *(grads[n] for n in sorted(grads))]
        out = [a.copy() for a in out]
        state = tuple(f.copy() for f in fins) if len(fins) > 1 else fins[0].copy()
    return out


def agree(ref, cpu, xs, lengths=None, dtype="float64"):
    for a, b in zip(calls(cpu, xs, lengths), calls(ref, xs, lengths), strict=True):
        close(a, b, TOL[dtype])


def frames(T, dtype="float64", seed=3):
    return np.random.default_rng(seed).standard_normal((T, 4, 3)).astype(dtype)


def loops_compiled(layer) -> list:
    """Whether each time loop of the layer's first executor ran as one compiled function."""
    ws = layer._stack.runs[0][0].ex.ws
    return [entry[1] is not None for key, entry in ws.memo.items()      # (loop item, all frames): (views, launch)
            if isinstance(key, tuple) and hasattr(key[0], "reverse") and key[1] is None]


@pytest.mark.parametrize("cell", list(CELLS))
def test_every_builtin_cell_equals_numpy_ragged(cell, cpu_blas):
    ref, cpu = twins(cell, backend=cpu_blas)
    agree(ref, cpu, [frames(9)], np.array([9, 4, 1, 7]))
    assert all(loops_compiled(cpu)) == (cell in COMPILED) and loops_compiled(cpu)


@pytest.mark.parametrize("cell, loop", STRATEGIES, ids=[f"{c}-{s}" for c, s in STRATEGIES])
def test_every_strategy_equals_numpy(cell, loop, cpu_blas):
    ref, cpu = twins(cell, loop, backend=cpu_blas)
    agree(ref, cpu, [frames(7)])
    assert cpu.loop_strategy == loop


@pytest.mark.parametrize("cell", ["lstm", "gru", "mgu", "sru"])
def test_float32_equals_numpy(cell, cpu_blas):
    ref, cpu = twins(cell, dtype="float32", backend=cpu_blas)
    agree(ref, cpu, [frames(9, "float32")], np.array([9, 5, 2, 9]), dtype="float32")


def test_one_stream_equals_numpy(cpu_blas):
    """B = 1: one range of rows; numpy's BLAS runs the per-frame GEMMs as GEMVs."""
    ref, cpu = twins("gru", backend=cpu_blas)
    agree(ref, cpu, [frames(6)[:, :1]])


@pytest.mark.parametrize("cell", ["lstm", "indrnn"])
def test_bfloat16_equals_numpy_to_its_rounding(cell):
    ref, cpu = twins(cell, dtype="bfloat16", num_layers=1, bidirectional=False)
    import ml_dtypes
    agree(ref, cpu, [frames(6).astype(ml_dtypes.bfloat16)], dtype="bfloat16")
    assert all(loops_compiled(cpu)) and loops_compiled(cpu)


@pytest.mark.parametrize("cell", ["lstm", "min_gru", skip_cell])
def test_chunked_calls_and_carried_state_equal_numpy(cell):
    ref, cpu = twins(cell)
    cpu.backend.chunk_frames = 3
    agree(ref, cpu, [frames(8), frames(7, seed=4)], np.array([7, 1, 2, 0]))
    assert cpu._stack.runs[0][0].ex.chunked


@pytest.mark.parametrize("cell", ["lstm", "min_gru", "sru", skip_cell])
def test_bounded_calls_equal_numpy(cell):
    """buckets=True: T in the ladder of chunks (their compiled loops on the chunks' workspaces), B padded."""
    ref, cpu = twins(cell, buckets=True)
    agree(ref, cpu, [frames(75), frames(75, seed=4)], np.array([70, 1, 9, 0]))
    assert cpu._stack.runs[0][0].ex.chunked and all(loops_compiled(cpu))


def test_the_kept_transpose_through_blas_equals_numpys():
    """pack's transposed copy of per-frame weights (BLAS's ?omatcopy where it has one), contiguous or not."""
    be = get_backend("cpu")
    rng = np.random.default_rng(0)
    for a in (rng.standard_normal((37, 11)), rng.standard_normal((40, 24)).astype(np.float32),
              rng.standard_normal((20, 30))[:, :7], np.zeros((0, 5))):
        out = np.full(a.shape[::-1], np.nan, a.dtype)
        be.transpose_into(out, a)
        np.testing.assert_array_equal(out, a.T)


def test_zeroing_a_gradient_arena(cpu_blas):
    """zero() (memset for a contiguous arena, split over the threads where they are rnngraph's; numpy's fill
    otherwise) clears NaN and inf too."""
    be = cpu_blas
    for a in (np.full(1000, np.nan, np.float32), np.full(33, np.inf), np.full((40, 6), 7.0)[:, ::2], np.zeros(0)):
        be.zero(a)
        assert not a.any() and not np.isnan(a).any()


@pytest.mark.parametrize("cell", ["lstm", "gru", "mgu"])
def test_the_gradients_a_compiled_backward_never_touches_are_not_zeroed(cell):
    """After the first backward, Workspace.zero_grads skips the gradients of members a compiled fused backward keeps to
    itself or stores whole (an LSTM's gate gradients: tests/test_aliases.py): NaN left in them changes nothing, nor
    does a call of another length writing over the shared arena."""
    from rnngraph.run.workspace import UNTOUCHED
    ref, cpu = twins(cell, num_layers=1, bidirectional=False)
    agree(ref, cpu, [frames(6)])
    ex = cpu._stack.runs[0][0].ex
    spans = ex.ws.memo[UNTOUCHED]
    assert spans and all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:] + [(ex.ws.grad_arena.size, 0)]))
    for a, b in spans:
        ex.ws.grad_arena[a:b] = np.nan
    first = ex.ws
    agree(ref, cpu, [frames(6, seed=5), frames(4, seed=6), frames(6, seed=7)])     # T = 4: the arena carved anew
    assert ex.ws is first and ex.ws.memo[UNTOUCHED] == spans and ref._stack.runs[0][0].ex.ws.memo[UNTOUCHED] == []


def test_copies_into_a_workspace_equal_numpys(cpu_blas):
    """copy(): split over rnngraph's threads for contiguous arrays of one shape and dtype, numpy's otherwise."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    for shape, dtype in (((700, 400), np.float32), ((3, 5), np.float64), ((600, 500), ml_dtypes.bfloat16)):
        src = rng.standard_normal(shape).astype(dtype)
        for dst, part in ((np.zeros(shape, dtype), src), (np.zeros((shape[0], 2 * shape[1]), dtype)[:, ::2], src),
                          (np.zeros(shape, dtype), src[0])):
            cpu_blas.copy(dst, part)
            np.testing.assert_array_equal(dst, np.broadcast_to(part, shape))


def test_dropout_between_layers_equals_numpy():
    ref, cpu = twins("lstm", dropout=0.4)
    ref.train(), cpu.train()
    agree(ref, cpu, [frames(6)])


@pytest.mark.parametrize("delay", [1, 2, 3])
@pytest.mark.parametrize("loop", ["scan", "elementwise", "stages"])
def test_cells_reading_up_to_three_frames_back(delay, loop):
    cell = one_state(LINEAR_FORMS["(1-a)*h + a*b"], delay, D=3, H=5)
    ref, cpu = twins(cell, loop, num_layers=1, bidirectional=False)
    agree(ref, cpu, [frames(7), frames(2, seed=4)])       # the second call shorter than the delay
    agree(ref, cpu, [frames(7)], np.array([7, 2, 1, 5]))


def test_generated_sources_are_deterministic_and_independent_of_T_and_B():
    sources = []
    for T, B in ((5, 2), (9, 3)):
        ex = Executor(load_cell("lstm", 3, 5), get_backend("cpu"))
        ws = ex.workspace(T, B, np.dtype("float32"))
        ws.bind_params({n: np.zeros(s, np.float32) for n, s in ex.cell.params.items()})
        for loop in (ex.sched.forward[1].items[0], ex.sched.backward[1].items[0]):
            for packed in (False, True):
                gen = Loop(ex.cell, frame_views(ws, None), "float32", packed=packed)
                assert all(ITEMS[type(it)](gen, it) for st in loop.stages for it in st.items)
                sources.append(gen.source(loop.reverse))
    assert sources[:4] == sources[4:] and len(set(sources[:4])) == 4
    assert "gemm32(False, True, m, 20, 5" in sources[0] and "for t in range(T - 1, -1, -1):" in sources[2]
    assert "pack32(True, m, 20, 5, a" in sources[1] and "gemm_packed32(m, 20, 5, a" in sources[1]
    assert "pack32(False, m, 5, 20, a" in sources[3]
    assert "loop(T, P, B, b0, B * (p + 1) // parts - b0, k0[p]" in sources[3]


def test_without_numba_auto_runs_numpy_and_says_so_once(monkeypatch):
    real = jit.importlib.util.find_spec
    monkeypatch.setattr(jit.importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real(name, *a))
    backends._passed_over.cache_clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert get_backend("auto").name == get_backend("auto").name == backends.cpu_backend() == "numpy"
    lines = [str(w.message) for w in seen if issubclass(w.category, RnnGraphWarning)]
    assert lines == ["running the numpy backend, not the cpu backend: numba is not installed; pip install numba "
                     "(or pip install 'rnngraph[test]')"]
    with pytest.raises(RnnGraphError, match=r"^numba is not installed; pip install numba"):
        get_backend("cpu")
    backends._passed_over.cache_clear()


def test_auto_runs_the_compiled_backend_here_and_naive_compiles_nothing():
    assert get_backend("auto").name == backends.cpu_backend() == "cpu"
    assert get_backend("auto").auto_loops == {"stages", "elementwise", "scan"}
    layer = Recurrent("lstm", 3, 5, backend="cpu", mode="naive", dtype="float64")
    layer(frames(4))
    memo = layer._stack.runs[0][0].ex.ws.memo          # prepared items: (item, frame) -> (views, launch)
    assert not any(v[1] for k, v in memo.items()
               if isinstance(k, tuple) and len(k) == 2 and (isinstance(k[1], int) or k[1] is None))


def test_blas_threads_limits_the_pool_for_its_own_calls_only():
    pytest.importorskip("threadpoolctl")
    be = get_backend("cpu", blas_threads=1)
    from rnngraph.run.backends.cpu.blas import threads
    seen = be.threads.run(threads)                   # numpy's BLAS pool, whatever else (torch's) is loaded
    assert seen == 1 and be.threads.n == 1
    ref, cpu = twins("lstm", num_layers=1, bidirectional=False)
    cpu.backend.threads = be.threads
    agree(ref, cpu, [frames(5)])
    with pytest.raises(RnnGraphError, match=r"^blas_threads must be a positive int or None"):
        get_backend("cpu", blas_threads=0)



def test_work_splits_over_rnngraphs_threads_only_where_it_is_worth_a_thread(monkeypatch):
    monkeypatch.setattr(blas, "threads", lambda: 2)
    own, shared = blas.Threads(None, own=True), blas.Threads(None, own=False)
    assert [own.parts(r, w) for r, w in ((32, blas.SPLIT_WORK), (1, blas.SPLIT_WORK), (32, blas.SPLIT_WORK - 1))] \
        == [2, 1, 1]
    assert own.parts(5) == 2 and shared.parts(32) == shared.parts(32, 1 << 30) == 1
    assert blas.Threads(1, own=True).parts(32) == 1          # blas_threads=1 (rnngraph.torch): one thread


def test_mkl_is_found_in_its_package_or_says_why_not(monkeypatch):
    from rnngraph.run.backends.cpu import prelude
    assert prelude.MKL is blas.mkl()        # the prelude looked once, before the package is hidden below
    find = blas.mkl.__wrapped__
    monkeypatch.setenv("RNNGRAPH_MKL", "0")
    assert find() == "RNNGRAPH_MKL=0 turns it off"
    monkeypatch.delenv("RNNGRAPH_MKL")

    def missing(name):
        raise blas.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(blas.metadata, "distribution", missing)
    assert find().startswith("MKL is not installed (pip install mkl")
    with pytest.raises(RnnGraphError, match=r"^mkl must be True \(MKL where it is installed\) or False"):
        get_backend("cpu", mkl="yes")
    assert get_backend("cpu", mkl=False).mkl == "mkl=False asks for numpy's BLAS"


def test_without_a_fast_thread_pool_the_gemms_stay_in_numpys_blas(monkeypatch):
    """numba's own workqueue wakes as slowly as Python's threads: MKL then does not run the GEMMs single-file."""
    if not isinstance(blas.mkl(), blas.Mkl) or blas.threads() < 2:
        pytest.skip("no MKL or one core: nothing to split")
    from rnngraph.run.backends.cpu import prelude
    monkeypatch.setattr(prelude, "fast_threads", lambda: False)
    be = get_backend("cpu")
    assert be.mkl.startswith("numba's thread pool here is its own workqueue") and not be.threads.own
    assert "MKL" in blas.cpu_info() and "threads" in blas.cpu_info()


def test_a_changed_prelude_names_new_modules(tmp_path, monkeypatch):
    """numba's cache of a generated module holds the prelude compiled into it and checks only the module's file:
    the prelude's digest is in every header, so a changed prelude writes (and compiles) new modules."""
    import hashlib
    from pathlib import Path
    assert jit.PRELUDE == hashlib.sha1((Path(jit.__file__).parent / "prelude.py").read_bytes()).hexdigest()[:16]
    monkeypatch.setenv("RNNGRAPH_CACHE", str(tmp_path))
    body = "\n\ndef answer():\n    return 42\n"
    assert jit.load(body).answer() == 42
    monkeypatch.setattr(jit, "HEADER", jit.HEADER.replace(jit.PRELUDE, "0" * 16))
    assert jit.load(body).answer() == 42
    files = sorted(p.read_text().split("\n")[1] for p in (tmp_path / "cpu-kernels").glob("rg_*.py"))
    assert files == ["# prelude " + "0" * 16, "# prelude " + jit.PRELUDE]


def test_the_finite_check_skips_the_values_a_fused_pass_keeps_to_itself():
    """The compiled forward never stores an LSTM's gate sums (unstored): check_finite=True reads only what was
    stored, so stale NaN in those buffers raises nothing, while a NaN the forward stores is still named."""
    layer = Recurrent("lstm", 3, 4, backend="cpu", dtype="float32")
    layer.check_finite = True
    x = frames(5, "float32")
    layer(x)
    ex = layer._stack.runs[0][0].ex
    dropped = ex.backend.unstored(ex.sched)
    assert {"add4", "mul21"} <= dropped and not dropped & {"i", "f", "g", "o", "c", "h"}
    for n in dropped:
        ex.ws.vals[n][...] = np.nan
    layer(x)                                     # the buffers stay stale: nothing to report
    with pytest.raises(RnnGraphError, match="not finite"):
        layer(np.full_like(x, np.nan))
    assert get_backend("numpy").unstored(ex.sched) == frozenset()


def test_the_float32_transcendentals_are_within_two_units_in_the_last_place():
    """exp32 and tanh32 (prelude.py), compiled in a loop as the fused passes call them, against float64's exact
    values rounded: a dense grid over float32's range and near the branch points, tiny and special values."""
    from numba import njit
    from rnngraph.run.backends.cpu.prelude import exp32, tanh32

    @njit
    def both(x, e, t):
        for i in range(x.size):
            e[i], t[i] = exp32(x[i]), tanh32(x[i])

    x = np.concatenate([np.linspace(-110, 100, 400_001), np.linspace(-1, 1, 200_001), np.geomspace(1e-30, 1, 20_001),
                        -np.geomspace(1e-30, 1, 20_001), [0.6, np.nextafter(0.6, 0), 88.72, -87.33]]).astype(np.float32)
    e, t = np.empty_like(x), np.empty_like(x)
    both(x, e, t)
    for got, exact in ((e, np.exp(x.astype(np.float64))), (t, np.tanh(x.astype(np.float64)))):
        normal = (np.abs(exact) >= np.finfo(np.float32).tiny) & (np.abs(exact) <= np.finfo(np.float32).max)
        ulp = np.spacing(np.abs(exact[normal]).astype(np.float32)).astype(np.float64)
        assert (np.abs(got[normal] - exact[normal]) / ulp).max() <= 2
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 89.0, -104.0], np.float32)
    e, t = np.empty_like(special), np.empty_like(special)
    both(special, e, t)
    assert np.isnan(e[0]) and np.isnan(t[0]) and list(e[1:]) == [np.inf, 0, 1, np.inf, 0] and list(t[1:]) == [1, -1, 0, 1, -1]
    assert np.signbit(t[3])
