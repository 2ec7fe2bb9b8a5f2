"""rnngraph.torch on the CPU in float64: the same numbers as torch.nn's layers, autograd (gradcheck), a
training run, state dicts both ways, and the edges (packed and unbatched input, a second call before
backward, second-order gradients, mismatched inputs, torch.compile)."""
import pytest

torch = pytest.importorskip("torch")
import rnngraph  # noqa: E402
import rnngraph.torch as rt  # noqa: E402
from rnngraph import RnnGraphError  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

F64 = torch.float64
KINDS = {"LSTM": {}, "GRU": {}, "RNN": {}, "RNN-relu": {"nonlinearity": "relu"}}


def pair(kind, *args, **kw):
    """(torch.nn layer, rnngraph.torch layer) with the same float64 weights."""
    name, extra = kind.split("-")[0], KINDS[kind]
    ref = getattr(torch.nn, name)(*args, **kw, **extra, dtype=F64)
    ours = getattr(rt, name)(*args, **kw, **extra, dtype=F64)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def run(model, x, h0, lengths=None):
    """Output, final states, and the gradients of x, h0 and every parameter of a fixed loss; x packed
    (unsorted) with `lengths` when given."""
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    hs = None if h0 is None else tuple(h.detach().clone().requires_grad_() for h in h0)
    inp = x if lengths is None else pack_padded_sequence(x, lengths, enforce_sorted=False)
    y, state = model(inp, hs if hs is None or len(hs) > 1 else hs[0])
    states = state if isinstance(state, tuple) else (state,)
    data = y.data if isinstance(y, torch.nn.utils.rnn.PackedSequence) else y
    (data.pow(2).sum() + sum((s * (k + 1)).sum() for k, s in enumerate(states))).backward()
    return [data, *states, x.grad, *(h.grad for h in hs or ()), *(p.grad for _, p in sorted(model.named_parameters()))]


def assert_same(a_list, b_list, rtol=1e-10):
    for k, (a, b) in enumerate(zip(a_list, b_list, strict=True)):
        scale = max(b.abs().max().item(), 1e-300)
        assert (a - b).abs().max().item() <= rtol * scale, f"array {k}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", ["time_major", "batch_first", "unbatched"])
def test_equals_torch_nn(kind, layout):
    ref, ours = pair(kind, 3, 5, num_layers=2, bidirectional=True, batch_first=layout == "batch_first")
    g = torch.Generator().manual_seed(0)
    shape = {"time_major": (6, 4, 3), "batch_first": (4, 6, 3), "unbatched": (6, 3)}[layout]
    x = torch.randn(*shape, generator=g, dtype=F64)
    n = 2 if kind == "LSTM" else 1
    h0 = tuple(torch.randn(4, *(() if layout == "unbatched" else (4,)), 5, generator=g, dtype=F64) for _ in range(n))
    for init in (None, h0):
        assert_same(run(ours, x, init), run(ref, x, init))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_packed_sequences_in_and_out(kind):
    ref, ours = pair(kind, 3, 5, num_layers=2, bidirectional=True)
    x = torch.randn(7, 4, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    packed = pack_padded_sequence(x, torch.tensor([5, 7, 2, 5]), enforce_sorted=False)
    got, want = ours(packed)[0], ref(packed)[0]
    assert isinstance(got, torch.nn.utils.rnn.PackedSequence)
    for field in ("batch_sizes", "sorted_indices", "unsorted_indices"):
        assert torch.equal(getattr(got, field), getattr(want, field))
    h0 = tuple(torch.randn(4, 4, 5, dtype=F64) for _ in range(2 if kind == "LSTM" else 1))
    for init in (None, h0):
        assert_same(run(ours, x, init, torch.tensor([5, 7, 2, 5])), run(ref, x, init, torch.tensor([5, 7, 2, 5])))


def mgu(input_size, hidden_size):
    c = rnngraph.Cell("test_mgu")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    f = c.sigmoid(c.linear(x, "W_f", hidden_size, bias="b_f") + c.linear(h, "U_f", hidden_size))
    n = c.tanh(c.linear(x, "W_n", hidden_size, bias="b_n") + c.linear(f * h, "U_n", hidden_size))
    c.output(c.bind(h, (1 - f) * h + f * n, name="h"))
    return c.build()


@pytest.mark.parametrize("cell, layers, bidirectional", [("lstm", 1, False), ("gru", 2, True), (mgu, 1, True)])
@pytest.mark.parametrize("with_state", [False, True])
def test_gradcheck(cell, layers, bidirectional, with_state):
    """torch.autograd.gradcheck through x, the initial states and every parameter (functional_call)."""
    model = rt.Recurrent(cell, 2, 3, layers, bidirectional=bidirectional, dtype=F64)
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 2, 2, generator=g, dtype=F64, requires_grad=True)
    K = layers * (2 if bidirectional else 1)
    states = tuple(torch.randn(K, 2, 3, generator=g, dtype=F64, requires_grad=True)
                   for _ in model.state_names) if with_state else ()
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())

    def f(x, *rest):
        hs, ps = rest[:len(states)], rest[len(states):]
        hx = None if not hs else hs[0] if len(hs) == 1 else hs
        y, state = torch.func.functional_call(model, dict(zip(names, ps)), (x, hx))
        return (y, *(state if isinstance(state, tuple) else (state,)))
    assert torch.autograd.gradcheck(f, (x, *states, *params), eps=1e-6, atol=1e-8)


