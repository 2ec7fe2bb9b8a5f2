"""rnngraph.torch's defaults on CUDA: graph mode by default (equal to staged), autocast bf16/fp16 against the
CPU half reference and float64, TF32 exactly when torch's flags allow it, proj_size against cuDNN, steps that
replay one recording, and the whole-model benchmark agreeing with cuDNN."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from test_gpu_torch import no_tf32, rel  # noqa: E402,F401  (no_tf32: an autouse fixture, TF32 off in every test)

pytestmark = pytest.mark.gpu
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}     # relative 2-norm, as test_half.py


def as_tuple(state):
    return state if isinstance(state, tuple) else (state,)


def outputs_and_grads(model, x, hx=None, autocast=None):
    """[y, final states..., x.grad, parameter grads...] of one forward and backward (under autocast: dtype)."""
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    with torch.autocast(x.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        y, state = model(x, hx)
    states = as_tuple(state)
    (y.float().pow(2).sum() + sum(s.float().sum() for s in states)).backward()
    return [y, *states, x.grad, *(p.grad for p in model.parameters())]


def engine_of(model):
    (engine,) = model._engines.values()
    return engine


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_default_mode_is_graph_and_equals_staged(kind):
    import rnngraph.torch as rt
    dev = torch.device("cuda")
    torch.manual_seed(0)
    default = getattr(rt, kind)(6, 16, num_layers=2, bidirectional=True, device=dev)
    staged = getattr(rt, kind)(6, 16, num_layers=2, bidirectional=True, mode="staged", device=dev)
    staged.load_state_dict(default.state_dict())
    g = torch.Generator().manual_seed(1)
    for T, B in ((9, 3), (9, 3), (20, 16), (9, 3)):          # replays, a second shape, a replay again
        x = torch.randn(T, B, 6, generator=g).to(dev)
        for k, (a, b) in enumerate(zip(outputs_and_grads(default, x), outputs_and_grads(staged, x), strict=True)):
            assert rel(a, b) <= 1e-5, f"{kind} T={T} B={B}: array {k} differs by {rel(a, b):.1e}"   # atomic sums
    engine = engine_of(default)
    assert default.mode is None and engine.mode == "graph" and engine.backend.cache_info()["graphs"] > 0
    assert engine_of(staged).mode == "staged"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_against_the_cpu_half_reference(dtype):
    import rnngraph.torch as rt
    torch.manual_seed(0)
    gpu = rt.LSTM(16, 32, num_layers=2, device="cuda")
    cpu = rt.LSTM(16, 32, num_layers=2)
    cpu.load_state_dict(gpu.state_dict())
    ref = torch.nn.LSTM(16, 32, num_layers=2, dtype=torch.float64)
    ref.load_state_dict({k: v.double().cpu() for k, v in gpu.state_dict().items()})
    x = torch.randn(20, 4, 16, generator=torch.Generator().manual_seed(1))
    got = outputs_and_grads(gpu, x.cuda(), autocast=dtype)
    half_ref = outputs_and_grads(cpu, x, autocast=dtype)
    want = outputs_and_grads(ref, x.double())
    assert got[0].dtype == got[1].dtype == dtype and all(p.grad.dtype == torch.float32 for p in gpu.parameters())
    assert engine_of(gpu).mode == "graph" and engine_of(gpu).torch_dtype == dtype
    for k, (a, b, c) in enumerate(zip(got, half_ref, want, strict=True)):
        assert rel(a, c) <= TOL[dtype], f"array {k}: {rel(a, c):.1e} from float64"
        assert rel(a, b) <= TOL[dtype], f"array {k}: {rel(a, b):.1e} from the CPU's {dtype}"


def test_autocast_training_agrees_with_cudnn_under_autocast():
    """A few AdamW steps under bf16 autocast: rnngraph's losses track cuDNN's within the bf16 bound."""
    import rnngraph.torch as rt
    dev, losses = torch.device("cuda"), {}
    for name in ("cudnn", "rnngraph"):
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(32, 64) if name == "cudnn" else rt.LSTM(32, 64)
        model = torch.nn.ModuleList([lstm, torch.nn.Linear(64, 5)]).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g, run = torch.Generator().manual_seed(1), []
        for _ in range(6):
            x, t = torch.randn(16, 8, 32, generator=g).to(dev), torch.randint(0, 5, (16 * 8,), generator=g).to(dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model[1](model[0](x)[0]).reshape(-1, 5).float(), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses[name] = np.array(run)
    np.testing.assert_allclose(losses["rnngraph"], losses["cudnn"], rtol=3e-2)


def test_cublas_tf32_option_rounds_float32_products_to_tf32():
    import cupy

    from rnngraph.run.backends.cuda.cublas import Cublas
    blas = Cublas(cupy)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((256, 512)).astype("float32"), rng.standard_normal((384, 512)).astype("float32")
    want, errors = x.astype("float64") @ w.T.astype("float64"), {}     # the exact product of the float32 inputs
    for tf32 in (False, True):
        blas.tf32 = tf32
        out = cupy.empty((256, 384), "float32")
        blas.nt(cupy.asarray(x), cupy.asarray(w), out)
        errors[tf32] = float(np.linalg.norm(cupy.asnumpy(out) - want) / np.linalg.norm(want))
    assert errors[False] < 1e-6 and 1e-5 < errors[True] < 5e-3, errors


def test_tf32_follows_torch_s_flags():
    """The LSTM follows cuDNN's flag (as torch.nn.LSTM does), a user cell the matmul flag; each setting has its
    own engine, so recordings never mix; TF32 moves the result by TF32's error, and only then."""
    import rnngraph.torch as rt
    dev = torch.device("cuda")
    torch.manual_seed(0)
    lstm = rt.LSTM(256, 256, device=dev)
    ref = torch.nn.LSTM(256, 256, dtype=torch.float64)
    ref.load_state_dict({k: v.double().cpu() for k, v in lstm.state_dict().items()})
    x = torch.randn(32, 16, 256, generator=torch.Generator().manual_seed(1))
    want = ref(x.double())[0]
    out = []
    for flag in (False, True, False):
        torch.backends.cudnn.allow_tf32 = flag
        torch.backends.cuda.matmul.allow_tf32 = not flag        # not the LSTM's flag
        with torch.no_grad():
            out.append(lstm(x.to(dev))[0])
    assert [k[2] for k in lstm._engines] == [False, True]
    assert [e.backend.blas.tf32 for e in lstm._engines.values()] == [False, True]
    assert rel(out[0], want) < 1e-5 < rel(out[1], want) < 1e-2
    assert torch.equal(out[2], out[0])                          # back on the fp32 engine, its own recordings
    mgu = rt.Recurrent("mgu", 64, 64, device=dev)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
    mgu(torch.zeros(3, 2, 64, device=dev))
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, True
    mgu(torch.zeros(3, 2, 64, device=dev))
    assert [k[2] for k in mgu._engines] == [False, True]


