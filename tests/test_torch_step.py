"""Stepping with autograd in float64 on the CPU: rnngraph.torch.LSTMCell/GRUCell/RNNCell equal
torch.nn's cells (names, initialisation, outputs, every gradient; batched, unbatched, no hx, no bias), and
Recurrent.step over T frames equals one call over T frames in outputs, states and gradients, also in a loop
that feeds each output back as the next input."""
import pytest

torch = pytest.importorskip("torch")
import rnngraph.torch as rt  # noqa: E402
from rnngraph import RnnGraphError  # noqa: E402
from torch_cases import F64, as_tuple, assert_same, mgu_cell, randn, weighted_loss  # noqa: E402

CELLS = {"LSTMCell": {}, "GRUCell": {}, "RNNCell": {}, "RNNCell-relu": {"nonlinearity": "relu"}}


def cell_pair(kind, *args, **kw):
    name, extra = kind.split("-")[0], CELLS[kind]
    torch.manual_seed(7)
    ref = getattr(torch.nn, name)(*args, **kw, **extra, dtype=F64)
    torch.manual_seed(7)
    ours = getattr(rt, name)(*args, **kw, **extra, dtype=F64)
    return ref, ours


@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_cells_have_torch_s_names_shapes_and_initialisation(kind, bias):
    ref, ours = cell_pair(kind, 3, 5, bias=bias)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    assert_same(list(ours.parameters()), list(ref.parameters()), rtol=0)
    assert repr(ours) == repr(ref)
    ours.load_state_dict(ref.state_dict())


def cell_run(cell, x, hx):
    """Outputs, x.grad, hx grads and every parameter grad of one call under a weighted loss."""
    for p in cell.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    hx = None if hx is None else tuple(h.detach().clone().requires_grad_() for h in hx)
    arg = None if hx is None else hx if len(hx) > 1 else hx[0]
    out = as_tuple(cell(x, arg))
    weighted_loss(out[0], out[1:]).backward()
    return [*out, x.grad, *(() if hx is None else (h.grad for h in hx)), *(p.grad for p in cell.parameters())]


@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("layout", ["batched", "unbatched", "no_hx"])
def test_cells_equal_torch_s(kind, layout):
    ref, ours = cell_pair(kind, 3, 5)
    n = 2 if kind == "LSTMCell" else 1
    batch = () if layout == "unbatched" else (4,)
    x = randn(*batch, 3, seed=1)
    hx = None if layout == "no_hx" else tuple(randn(*batch, 5, seed=2 + k) for k in range(n))
    got, want = cell_run(ours, x, hx), cell_run(ref, x, hx)
    assert_same(got, want)


def test_cell_errors_are_clear():
    cell = rt.LSTMCell(3, 4, dtype=F64)
    with pytest.raises(RnnGraphError, match=r"LSTMCell takes one frame \[B, 3\] or \[3\], got \[5, 2, 3\]"):
        cell(torch.zeros(5, 2, 3, dtype=F64))
    with pytest.raises(RnnGraphError, match=r"h must be \[B, 4\] for input \[B, 3\]"):
        cell(torch.zeros(2, 3, dtype=F64), (torch.zeros(1, 2, 4, dtype=F64), torch.zeros(2, 4, dtype=F64)))
    with pytest.raises(RnnGraphError, match="nonlinearity"):
        rt.RNNCell(3, 4, nonlinearity="gelu")


def unrolled(model, x, states, stepping: bool):
    """Outputs, final states and the gradients of x, the initial states and every parameter, of one call over
    x [T, B, D] or of T steps."""
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    hs = tuple(s.detach().clone().requires_grad_() for s in states)
    hx = hs if len(hs) > 1 else hs[0]
    if stepping:
        ys, state = [], hx
        for t in range(x.shape[0]):
            y_t, state = model.step(x[t], state)
            ys.append(y_t)
        y = torch.stack(ys)
    else:
        y, state = model(x, hx)
    weighted_loss(y, as_tuple(state)).backward()
    return [y, *as_tuple(state), x.grad, *(h.grad for h in hs), *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("cell, layers", [("lstm", 2), ("gru", 1), (mgu_cell, 2)], ids=["lstm_2layer", "gru", "mgu"])
def test_steps_equal_one_call_in_outputs_states_and_gradients(cell, layers):
    torch.manual_seed(0)
    model = rt.Recurrent(cell, 3, 4, num_layers=layers, dtype=F64)
    states = tuple(randn(layers, 2, 4, seed=2 + k) for k in range(len(model.state_names)))
    x = randn(5, 2, 3, seed=1)
    assert_same(unrolled(model, x, states, stepping=True), unrolled(model, x, states, stepping=False))


def test_unbatched_step_and_a_projected_lstm():
    torch.manual_seed(0)
    model = rt.LSTM(3, 5, num_layers=2, proj_size=2, dtype=F64)
    x, h0, c0 = randn(4, 3, seed=1), randn(2, 2, seed=2), randn(2, 5, seed=3)
    y, (h, c) = model(x, (h0, c0))
    state, ys = (h0, c0), []
    for t in range(4):
        y_t, state = model.step(x[t], state)
        ys.append(y_t)
    assert ys[0].shape == (2,) and state[0].shape == (2, 2) and state[1].shape == (2, 5)
    assert_same([torch.stack(ys), *state], [y, h, c])


def test_a_loop_that_feeds_outputs_back_equals_torch_s():
    """Generation-style: each step's input is a function of the previous output; gradients flow through it."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(4, 4, num_layers=2, dtype=F64)
    ours = rt.LSTM(4, 4, num_layers=2, dtype=F64)
    ours.load_state_dict(ref.state_dict())
    back = torch.nn.Linear(4, 4, dtype=F64)
    results = []
    for model in (ours, ref):
        model.zero_grad()
        back.zero_grad()
        x, state, total = randn(3, 4, seed=1).requires_grad_(), None, 0.0
        inp = x
        for t in range(6):
            if model is ref:
                y, state = model(inp[None], state)
                y = y[0]
            else:
                y, state = model.step(inp, state)
            total = total + weighted_loss(y, (), seed=20 + t)
            inp = torch.tanh(back(y))
        total.backward()
        results.append([total, x.grad, back.weight.grad, *(p.grad for p in model.parameters())])
    assert_same(*results)


def test_step_errors_are_clear():
    with pytest.raises(RnnGraphError, match="bidirectional layer also reads the frames after it"):
        rt.GRU(3, 4, bidirectional=True, dtype=F64).step(torch.zeros(2, 3, dtype=F64))
    with pytest.raises(RnnGraphError, match=r"step\(\) takes one frame \[B, 3\] or \[3\], got shape \[5, 2, 3\]"):
        rt.GRU(3, 4, dtype=F64).step(torch.zeros(5, 2, 3, dtype=F64))
