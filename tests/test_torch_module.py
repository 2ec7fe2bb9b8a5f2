"""rnngraph.torch's modules on the CPU in float64: gradcheck through inputs, states and parameters
(functional_call); the same numbers as torch.nn.LSTM/GRU/RNN in outputs, states and every gradient;
a training run; state dicts both ways; dtype changes, train/eval and dropout; several calls before one
backward (the recompute path); second-order gradients refused; clear errors; DDP (gloo, one process).
It found three bugs, fixed since: a recomputed forward used the latest call's parameters, a module
could not be deep-copied after a call, all_weights mis-grouped user-cell names containing '_l'."""
import copy
import datetime
import socket

import pytest

torch = pytest.importorskip("torch")
import rnngraph  # noqa: E402
import rnngraph.torch as rt  # noqa: E402
from rnngraph.errors import RnnGraphError  # noqa: E402
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence  # noqa: E402

F64 = torch.float64
KINDS = {"LSTM": {}, "GRU": {}, "RNN": {}, "RNN-relu": {"nonlinearity": "relu"}}


# -- helpers ------------------------------------------------------------------------------------
def pair(kind, *args, **kw):
    """(torch.nn layer, rnngraph.torch layer) of `kind`, float64, the same weights (torch's copied in)."""
    name, extra = kind.split("-")[0], KINDS[kind]
    ref = getattr(torch.nn, name)(*args, **kw, **extra, dtype=F64)
    ours = getattr(rt, name)(*args, **kw, **extra, dtype=F64)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def n_states(kind) -> int:
    return 2 if kind.startswith("LSTM") else 1


def as_tuple(state):
    return state if isinstance(state, tuple) else (state,)


def as_hx(states):
    """A tuple of state tensors as the module's hx argument: None, one tensor, or the tuple."""
    if not states:
        return None
    return states[0] if len(states) == 1 else tuple(states)


def weighted_loss(y, states, seed=11):
    """A loss that weighs every element of y and of every final state differently (fixed weights)."""
    g = torch.Generator().manual_seed(seed)
    total = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum()
    for s in states:
        total = total + (s * torch.randn(s.shape, generator=g, dtype=s.dtype)).sum()
    return total


def run(model, x, states=(), lengths=None, batch_first=False):
    """Forward and backward of weighted_loss: [output data, final states..., x.grad, state grads...,
    parameter grads in parameters() order], plus the output itself (PackedSequence or tensor)."""
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    hs = tuple(s.detach().clone().requires_grad_() for s in states)
    inp = x if lengths is None else pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    y, state_n = model(inp, as_hx(hs))
    finals = as_tuple(state_n)
    data = y.data if isinstance(y, PackedSequence) else y
    weighted_loss(data, finals).backward()
    return [data, *finals, x.grad, *(h.grad for h in hs), *(p.grad for p in model.parameters())], y


def assert_same(got, want, rtol=1e-10, what="tensor"):
    """Every pair equal to rtol relative to the reference's largest magnitude (shapes too)."""
    assert len(got) == len(want), f"{len(got)} {what}s, expected {len(want)}"
    for k, (a, b) in enumerate(zip(got, want)):
        assert a is not None and b is not None, f"{what} {k}: {a is None=} {b is None=}"
        assert a.shape == b.shape, f"{what} {k}: shape {tuple(a.shape)}, expected {tuple(b.shape)}"
        scale = max(b.abs().max().item(), 1e-12) if b.numel() else 1.0
        err = (a - b).abs().max().item() if b.numel() else 0.0
        assert err <= rtol * scale, f"{what} {k}: max |diff| {err:.3g} > {rtol:g} x {scale:.3g}"


def mgu_cell(input_size, hidden_size):
    """A user cell no library ships as such: a minimal gated unit built with rnngraph.Cell."""
    c = rnngraph.Cell("test_user_mgu")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    f = c.sigmoid(c.linear(x, "W_f", hidden_size, bias="b_f") + c.linear(h, "U_f", hidden_size))
    n = c.tanh(c.linear(x, "W_n", hidden_size, bias="b_n") + c.linear(f * h, "U_n", hidden_size))
    c.output(c.bind(h, (1 - f) * h + f * n, name="h"))
    return c.build()