@pytest.mark.parametrize("B", [2, 16], ids=["B2", "B16"])
def test_proj_size_equals_cudnn(B):
    import rnngraph.torch as rt
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ref = torch.nn.LSTM(6, 32, num_layers=2, bidirectional=True, proj_size=8).to(dev)
    ours = rt.LSTM(6, 32, num_layers=2, bidirectional=True, proj_size=8, device=dev)
    ours.load_state_dict(ref.state_dict())
    g = torch.Generator().manual_seed(1)
    for _ in range(2):                                  # the second call replays
        x = torch.randn(12, B, 6, generator=g).to(dev)
        hx = (torch.randn(4, B, 8, generator=g).to(dev), torch.randn(4, B, 32, generator=g).to(dev))
        for k, (a, b) in enumerate(zip(outputs_and_grads(ours, x, hx), outputs_and_grads(ref, x, hx), strict=True)):
            assert rel(a, b) <= TOL[torch.float32], f"B={B}: array {k} differs by {rel(a, b):.1e}"


def test_steps_replay_one_recording_each(monkeypatch):
    import rnngraph.torch as rt
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ref = torch.nn.LSTMCell(32, 64).to(dev)
    cell = rt.LSTMCell(32, 64, device=dev)
    cell.load_state_dict(ref.state_dict())
    xs = torch.randn(12, 2, 32, generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.no_grad():
        state, ref_state = cell(xs[0]), ref(xs[0])
        for t in (1, 2):                                # the recordings are made
            state, ref_state = cell(xs[t], state), ref(xs[t], ref_state)
        engine = engine_of(cell)
        graphs, replays = engine.backend.graphs, []
        made = graphs.info()["graphs"]
        real = graphs.run
        monkeypatch.setattr(graphs, "run", lambda key, fn: (replays.append(key), real(key, fn))[1])
        for t in range(3, 12):
            state, ref_state = cell(xs[t], state), ref(xs[t], ref_state)
            assert all(rel(a, b) <= TOL[torch.float32] for a, b in zip(state, ref_state)), t
    assert engine.mode == "graph" and engine._stack.runs[0][0].ex.whole_capture
    assert len(replays) == 9 and len(set(replays)) == 1     # one replay of one recording per step
    assert graphs.info()["graphs"] == made


def test_a_stepped_loop_with_autograd_equals_one_call():
    import rnngraph.torch as rt
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = rt.GRU(8, 16, num_layers=2, device=dev)
    x = torch.randn(10, 3, 8, device=dev)
    grads = []
    for stepping in (True, False):
        model.zero_grad()
        xx = x.clone().requires_grad_()
        if stepping:
            h, ys = None, []
            for t in range(10):
                y, h = model.step(xx[t], h)
                ys.append(y)
            y = torch.stack(ys)
        else:
            y, h = model(xx)
        (y.pow(2).sum() + h.sum()).backward()
        grads.append([y, h, xx.grad, *(p.grad for p in model.parameters())])
    assert all(rel(a, b) <= TOL[torch.float32] for a, b in zip(*grads))


def test_the_model_benchmark_runs_and_agrees_with_cudnn(tmp_path):
    from rnngraph.lab.bench_model import IMPLS
    from rnngraph.lab.cli import main
    path = tmp_path / "model.json"
    rc = main(["bench", "--model", "charlm", "-T", "32", "-B", "1,16", "-H", "64", "--repeats", "4", "--warmup", "3",
               "--json", str(path)])
    assert path.exists(), f"the benchmark stopped (exit {rc}) before writing its results"
    ran = [r for r in json.loads(path.read_text())["results"] if "ms_per_step" in r]
    assert {r["impl"] for r in ran} == set(IMPLS) and {r["precision"] for r in ran} == {"fp32", "bf16"}
    bad = [(r["impl"], r["B"], r["precision"], r["loss_diff"]) for r in ran if not r["losses_agree"]]
    assert not bad and all(r["reference"] == "torch" for r in ran)
    assert rc == 0
