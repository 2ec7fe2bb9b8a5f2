"""rnngraph.torch's modules on the CPU in float64, beyond the numbers: dtype changes, train/eval and
dropout; several calls before one backward (the recompute path); second-order gradients refused; clear
errors; copies after a call; DDP (gloo, one process); torch.compile."""
import copy
import datetime
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
from rnngraph.errors import RnnGraphError  # noqa: E402
import rnngraph.torch as rt  # noqa: E402
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence  # noqa: E402
from torch_cases import F64, Tagger, as_hx, assert_same, free_port, pair, randn, run, weighted_loss  # noqa: E402


# -- 5. dtype changes, train/eval, flatten_parameters, proj_size ------------------------------------
def test_dtype_changes_after_construction_rebind_the_engine():
    torch.manual_seed(0)
    ours = rt.LSTM(3, 4, num_layers=2)                      # float32 (torch's default)
    ref = torch.nn.LSTM(3, 4, num_layers=2)
    ref.load_state_dict(ours.state_dict())
    x = randn(5, 2, 3, seed=1)
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
    x = randn(5, 2, 3, seed=1)
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
    x = randn(5, 2, 3, seed=1)
    assert_same([ours(x)[0]], [ref(x)[0]])
    for bad in (4, -1, 1.5):            # torch's rule: 0 <= proj_size < hidden_size (tests/test_torch_proj.py)
        with pytest.raises(RnnGraphError, match=r"proj_size must be an integer in \[0, hidden_size=4\)"):
            rt.LSTM(3, 4, proj_size=bad)


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
    x1 = randn(*{"unbatched": (5,), "packed_batch_first": (2, 5)}.get(variant, (5, 2)), 3, seed=1)
    x2 = randn(*{"unbatched": (4,), "packed_batch_first": (3, 4)}.get(variant, (4, 3)), 3, seed=2)
    h0 = (randn(4, 2, 4, seed=3), randn(4, 2, 4, seed=4)) if variant == "h0" else ()
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
    x1, x2 = randn(5, 2, 3, seed=1), randn(5, 2, 3, seed=2)

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
    x, xv = randn(5, 2, 3, seed=1), randn(6, 1, 3, seed=2)

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
    x1, x2 = randn(4, 2, 3, seed=1), randn(3, 2, 3, seed=2)
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
    x = randn(5, 2, 3, seed=1)
    results = []
    for model in (ours, ref):
        model.zero_grad()
        loss = weighted_loss(model(x)[0], ())
        loss.backward(retain_graph=True)
        model(2 * x)                                   # another call in between: the recompute path again
        loss.backward()
        results.append([p.grad for p in model.parameters()])
    assert_same(*results)


def test_retain_graph_backward_twice_of_a_call_in_chunks():
    """A backward of a call in chunks spends its stored values: the second one runs the call again."""
    ref, ours = pair("GRU", 3, 4, num_layers=2, bidirectional=True)
    x = randn(9, 2, 3, seed=1)
    ours(x)
    for engine in ours._engines.values():
        engine.backend.chunk_frames = 2
    results = []
    for model in (ours, ref):
        model.zero_grad()
        loss = weighted_loss(model(x)[0], ())
        loss.backward(retain_graph=True)
        loss.backward()
        results.append([p.grad for p in model.parameters()])
    assert_same(*results)
    assert all(engine.spent for engine in ours._engines.values())


def test_recompute_uses_the_call_s_own_parameters():
    ref, ours = pair("LSTM", 3, 4)
    x1, x2 = randn(5, 2, 3, seed=1), randn(5, 2, 3, seed=2)
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
    x = randn(5, 2, 3, seed=1).requires_grad_()
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
    x = randn(5, 2, 3, seed=1)
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
        alive = weakref.ref(ddp)
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
        # every reference to DDP's reducer (the loop's model, the last loss's graph, the wrapped module's hooks) goes
        # while its process group lives: freed after destroy_process_group, gloo's teardown can hang
        del ddp, opts, model, loss, wrapped
        gc.collect()
        assert alive() is None, "DDP outlives its process group"
    finally:
        dist.destroy_process_group()


def test_torch_compile_runs_the_layer_as_an_opaque_call():
    """forward is marked torch.compiler.disable: a compiled model calls it eagerly, with the same results
    and gradients as the uncompiled one."""
    model, head = rt.LSTM(3, 4, dtype=F64), torch.nn.Linear(4, 2, dtype=F64)

    def f(x):
        return head(model(x)[0]).relu().sum()
    x = randn(5, 2, 3, seed=3).requires_grad_()
    want = f(x)
    want.backward()
    gx, x.grad = x.grad.clone(), None
    got = torch.compile(f, backend="eager")(x)
    got.backward()
    assert_same([got, x.grad], [want, gx])
