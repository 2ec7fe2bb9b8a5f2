"""rnngraph.torch on CUDA tensors: equal to torch.nn (cuDNN, TF32 off) in float32, zero-copy DLPack views,
a non-default torch stream, and graph-mode replays that see a torch optimiser's in-place updates."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
TOL = 1e-4          # float32, relative


@pytest.fixture(autouse=True)
def no_tf32():
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def rel(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / max(b.norm(), 1e-30))


def step(model, x, h0):
    """Outputs, final states and every gradient of one forward and backward."""
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    y, state = model(x, h0)
    states = state if isinstance(state, tuple) else (state,)
    (y.pow(2).sum() + sum(s.sum() for s in states)).backward()
    return [y, *states, x.grad, *(p.grad for _, p in sorted(model.named_parameters()))]


@pytest.mark.parametrize("mode", ["staged", "graph"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_equals_torch_nn_on_cuda(kind, mode):
    import rnngraph.torch as rt
    dev = torch.device("cuda")
    ref = getattr(torch.nn, kind)(6, 16, num_layers=2, bidirectional=True).to(dev)
    ours = getattr(rt, kind)(6, 16, num_layers=2, bidirectional=True, mode=mode, device=dev)
    ours.load_state_dict(ref.state_dict())
    g = torch.Generator(device="cpu").manual_seed(0)
    for _ in range(2):           # graph mode: the second call replays
        x = torch.randn(9, 3, 6, generator=g).to(dev)
        h0 = torch.randn(4, 3, 16, generator=g).to(dev)
        h0 = (h0, h0 * 0.5) if kind == "LSTM" else h0
        for k, (a, b) in enumerate(zip(step(ours, x, h0), step(ref, x, h0), strict=True)):
            assert rel(a, b) <= TOL, f"{kind}/{mode}: array {k} relative error {rel(a, b):.1e}"


def test_views_share_memory_both_ways():
    import cupy

    from rnngraph.torch.autograd import to_array, to_tensor
    t = torch.arange(12.0, device="cuda").reshape(3, 4)
    a = to_array(t)
    assert isinstance(a, cupy.ndarray) and a.data.ptr == t.data_ptr()
    b = cupy.arange(6, dtype=cupy.float32)
    assert to_tensor(b, t.device).data_ptr() == b.data.ptr
    base = torch.arange(2 * 5 * 6, dtype=torch.float64, device="cuda").reshape(2, 5, 6)
    for view in (base.transpose(0, 1), base[:, 1:, ::2], base[1], base[:, :0]):     # strides, offsets, empty
        a = to_array(view)
        assert a.shape == tuple(view.shape) and a.dtype == cupy.float64
        np.testing.assert_array_equal(cupy.asnumpy(a), view.cpu().numpy())
        if view.numel():
            assert a.data.ptr == view.data_ptr()
            a[(0,) * a.ndim] = -1.0                 # written through: the same memory
            assert float(view[(0,) * view.dim()]) == -1.0


def test_a_non_default_torch_stream():
    import rnngraph.torch as rt
    dev = torch.device("cuda")
    model = rt.LSTM(6, 16, mode="graph", device=dev)
    x = torch.randn(20, 2, 6, device=dev)
    want = step(model, x, None)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = step(model, x, None)
        got = [g.clone() for g in got]
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for a, b in zip(got, want, strict=True):
        assert rel(a, b) <= 1e-6     # the same kernels; parameter-gradient sums add atomically


def test_graph_replays_see_optimiser_updates():
    """The same training run in graph mode and in staged mode: every step's loss agrees, so the replays
    read the parameters AdamW updated in place."""
    import rnngraph.torch as rt
    dev = torch.device("cuda")
    runs = {}
    for mode in ("staged", "graph"):
        torch.manual_seed(0)
        model = rt.Recurrent("mgu", 6, 16, mode=mode, device=dev)
        head = torch.nn.Linear(16, 3).to(dev)
        opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-2)
        g = torch.Generator(device="cpu").manual_seed(1)
        losses = []
        for _ in range(5):
            x, target = torch.randn(12, 4, 6, generator=g).to(dev), torch.randint(0, 3, (12 * 4,), generator=g).to(dev)
            loss = torch.nn.functional.cross_entropy(head(model(x)[0]).reshape(-1, 3), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs[mode] = np.array(losses)
    assert len(set(runs["graph"])) == 5
    np.testing.assert_allclose(runs["graph"], runs["staged"], rtol=1e-5)