def test_training_with_adam_gives_torch_s_losses():
    def losses(lstm_cls):
        torch.manual_seed(0)
        emb, head = torch.nn.Embedding(20, 4, dtype=F64), torch.nn.Linear(6, 20, dtype=F64)
        lstm = lstm_cls(4, 6, num_layers=2, dtype=F64)
        torch.manual_seed(1)
        lstm.reset_parameters()
        params = [*emb.parameters(), *lstm.parameters(), *head.parameters()]
        opt, g, out = torch.optim.Adam(params, lr=1e-2), torch.Generator().manual_seed(3), []
        for _ in range(20):
            tokens = torch.randint(0, 20, (9, 3), generator=g)
            loss = torch.nn.functional.cross_entropy(head(lstm(emb(tokens[:-1]))[0]).reshape(-1, 20),
                                                     tokens[1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            out.append(loss.item())
        return torch.tensor(out, dtype=F64)
    ours, ref = losses(rt.LSTM), losses(torch.nn.LSTM)
    assert_same([ours], [ref]) and ours[-1] < ours[0]


def test_state_dicts_load_both_ways_in_torch_s_order():
    ref, ours = pair("LSTM", 3, 5, num_layers=2, bidirectional=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    back = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True, dtype=F64)
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(1.5)
    back.load_state_dict(ours.state_dict())
    x = torch.randn(4, 2, 3, dtype=F64)
    assert_same([back(x)[0]], [ours(x)[0]])


def test_two_calls_before_one_backward_with_dropout():
    """The first call's forward runs again before its backward, with its own dropout masks."""
    torch.manual_seed(0)
    x1, x2 = (torch.randn(5, 2, 3, dtype=F64) for _ in range(2))

    def grads(together: bool):
        model = rt.LSTM(3, 4, num_layers=2, dropout=0.5, dtype=F64, seed=7)
        with torch.no_grad():
            for k, p in enumerate(model.parameters()):
                p.copy_(torch.linspace(-0.5, 0.5, p.numel(), dtype=F64).reshape(p.shape) * (k + 1) / 8)
        if together:
            (model(x1)[0].sum() + 2 * model(x2)[0].sum()).backward()
        else:
            model(x1)[0].sum().backward()
            (2 * model(x2)[0].sum()).backward()
        return [p.grad for p in model.parameters()]
    assert_same(grads(True), grads(False))


def test_second_order_gradients_are_refused():
    model = rt.GRU(3, 4, dtype=F64)
    x = torch.randn(5, 2, 3, dtype=F64, requires_grad=True)
    (gx,) = torch.autograd.grad(model(x)[0].pow(2).sum(), x, create_graph=False)
    with pytest.raises(RuntimeError, match="second-order gradients"):
        torch.autograd.grad(model(x)[0].pow(2).sum(), x, create_graph=True)


def test_mismatches_are_one_clear_error():
    model = rt.LSTM(3, 4)
    with pytest.raises(RnnGraphError, match=r"the input is torch.float64 on cpu but the parameters are torch.float32"):
        model(torch.zeros(5, 2, 3, dtype=F64))
    with pytest.raises(RnnGraphError, match=r"takes 2 initial state tensor\(s\) \(h0, c0\), got 1"):
        model(torch.zeros(5, 2, 3), torch.zeros(1, 2, 4))
    with pytest.raises(RnnGraphError, match="proj_size"):
        rt.LSTM(3, 4, proj_size=2)
    model.double().flatten_parameters()
    assert model(torch.zeros(5, 2, 3, dtype=F64))[0].dtype == F64       # rebound to the new memory


def test_torch_compile_runs_the_layer_as_an_opaque_call():
    model = rt.LSTM(3, 4, dtype=F64)
    head = torch.nn.Linear(4, 2, dtype=F64)

    def f(x):
        return head(model(x)[0]).relu().sum()
    x = torch.randn(5, 2, 3, dtype=F64, requires_grad=True)
    want = f(x)
    want.backward()
    gx, x.grad = x.grad.clone(), None
    got = torch.compile(f, backend="eager")(x)
    got.backward()
    assert_same([got, x.grad], [want, gx])


def test_distributed_data_parallel_on_the_cpu():
    """DDP (gloo, one process) wraps the module like any other: the same gradients as without it."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        x = torch.randn(5, 2, 3, dtype=F64)
        plain = rt.LSTM(3, 4, dtype=F64)
        wrapped = rt.LSTM(3, 4, dtype=F64)
        wrapped.load_state_dict(plain.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(wrapped)
        plain(x)[0].pow(2).sum().backward()
        ddp(x)[0].pow(2).sum().backward()
        assert_same([p.grad for p in wrapped.parameters()], [p.grad for p in plain.parameters()])
    finally:
        dist.destroy_process_group()
