"""The loop strategies 'scan' and 'elementwise' on the GPU (their kernels) against the numpy float64
reference running 'stages': built-in cells, ragged batches, chunked calls, delays 1-3, long T."""
import numpy as np
import pytest

from rnngraph.nn.recurrent import Recurrent
from test_classify import LINEAR_FORMS, one_state
from test_loops import MIXED, mixed_cell, run_executor

pytestmark = pytest.mark.gpu
TOL = {"float64": 1e-10, "float32": 1e-4}   # relative, by dtype
BUILTINS = [("min_gru", "scan"), ("min_gru", "elementwise"), ("min_lstm", "scan"), ("qrnn", "scan"),
            ("qrnn", "elementwise"), ("indrnn", "elementwise"), ("sru", "elementwise")]


def pair(cell, loop, size, hidden, dtype, mode, **options):
    """(numpy float64 'stages' layer, cupy `loop` layer) with the same parameters."""
    import cupy
    ref = Recurrent(cell, size, hidden, dtype="float64", loop="stages", seed=1, **options)
    gpu = Recurrent(cell, size, hidden, backend="cupy", dtype=dtype, mode=mode, loop=loop, **options)
    gpu.load_state_dict({k: cupy.asarray(v.astype(dtype)) for k, v in ref.state_dict().items()})
    assert (ref.loop_strategy, gpu.loop_strategy) == ("stages", loop)
    return ref, gpu


# states a random initial state must keep positive: sLSTM's normaliser (h = o·c / n; from zeros it stays ≥ i' > 0)
POSITIVE_STATES = {("slstm", "n")}


def calls(layer, xs, lengths, xp, dtype):
    """Every array of a run over the chunks xs with the state(s) carried across calls, as float64 numpy:
    outputs, finals, gradients of inputs, initial states and parameters under fixed random gradients."""
    rng = np.random.default_rng(7)
    conv = lambda a: tuple(map(conv, a)) if isinstance(a, tuple) else xp.asarray(a.astype(dtype))
    back = lambda a: np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)
    draw = lambda like: tuple(map(draw, like)) if isinstance(like, tuple) else rng.standard_normal(like.shape)
    flat = lambda a: [x for v in a for x in flat(v)] if isinstance(a, tuple) else [a]
    y, fin = layer(conv(xs[0]))
    state, out = draw(fin), []
    if isinstance(state, tuple):
        state = tuple(np.abs(a) + 0.5 if (layer.cell.name, s) in POSITIVE_STATES else a
                      for s, a in zip(layer.state_names, state))
    for x in xs:
        y, fin = layer(conv(x), conv(state), None if lengths is None else conv(lengths).astype("int64"))
        gx, g0, grads = layer.backward(conv(rng.standard_normal(y.shape)), conv(draw(fin)))
        out += [back(a) for a in (y, *flat(fin), gx, *flat(g0), *(grads[n] for n in sorted(grads)))]
        state = tuple(map(back, fin)) if isinstance(fin, tuple) else back(fin)
    return out


def agree(ref, gpu, xs, lengths, dtype, what):
    import cupy
    for k, (a, b) in enumerate(zip(calls(gpu, xs, lengths, cupy, dtype), calls(ref, xs, lengths, np, "float64"),
                                   strict=True)):
        err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)
        assert err <= TOL[dtype], f"{what}: array {k} relative error {err:.2e} > {TOL[dtype]:.0e}"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", ["staged", "graph"])
@pytest.mark.parametrize("cell, loop", BUILTINS, ids=[f"{c}-{l}" for c, l in BUILTINS])
def test_builtins_match_the_reference(cell, loop, mode, dtype):
    ref, gpu = pair(cell, loop, 5, 8, dtype, mode, num_layers=2, bidirectional=True)
    x = np.random.default_rng(3).standard_normal((19, 3, 5))
    agree(ref, gpu, [x], np.array([19, 11, 1]), dtype, f"{cell}/{loop}/{mode} ragged")
    agree(ref, gpu, [x[:7], x[7:14], x[14:]], None, dtype, f"{cell}/{loop}/{mode} chunked")   # graph: replays


FORMS = [(form, d, loop) for form in LINEAR_FORMS for d in (1, 2, 3) for loop in ("scan", "elementwise")]