def delay_cell(input_size, hidden_size):
    """A user cell that reads its state two frames back (h.ago(2)) and has a diagonal weight."""
    c = rnngraph.Cell("test_user_delay")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    f = c.sigmoid(c.linear(x, "W_f", hidden_size, bias="b_f") + c.linear(h, "U_f", hidden_size)
                  + c.diag(h.ago(2), "p"))
    n = c.tanh(c.linear(x, "W_n", hidden_size) + c.linear(f * h, "U_n", hidden_size))
    c.output(c.bind(h, (1 - f) * h + f * n, name="h"))
    return c.build()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- 1. gradcheck through x, the initial states and every parameter --------------------------------
def gradcheck_module(model, x, states=(), lengths=None):
    """gradcheck of (x, *states, *params) -> (output, *final states), the parameters passed through
    torch.func.functional_call, so that gradcheck perturbs and differentiates them as inputs."""
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())
    x = x.detach().clone().requires_grad_()
    states = tuple(s.detach().clone().requires_grad_() for s in states)
    bf = model.batch_first

    def f(x, *rest):
        hs, ps = rest[:len(states)], rest[len(states):]
        inp = x if lengths is None else pack_padded_sequence(x, lengths, batch_first=bf, enforce_sorted=False)
        y, state_n = torch.func.functional_call(model, dict(zip(names, ps)), (inp, as_hx(hs)))
        return ((y.data if isinstance(y, PackedSequence) else y), *as_tuple(state_n))

    inputs = (x, *states, *params)
    # gradcheck would pass vacuously if functional_call did not reach the engine (the outputs would not
    # depend on `params`): every input must get a nonzero gradient, and the outputs must move with them.
    outs = f(*inputs)
    grads = torch.autograd.grad(sum(weighted_loss(o, ()) for o in outs), inputs)
    for k, g in enumerate(grads):
        assert g.abs().sum().item() > 0, f"input {k} of gradcheck got a zero gradient"
    scaled = f(x, *states, *(1.1 * p.detach() for p in params))
    assert (scaled[0] - outs[0]).abs().max().item() > 1e-6
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)
    # afterwards the module runs on its own parameters again (the engine is rebound on a data_ptr change)
    with torch.no_grad():
        own = model(x)[0]
        copies = {n: p.detach().clone() for n, p in model.named_parameters()}
        direct = torch.func.functional_call(model, copies, (x,))[0]
    assert_same([own], [direct], rtol=1e-14)


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize("cell, layers, bidirectional", [
    ("lstm", 1, False), ("gru", 1, False), (mgu_cell, 1, False), ("gru", 2, True), ("lstm", 2, True),
    (mgu_cell, 2, True)], ids=["lstm", "gru", "user_mgu", "gru_2layer_bidir", "lstm_2layer_bidir",
                               "user_mgu_2layer_bidir"])
@pytest.mark.parametrize("with_states", [False, True], ids=["no_h0", "h0"])
def test_gradcheck(cell, layers, bidirectional, with_states):
    torch.manual_seed(0)
    model = rt.Recurrent(cell, 2, 3, layers, bidirectional=bidirectional, dtype=F64)
    K = layers * (2 if bidirectional else 1)
    states = tuple(_randn(K, 2, 3, seed=10 + k) for k in range(len(model.state_names))) if with_states else ()
    gradcheck_module(model, _randn(4, 2, 2, seed=1), states)


def test_gradcheck_cellgraph_and_delay_cell():
    """A CellGraph passed directly, and a user cell reading h two frames back (its h0 and h_n are
    [2, L·dirs, B, S]; a [L·dirs, B, S] h0 means that value at every earlier frame)."""
    torch.manual_seed(0)
    gradcheck_module(rt.Recurrent(mgu_cell(2, 3), 2, 3, dtype=F64), _randn(4, 2, 2, seed=2), (_randn(1, 2, 3, seed=3),))
    model = rt.Recurrent(delay_cell, 2, 3, 1, bidirectional=True, dtype=F64)
    assert model(_randn(4, 2, 2, seed=2))[1].shape == (2, 2, 2, 3)
    gradcheck_module(model, _randn(4, 2, 2, seed=2), (_randn(2, 2, 2, 3, seed=4),))
    gradcheck_module(model, _randn(4, 2, 2, seed=2), (_randn(2, 2, 3, seed=5),))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("with_states", [False, True], ids=["no_h0", "h0"])
