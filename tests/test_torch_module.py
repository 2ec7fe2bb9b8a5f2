"""rnngraph.torch's modules on the CPU in float64: gradcheck through inputs, states and parameters
(functional_call); the same numbers as torch.nn.LSTM/GRU/RNN in outputs, states and every gradient;
a training run; state dicts both ways. tests/test_torch_calls.py has the rest (calls, errors, copies).
These tests found three bugs, fixed since: a recomputed forward used the latest call's parameters, a
module could not be deep-copied after a call, all_weights mis-grouped user-cell names containing '_l'."""
import pytest

torch = pytest.importorskip("torch")
import rnngraph  # noqa: E402
import rnngraph.torch as rt  # noqa: E402
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence  # noqa: E402
from torch_cases import (F64, KINDS, Tagger, as_hx, as_tuple, assert_same, delay_cell, mgu_cell,  # noqa: E402
                         n_states, pair, randn, run, weighted_loss)


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




@pytest.mark.parametrize("cell, layers, bidirectional", [
    ("lstm", 1, False), ("gru", 1, False), (mgu_cell, 1, False), ("gru", 2, True), ("lstm", 2, True),
    (mgu_cell, 2, True)], ids=["lstm", "gru", "user_mgu", "gru_2layer_bidir", "lstm_2layer_bidir",
                               "user_mgu_2layer_bidir"])
@pytest.mark.parametrize("with_states", [False, True], ids=["no_h0", "h0"])
def test_gradcheck(cell, layers, bidirectional, with_states):
    torch.manual_seed(0)
    model = rt.Recurrent(cell, 2, 3, layers, bidirectional=bidirectional, dtype=F64)
    K = layers * (2 if bidirectional else 1)
    states = tuple(randn(K, 2, 3, seed=10 + k) for k in range(len(model.state_names))) if with_states else ()
    gradcheck_module(model, randn(4, 2, 2, seed=1), states)


def test_gradcheck_cellgraph_and_delay_cell():
    """A CellGraph passed directly, and a user cell reading h two frames back (its h0 and h_n are
    [2, L·dirs, B, S]; a [L·dirs, B, S] h0 means that value at every earlier frame)."""
    torch.manual_seed(0)
    gradcheck_module(rt.Recurrent(mgu_cell(2, 3), 2, 3, dtype=F64), randn(4, 2, 2, seed=2), (randn(1, 2, 3, seed=3),))
    model = rt.Recurrent(delay_cell, 2, 3, 1, bidirectional=True, dtype=F64)
    assert model(randn(4, 2, 2, seed=2))[1].shape == (2, 2, 2, 3)
    gradcheck_module(model, randn(4, 2, 2, seed=2), (randn(2, 2, 2, 3, seed=4),))
    gradcheck_module(model, randn(4, 2, 2, seed=2), (randn(2, 2, 3, seed=5),))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("with_states", [False, True], ids=["no_h0", "h0"])
def test_gradcheck_batch_first(cell, with_states):
    torch.manual_seed(0)
    model = rt.Recurrent(cell, 2, 3, 1, batch_first=True, bidirectional=True, dtype=F64)
    states = tuple(randn(2, 3, 3, seed=10 + k) for k in range(len(model.state_names))) if with_states else ()
    gradcheck_module(model, randn(3, 4, 2, seed=1), states)


@pytest.mark.parametrize("cell, batch_first", [("lstm", False), ("gru", True), (mgu_cell, False)],
                         ids=["lstm", "gru_batch_first", "user_mgu"])
@pytest.mark.parametrize("with_states", [False, True], ids=["no_h0", "h0"])
def test_gradcheck_packed(cell, batch_first, with_states):
    """Packed input (enforce_sorted=False, unequal lengths): gradients through the padded x."""
    torch.manual_seed(0)
    model = rt.Recurrent(cell, 2, 3, 1, batch_first=batch_first, bidirectional=True, dtype=F64)
    x = randn(*((3, 5) if batch_first else (5, 3)), 2, seed=1)
    states = tuple(randn(2, 3, 3, seed=10 + k) for k in range(len(model.state_names))) if with_states else ()
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
    x = randn(*shape, seed=1)
    h0 = tuple(randn(K, *batch, 4, seed=2 + k) for k in range(n_states(kind)))
    for states in ((), h0):
        got, y = run(ours, x, states)
        want, y_ref = run(ref, x, states)
        assert y.shape == y_ref.shape
        assert_same(got, want)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_equals_torch_nn_without_bias(kind):
    ref, ours = pair(kind, 3, 4, num_layers=2, bias=False, bidirectional=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    x = randn(5, 2, 3, seed=1)
    h0 = tuple(randn(4, 2, 4, seed=2 + k) for k in range(n_states(kind)))
    assert_same(run(ours, x, h0)[0], run(ref, x, h0)[0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
def test_packed_sequence_equals_torch_nn(kind, batch_first):
    ref, ours = pair(kind, 3, 4, num_layers=2, bidirectional=True, batch_first=batch_first)
    x = randn(*((3, 6) if batch_first else (6, 3)), 3, seed=1)
    lengths = torch.tensor([4, 6, 2])
    h0 = tuple(randn(4, 3, 4, seed=2 + k) for k in range(n_states(kind)))
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
    x = randn(5, 3, 3, seed=1)
    packed = pack_padded_sequence(x, torch.tensor([5, 3, 1]))
    (y, h), (y_ref, h_ref) = ours(packed), ref(packed)
    assert isinstance(y, PackedSequence) and y.sorted_indices is None and y.unsorted_indices is None
    assert torch.equal(y.batch_sizes, y_ref.batch_sizes)
    assert_same([y.data, h], [y_ref.data, h_ref])


@pytest.mark.parametrize("used", ["y", "h_n", "c_n"])
def test_gradient_of_one_output_only(used):
    """Only one of y, h_n, c_n reaches the loss (the others' gradients arrive as None)."""
    ref, ours = pair("LSTM", 3, 4, num_layers=2, bidirectional=True)
    x = randn(5, 2, 3, seed=1)
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
    x = randn(5, 2, 3, seed=1)
    outs = []
    for spec in ("mgu", "rnngraph.ir.cells:mgu", cells.mgu, cells.mgu(3, 4)):
        torch.manual_seed(3)
        model = rt.Recurrent(spec, 3, 4, dtype=F64)
        outs.append(run(model, x, (randn(1, 2, 4, seed=2),))[0])
    for other in outs[1:]:
        assert_same(other, outs[0], rtol=0)


def test_initialisation_follows_torch_s_generator():
    torch.manual_seed(5)
    ref = torch.nn.LSTM(3, 4, 2, bidirectional=True, dtype=F64)
    torch.manual_seed(5)
    ours = rt.LSTM(3, 4, 2, bidirectional=True, dtype=F64)
    assert_same(list(ours.parameters()), list(ref.parameters()), rtol=0)


# -- 3. a small model trained with Adam and clip_grad_norm_ ---------------------------------------
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
    x = randn(5, 2, 3, seed=1)
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