@pytest.mark.parametrize("form, delay, loop", FORMS, ids=[f"{f}-d{d}-{l}" for f, d, l in FORMS])
def test_linear_forms_and_delays(form, delay, loop):
    ref, gpu = pair(one_state(LINEAR_FORMS[form], delay), loop, 3, 4, "float64", "graph")
    x = np.random.default_rng(4).standard_normal((17, 3, 3))
    agree(ref, gpu, [x], np.array([17, 9, 2]), "float64", f"{form} d={delay} {loop}")
    agree(ref, gpu, [x[:2], x[2:3], x[3:]], None, "float64", f"{form} d={delay} {loop} chunked")


@pytest.mark.parametrize("T, B, H, delay", [(4096, 1, 64, 1), (1000, 2, 16, 3), (333, 64, 96, 2)])
@pytest.mark.parametrize("loop", ["scan", "elementwise"])
def test_long_sequences_in_float32(T, B, H, delay, loop):
    """Many chunks per chain (B = 1), interleaved chains, one chunk per chain (B = 64): float32 against
    float64 over the whole run, forward and gradients."""
    cell = "min_gru" if delay == 1 else one_state(LINEAR_FORMS["(1-a)*h + a*b"], delay, D=8, H=H)
    ref, gpu = pair(cell, loop, 8, H, "float32", "graph")
    x = np.random.default_rng(5).standard_normal((T, B, 8))
    agree(ref, gpu, [x], None, "float32", f"T={T} B={B} d={delay} {loop}")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", ["staged", "graph"])
@pytest.mark.parametrize("kind", MIXED)
def test_a_scanned_state_beside_other_states(kind, mode, dtype):
    """The scan kernels, then the rest of the loop (frame by frame, or the elementwise kernel) reading the
    scanned state; a graph is replayed with new inputs."""
    import cupy
    from rnngraph.run.backends import get_backend
    from rnngraph.run.backends.numpy_backend import NumpyBackend
    from rnngraph.run.executor import Executor
    cell = mixed_cell(kind)
    ref, ex = Executor(cell, NumpyBackend(), loop="stages"), Executor(cell, get_backend("cupy", mode), loop="scan")
    own = {}
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        params = {n: rng.uniform(-0.6, 0.6, shape) for n, shape in cell.params.items()}
        x, gy = rng.standard_normal((23, 3, 3)), rng.standard_normal((23, 3, 4))
        init, gf = ({s: rng.standard_normal((3, 4)) for s in ("c", "h")} for _ in range(2))
        want = run_executor(ref, params, x, init, gy, gf)
        for n, v in params.items():       # the same parameter arrays, updated in place
            own.setdefault(n, cupy.empty(v.shape, dtype))[...] = cupy.asarray(v.astype(dtype))
        conv = lambda d: {k: cupy.asarray(v.astype(dtype)) for k, v in d.items()}
        got = run_executor(ex, own, cupy.asarray(x.astype(dtype)), conv(init), cupy.asarray(gy.astype(dtype)), conv(gf))
        for k, (a, b) in enumerate(zip(got, want, strict=True)):
            a = cupy.asnumpy(a).astype(np.float64)
            err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)
            assert err <= TOL[dtype], f"{kind}/{mode}/{dtype} call {seed}: array {k} relative error {err:.2e}"


@pytest.mark.parametrize("cell", ["min_gru", "qrnn"])
def test_a_scan_of_many_chunks_gives_the_same_bits_every_run(cell):
    """T = 4096, B = 2, H = 64: 512 chunks a chain (scan.scan_chunks), composed by the carry kernel: two runs give
    the same bits, and agree with the float64 reference."""
    import cupy
    from rnngraph.run.backends.cuda.scan import scan_chunks
    assert scan_chunks(4096, 1, 2 * 64)[0] == 512
    ref, gpu = pair(cell, "scan", 8, 64, "float32", "graph")
    x = np.random.default_rng(5).standard_normal((4096, 2, 8))
    for a, b in zip(calls(gpu, [x], None, cupy, "float32"), calls(gpu, [x], None, cupy, "float32"), strict=True):
        np.testing.assert_array_equal(a, b)
    agree(ref, gpu, [x], None, "float32", f"{cell} T=4096")