def test_gradcheck_batch_first(cell, with_states):
    torch.manual_seed(0)
    model = rt.Recurrent(cell, 2, 3, 1, batch_first=True, bidirectional=True, dtype=F64)
    states = tuple(_randn(2, 3, 3, seed=10 + k) for k in range(len(model.state_names))) if with_states else ()
    gradcheck_module(model, _randn(3, 4, 2, seed=1), states)


@pytest.mark.parametrize("cell, batch_first", [("lstm", False), ("gru", True), (mgu_cell, False)],
                         ids=["lstm", "gru_batch_first", "user_mgu"])
@pytest.mark.parametrize("with_states", [False, True], ids=["no_h0", "h0"])
def test_gradcheck_packed(cell, batch_first, with_states):
    """Packed input (enforce_sorted=False, unequal lengths): gradients through the padded x."""
    torch.manual_seed(0)
    model = rt.Recurrent(cell, 2, 3, 1, batch_first=batch_first, bidirectional=True, dtype=F64)
    x = _randn(*((3, 5) if batch_first else (5, 3)), 2, seed=1)
    states = tuple(_randn(2, 3, 3, seed=10 + k) for k in range(len(model.state_names))) if with_states else ()
    gradcheck_module(model, x, states, lengths=torch.tensor([3, 5, 2]))


# -- 2. the same numbers as torch.nn.LSTM / GRU / RNN ----------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", [{}, {"num_layers": 2, "bidirectional": True}], ids=["1layer", "2layer_bidir"])
@pytest.mark.parametrize("layout", ["time_major", "batch_first", "unbatched"])
def test_equals_torch_nn(kind, config, layout):
    ref, ours = pair(kind, 3, 4, batch_first=layout == "batch_first", **config)
    K = config.get("num_layers", 1) * (2 if config.get("bidirectional") else 1)
    shape = {"time_major": (6, 3, 3), "batch_first": (3, 6, 3), "unbatched": (6, 3)}[layout]
    batch = () if layout == "unbatched" else (3,)
    x = _randn(*shape, seed=1)
    h0 = tuple(_randn(K, *batch, 4, seed=2 + k) for k in range(n_states(kind)))
    for states in ((), h0):
        got, y = run(ours, x, states)
        want, y_ref = run(ref, x, states)
        assert y.shape == y_ref.shape
        assert_same(got, want)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_equals_torch_nn_without_bias(kind):
    ref, ours = pair(kind, 3, 4, num_layers=2, bias=False, bidirectional=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    x = _randn(5, 2, 3, seed=1)
    h0 = tuple(_randn(4, 2, 4, seed=2 + k) for k in range(n_states(kind)))
    assert_same(run(ours, x, h0)[0], run(ref, x, h0)[0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
def test_packed_sequence_equals_torch_nn(kind, batch_first):
    ref, ours = pair(kind, 3, 4, num_layers=2, bidirectional=True, batch_first=batch_first)
    x = _randn(*((3, 6) if batch_first else (6, 3)), 3, seed=1)
    lengths = torch.tensor([4, 6, 2])
    h0 = tuple(_randn(4, 3, 4, seed=2 + k) for k in range(n_states(kind)))
    for states in ((), h0):
        got, y = run(ours, x, states, lengths, batch_first)
        want, y_ref = run(ref, x, states, lengths, batch_first)
        assert isinstance(y, PackedSequence)
        for field in ("batch_sizes", "sorted_indices", "unsorted_indices"):
            assert torch.equal(getattr(y, field), getattr(y_ref, field)), field
        assert_same(got, want)


def test_packed_sequence_enforce_sorted():
    """A PackedSequence made with enforce_sorted=True (sorted_indices None) comes back the same way."""
    ref, ours = pair("GRU", 3, 4, bidirectional=True)
    x = _randn(5, 3, 3, seed=1)
    packed = pack_padded_sequence(x, torch.tensor([5, 3, 1]))
    (y, h), (y_ref, h_ref) = ours(packed), ref(packed)
    assert isinstance(y, PackedSequence) and y.sorted_indices is None and y.unsorted_indices is None
    assert torch.equal(y.batch_sizes, y_ref.batch_sizes)
    assert_same([y.data, h], [y_ref.data, h_ref])


@pytest.mark.parametrize("used", ["y", "h_n", "c_n"])
def test_gradient_of_one_output_only(used):
    """Only one of y, h_n, c_n reaches the loss (the others' gradients arrive as None)."""
    ref, ours = pair("LSTM", 3, 4, num_layers=2, bidirectional=True)
    x = _randn(5, 2, 3, seed=1)
    results = []
    for model in (ours, ref):
        model.zero_grad()
        xx = x.clone().requires_grad_()
        y, (h, c) = model(xx)
        {"y": y, "h_n": h, "c_n": c}[used].pow(2).sum().backward()      # y.sum()-style stride-0 grads too
        results.append([xx.grad, *(p.grad for p in model.parameters())])
    assert_same(*results)


def test_builtin_names_module_function_and_cellgraph_agree():
    """The same cell given as a built-in name, 'module:function', a function and a CellGraph."""
    from rnngraph.ir import cells
    x = _randn(5, 2, 3, seed=1)
    outs = []
    for spec in ("mgu", "rnngraph.ir.cells:mgu", cells.mgu, cells.mgu(3, 4)):
        torch.manual_seed(3)
        model = rt.Recurrent(spec, 3, 4, dtype=F64)
        outs.append(run(model, x, (_randn(1, 2, 4, seed=2),))[0])
    for other in outs[1:]:
        assert_same(other, outs[0], rtol=0)


def test_initialisation_follows_torch_s_generator():
    torch.manual_seed(5)
    ref = torch.nn.LSTM(3, 4, 2, bidirectional=True, dtype=F64)
    torch.manual_seed(5)
    ours = rt.LSTM(3, 4, 2, bidirectional=True, dtype=F64)
    assert_same(list(ours.parameters()), list(ref.parameters()), rtol=0)


# -- 3. a small model trained with Adam and clip_grad_norm_ ---------------------------------------
class Tagger(torch.nn.Module):
    def __init__(self, lstm_cls):
        super().__init__()
        self.emb = torch.nn.Embedding(12, 4, dtype=F64)
        self.lstm = lstm_cls(4, 5, num_layers=2, bidirectional=True, dtype=F64)
        self.head = torch.nn.Linear(10, 12, dtype=F64)

    def forward(self, tokens):
        return self.head(self.lstm(self.emb(tokens))[0])


def train_losses(lstm_cls, steps=20):
    torch.manual_seed(0)
    template = Tagger(torch.nn.LSTM)
    model = Tagger(lstm_cls)
    model.load_state_dict(template.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    g, losses = torch.Generator().manual_seed(4), []
    for _ in range(steps):
        tokens = torch.randint(0, 12, (6, 3), generator=g)
        loss = torch.nn.functional.cross_entropy(model(tokens[:-1]).reshape(-1, 12), tokens[1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), list(model.parameters())


def test_training_with_adam_and_clipping_gives_torch_s_losses():
    (ours, p_ours), (ref, p_ref) = train_losses(rt.LSTM), train_losses(torch.nn.LSTM)
    assert_same([ours], [ref], what="loss curve")
    assert_same(p_ours, p_ref, rtol=1e-9, what="trained parameter")
    assert ours[-5:].mean() < ours[:5].mean()


# -- 4. state dicts both ways --------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_round_trips_both_ways(kind):
    ref, ours = pair(kind, 3, 4, num_layers=2, bidirectional=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [[tuple(p.shape) for p in w] for w in ours.all_weights] == \
        [[tuple(p.shape) for p in w] for w in ref.all_weights]
    assert_same(list(ours.state_dict().values()), list(ref.state_dict().values()), rtol=0)
    x = _randn(5, 2, 3, seed=1)
    assert_same([ours(x)[0]], [ref(x)[0]])
    # and back: ours (changed) -> a fresh torch.nn layer
    with torch.no_grad():
        for k, p in enumerate(ours.parameters()):
            p.mul_(1.25).add_(0.01 * k)
    name, extra = kind.split("-")[0], KINDS[kind]
    back = getattr(torch.nn, name)(3, 4, num_layers=2, bidirectional=True, dtype=F64, **extra)
    back.load_state_dict(ours.state_dict())
    assert_same(list(back.state_dict().values()), list(ours.state_dict().values()), rtol=0)
    assert_same([back(x)[0]], [ours(x)[0]])
    # load_state_dict(assign=True) gives the module new Parameter objects: the engine follows them
    new = {k: v * 0.5 for k, v in back.state_dict().items()}
    ours.load_state_dict(new, assign=True)
    back.load_state_dict(new)
    assert_same([ours(x)[0]], [back(x)[0]])


def lin_cell(input_size, hidden_size):
    """A user cell with a parameter whose name contains '_l' (W_lin)."""
    c = rnngraph.Cell("test_user_lin")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    n = c.tanh(c.linear(x, "W_lin", hidden_size, bias="b_f") + c.linear(h, "U_h", hidden_size))
    c.output(c.bind(h, n, name="h"))
    return c.build()


def test_user_cell_state_dict_names():
    model = rt.Recurrent(lin_cell, 2, 3, 2, bidirectional=True, dtype=F64)
    assert list(model.state_dict()) == [f"{p}{s}" for s in ("_l0", "_l0_reverse", "_l1", "_l1_reverse")
                                        for p in ("W_lin", "b_f", "U_h")]


def test_all_weights_groups_user_cell_parameters_per_layer_and_direction():
    model = rt.Recurrent(lin_cell, 2, 3, 2, bidirectional=True, dtype=F64)
    groups = [[n for n, p in model.named_parameters() if any(p is q for q in g)] for g in model.all_weights]
    suffixes = ("_l0", "_l0_reverse", "_l1", "_l1_reverse")
    assert groups == [[f"{p}{s}" for p in ("W_lin", "b_f", "U_h")] for s in suffixes]


# -- 5. dtype changes, train/eval, flatten_parameters, proj_size ------------------------------------
def test_dtype_changes_after_construction_rebind_the_engine():
    torch.manual_seed(0)
    ours = rt.LSTM(3, 4, num_layers=2)                      # float32 (torch's default)
    ref = torch.nn.LSTM(3, 4, num_layers=2)
    ref.load_state_dict(ours.state_dict())
    x = _randn(5, 2, 3, seed=1)
    assert ours(x.float())[0].dtype == torch.float32
    assert_same([ours(x.float())[0]], [ref(x.float())[0]], rtol=1e-5)
    ours.double()
    ref.double()
    assert_same(run(ours, x)[0], run(ref, x)[0])
    ours.float()
    ref.float()
    assert_same([ours(x.float())[0]], [ref(x.float())[0]], rtol=1e-5)
    ours.to(torch.float64)
    ref.to(torch.float64)
    assert_same(run(ours, x)[0], run(ref, x)[0])
    # in-place updates after the conversion reach the engine
    for model in (ours, ref):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.zero_grad()
        model(x)[0].pow(2).sum().backward()
        opt.step()
    assert_same([ours(x)[0]], [ref(x)[0]])
    assert ours.weight_ih_l0.dtype == F64 and ours(x)[0].dtype == F64


def test_train_and_eval_switch_dropout():
    torch.manual_seed(0)
    ours = rt.LSTM(3, 4, num_layers=2, dropout=0.5, dtype=F64)
    ref = torch.nn.LSTM(3, 4, num_layers=2, dropout=0.5, dtype=F64)
    ref.load_state_dict(ours.state_dict())
    x = _randn(5, 2, 3, seed=1)
    ours.eval()
    ref.eval()
    e1, e2 = ours(x)[0], ours(x)[0]
    assert torch.equal(e1, e2)
    assert_same([e1], [ref(x)[0]])
    ours.train()
    t1, t2 = ours(x)[0], ours(x)[0]
    assert (t1 - e1).abs().max().item() > 1e-3
    assert (t1 - t2).abs().max().item() > 1e-3                 # fresh masks each call
    ours.eval()
    assert torch.equal(ours(x)[0], e1)


def test_flatten_parameters_and_proj_size():
    ref, ours = pair("LSTM", 3, 4)
    assert ours.flatten_parameters() is None
    x = _randn(5, 2, 3, seed=1)
    assert_same([ours(x)[0]], [ref(x)[0]])
    with pytest.raises(RnnGraphError, match="proj_size"):
        rt.LSTM(3, 4, proj_size=2)


# -- 6. several calls before one backward (the recompute path) -----------------------------------
def _fixed_weights(model):
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.copy_(torch.linspace(-0.6, 0.6, p.numel(), dtype=F64).reshape(p.shape).roll(k) * (1 + k / 8))
    return model


@pytest.mark.parametrize("variant", ["time_major", "h0", "packed_batch_first", "unbatched"])
def test_two_calls_then_one_backward_equals_torch(variant):
    """Call 1, call 2, then one backward through both: call 1's backward reruns its forward first."""
    bf = variant == "packed_batch_first"
    ref, ours = pair("LSTM", 3, 4, num_layers=2, bidirectional=True, batch_first=bf)
    x1 = _randn(*{"unbatched": (5,), "packed_batch_first": (2, 5)}.get(variant, (5, 2)), 3, seed=1)
    x2 = _randn(*{"unbatched": (4,), "packed_batch_first": (3, 4)}.get(variant, (4, 3)), 3, seed=2)
    h0 = (_randn(4, 2, 4, seed=3), _randn(4, 2, 4, seed=4)) if variant == "h0" else ()
    results = []
    for model in (ours, ref):
        model.zero_grad()
        a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
        hs = tuple(h.clone().requires_grad_() for h in h0)
        in1, in2 = a, b
        if bf:
            in1 = pack_padded_sequence(a, torch.tensor([3, 5]), batch_first=True, enforce_sorted=False)
            in2 = pack_padded_sequence(b, torch.tensor([4, 1, 2]), batch_first=True, enforce_sorted=False)
        (y1, s1), (y2, s2) = model(in1, as_hx(hs)), model(in2)
        y1, y2 = (y.data if isinstance(y, PackedSequence) else y for y in (y1, y2))
        (weighted_loss(y1, s1) + weighted_loss(y2, s2, seed=12)).backward()
        results.append([a.grad, b.grad, *(h.grad for h in hs), *(p.grad for p in model.parameters())])
    assert_same(*results)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_two_calls_then_one_backward_equals_two_separate_runs(dropout):
    """The first call's forward runs again before its backward, with its own dropout masks."""
    x1, x2 = _randn(5, 2, 3, seed=1), _randn(5, 2, 3, seed=2)

    def grads(together: bool):
        model = _fixed_weights(rt.LSTM(3, 4, num_layers=3, dropout=dropout, dtype=F64, seed=7))
        a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
        if together:
            (weighted_loss(model(a)[0], ()) + 2 * weighted_loss(model(b)[0], (), seed=12)).backward()
        else:
            weighted_loss(model(a)[0], ()).backward()
            (2 * weighted_loss(model(b)[0], (), seed=12)).backward()
        return [a.grad, b.grad, *(p.grad for p in model.parameters())]
    together, separate = grads(True), grads(False)
    assert_same(together, separate)
    if dropout:      # the masks matter: without them the gradients would differ
        eval_model = _fixed_weights(rt.LSTM(3, 4, num_layers=3, dropout=dropout, dtype=F64, seed=7)).eval()
        a = x1.clone().requires_grad_()
        weighted_loss(eval_model(a)[0], ()).backward()
        assert (a.grad - together[0]).abs().max().item() > 1e-3


def test_an_eval_call_between_forward_and_backward():
    """A validation call (eval, no_grad) after a training forward does not change its gradients."""
    x, xv = _randn(5, 2, 3, seed=1), _randn(6, 1, 3, seed=2)

    def grads(validate: bool):
        model = _fixed_weights(rt.GRU(3, 4, num_layers=2, dropout=0.5, dtype=F64, seed=3))
        loss = weighted_loss(model(x)[0], ())
        if validate:
            model.eval()
            with torch.no_grad():
                model(xv)
            model.train()
        loss.backward()
        return [p.grad for p in model.parameters()]
    assert_same(grads(True), grads(False))


def test_chained_calls_carry_state_and_gradient():
    """Truncated-BPTT style: the second call starts from the first call's final states."""
    ref, ours = pair("LSTM", 3, 4, num_layers=2)
    x1, x2 = _randn(4, 2, 3, seed=1), _randn(3, 2, 3, seed=2)
    results = []
    for model in (ours, ref):
        model.zero_grad()
        a = x1.clone().requires_grad_()
        y1, state = model(a)
        y2, (h, c) = model(x2, state)
        (weighted_loss(y1, ()) + weighted_loss(y2, (h, c), seed=13)).backward()
        results.append([y2, h, c, a.grad, *(p.grad for p in model.parameters())])
    assert_same(*results)


def test_retain_graph_backward_twice():
    ref, ours = pair("GRU", 3, 4, num_layers=2, bidirectional=True)
    x = _randn(5, 2, 3, seed=1)
    results = []
    for model in (ours, ref):
        model.zero_grad()
        loss = weighted_loss(model(x)[0], ())
        loss.backward(retain_graph=True)
        model(2 * x)                                   # another call in between: the recompute path again
        loss.backward()
        results.append([p.grad for p in model.parameters()])
    assert_same(*results)


def test_recompute_uses_the_call_s_own_parameters():
    ref, ours = pair("LSTM", 3, 4)
    x1, x2 = _randn(5, 2, 3, seed=1), _randn(5, 2, 3, seed=2)
    base = dict(ref.named_parameters())
    results = []
    for model in (ours, ref):
        pa = {n: (1.3 * p.detach()).requires_grad_() for n, p in base.items()}     # e.g. two ensemble members
        pb = {n: (0.7 * p.detach()).requires_grad_() for n, p in base.items()}
        a = x1.clone().requires_grad_()
        ya = torch.func.functional_call(model, pa, (a,))[0]
        yb = torch.func.functional_call(model, pb, (x2,))[0]
        (weighted_loss(ya, ()) + weighted_loss(yb, (), seed=12)).backward()
        results.append([ya, yb, a.grad, *(pa[n].grad for n in base), *(pb[n].grad for n in base)])
    assert_same(*results)


# -- 7. second-order gradients -------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_second_order_gradients_are_refused():
    ref, ours = pair("GRU", 3, 4)
    x = _randn(5, 2, 3, seed=1).requires_grad_()
    with pytest.raises(RuntimeError, match="second-order gradients"):
        (gx,) = torch.autograd.grad(ours(x)[0].pow(2).sum(), x, create_graph=True)
        gx.sum().backward()
    with pytest.raises(RuntimeError, match="second-order gradients"):
        ours(x)[0].pow(2).sum().backward(create_graph=True)
    # first-order gradients still work afterwards, and equal torch's
    x.grad = None
    assert_same(run(ours, x)[0], run(ref, x)[0])


# -- 8. mismatches are one clear RnnGraphError ----------------------------------------------------
def test_dtype_mismatch_is_a_clear_error():
    model = rt.LSTM(3, 4, dtype=F64)
    with pytest.raises(RnnGraphError, match=r"input is torch\.float32 on cpu but the parameters are torch\.float64"):
        model(torch.zeros(5, 2, 3))
    with pytest.raises(RnnGraphError, match=r"float16"):
        model(torch.zeros(5, 2, 3, dtype=torch.float16))
    with pytest.raises(RnnGraphError, match=r"h0 is torch\.float32 on cpu but the input is torch\.float64 on cpu; "
                                            r"pass h0\.to\(input\)"):
        model(torch.zeros(5, 2, 3, dtype=F64), (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4, dtype=F64)))


def test_device_mismatch_is_a_clear_error():
    model = rt.GRU(3, 4, dtype=F64)
    with pytest.raises(RnnGraphError, match=r"input is torch\.float64 on meta but the parameters are torch\.float64 "
                                            r"on cpu"):
        model(torch.empty(5, 2, 3, dtype=F64, device="meta"))
    with pytest.raises(RnnGraphError, match=r"h0 is torch\.float64 on meta but the input is torch\.float64 on cpu"):
        model(torch.zeros(5, 2, 3, dtype=F64), torch.empty(1, 2, 4, dtype=F64, device="meta"))


def test_wrong_states_are_a_clear_error():
    lstm, gru = rt.LSTM(3, 4, dtype=F64), rt.GRU(3, 4, num_layers=2, dtype=F64)
    x = torch.zeros(5, 2, 3, dtype=F64)
    h = torch.zeros(1, 2, 4, dtype=F64)
    with pytest.raises(RnnGraphError, match=r"takes 2 initial state tensor\(s\) \(h0, c0\), got 1"):
        lstm(x, h)
    with pytest.raises(RnnGraphError, match=r"takes 2 initial state tensor\(s\) \(h0, c0\), got 3"):
        lstm(x, (h, h, h))
    with pytest.raises(RnnGraphError, match=r"takes 1 initial state tensor\(s\) \(h0\), got 2"):
        gru(x, (h, h))
    with pytest.raises(RnnGraphError, match=r"h0 must be .*got \[1, 2, 4\]"):
        gru(x, h)                                            # 2 layers need [2, B, H]
    with pytest.raises(RnnGraphError, match=r"numpy"):
        gru(x.numpy())
    assert_same([gru(x, torch.zeros(2, 2, 4, dtype=F64))[0]], [gru(x)[0]])   # still usable


# -- extra: copying a module that has run ----------------------------------------------------------
def test_deepcopy_after_a_call():
    ref, ours = pair("LSTM", 3, 4)
    x = _randn(5, 2, 3, seed=1)
    y = ours(x)[0]
    twin = copy.deepcopy(ours)
    assert_same([twin(x)[0]], [y])
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(2)
    assert_same([ours(x)[0]], [ref(x)[0]])


# -- 9. DistributedDataParallel (gloo, one process) ------------------------------------------------
def test_distributed_data_parallel_on_the_cpu():
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60))
    except (RuntimeError, ValueError, OSError) as e:      # no loopback TCP here: an environment problem
        pytest.skip(f"cannot start a one-process gloo group: {e}")
    try:
        torch.manual_seed(0)
        plain, wrapped = Tagger(rt.LSTM), Tagger(rt.LSTM)
        wrapped.load_state_dict(plain.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(wrapped)
        opts = [torch.optim.Adam(m.parameters(), lr=0.02) for m in (plain, ddp)]
        g = torch.Generator().manual_seed(5)
        for step in range(2):
            tokens = torch.randint(0, 12, (6, 3), generator=g)
            losses = []
            for model, opt in zip((plain, ddp), opts):
                loss = torch.nn.functional.cross_entropy(model(tokens[:-1]).reshape(-1, 12), tokens[1:].reshape(-1))
                opt.zero_grad()
                loss.backward()
                losses.append(loss.detach())
            assert_same([losses[1]], [losses[0]], what=f"step {step} loss")
            assert_same([p.grad for p in wrapped.parameters()], [p.grad for p in plain.parameters()],
                        what=f"step {step} gradient")
            for opt in opts:
                opt.step()
    finally:
        dist.destroy_process_group()


def test_torch_compile_runs_the_layer_as_an_opaque_call():
    """forward is marked torch.compiler.disable: a compiled model calls it eagerly, with the same results
    and gradients as the uncompiled one."""
    model, head = rt.LSTM(3, 4, dtype=F64), torch.nn.Linear(4, 2, dtype=F64)

    def f(x):
        return head(model(x)[0]).relu().sum()
    x = _randn(5, 2, 3, seed=3).requires_grad_()
    want = f(x)
    want.backward()
    gx, x.grad = x.grad.clone(), None
    got = torch.compile(f, backend="eager")(x)
    got.backward()
    assert_same([got, x.grad], [want, gx])
