"""rnngraph.torch under torch.autocast on the CPU: the layer computes in the autocast dtype (outputs and states
in it), its float32 parameters get float32 gradients accumulated into .grad, within the half-precision bounds
of tests/test_torch_half.py against float64; outside autocast (and for float64 modules) nothing changes."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")
import rnngraph.torch as rt  # noqa: E402
from torch_cases import F64, assert_same, mgu_cell, randn  # noqa: E402

TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}       # relative 2-norm against float64, as tests/test_half.py


def rel(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


def pair(kind, dtype_ref=F64, **kw):
    torch.manual_seed(0)
    ours = getattr(rt, kind)(3, 8, **kw)                            # float32 parameters
    ref = getattr(torch.nn, kind)(3, 8, **kw, dtype=dtype_ref)
    ref.load_state_dict({k: v.to(dtype_ref) for k, v in ours.state_dict().items()})
    return ours, ref


def loss_of(y, states):
    return y.float().pow(2).sum() + sum(s.float().sum() for s in states)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind, kw", [("LSTM", {"num_layers": 2, "bidirectional": True}), ("GRU", {}),
                                      ("LSTM", {"proj_size": 4})], ids=["lstm_2layer_bidir", "gru", "lstm_proj"])
def test_autocast_computes_in_half_with_float32_gradients(dtype, kind, kw):
    ours, ref = pair(kind, **kw)
    x = randn(10, 4, 3, seed=1).float().requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        y, state = ours(x)
    states = state if isinstance(state, tuple) else (state,)
    assert y.dtype == dtype and all(s.dtype == dtype for s in states)
    loss_of(y, states).backward()
    assert x.grad.dtype == torch.float32 and all(p.grad.dtype == torch.float32 for p in ours.parameters())
    xr = x.detach().double().requires_grad_()
    yr, state_r = ref(xr)
    states_r = state_r if isinstance(state_r, tuple) else (state_r,)
    loss_of(yr, states_r).backward()
    pairs = [(y, yr), *zip(states, states_r), (x.grad, xr.grad), *zip((p.grad for p in ours.parameters()),
                                                                       (p.grad for p in ref.parameters()))]
    errors = [rel(a, b) for a, b in pairs]
    assert max(errors) <= TOL[dtype], errors


def test_gradients_accumulate_in_float32_and_updates_are_seen():
    ours, _ = pair("LSTM")
    x = randn(6, 2, 3, seed=1).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours(x)[0].float().sum().backward()
    once = [p.grad.clone() for p in ours.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours(x)[0].float().sum().backward()
    assert_same([p.grad for p in ours.parameters()], [2 * g for g in once], rtol=0)
    with torch.no_grad():                               # an optimiser's in-place update reaches the next call
        for p in ours.parameters():
            p.mul_(0.5)
    fresh, _ = pair("LSTM")
    fresh.load_state_dict(ours.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(ours(x)[0], fresh(x)[0])


def test_two_calls_before_one_backward_under_autocast():
    """The recompute path refills the half copy from the earlier call's own (float32) parameters."""
    ours, _ = pair("GRU")
    base = dict(ours.named_parameters())
    x1, x2 = randn(5, 2, 3, seed=1).float(), randn(5, 2, 3, seed=2).float()
    grads = []
    for together in (True, False):
        pa = {n: (1.3 * p.detach()).requires_grad_() for n, p in base.items()}
        pb = {n: (0.7 * p.detach()).requires_grad_() for n, p in base.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ya = torch.func.functional_call(ours, pa, (x1,))[0]
            if not together:
                ya.float().pow(2).sum().backward()
            yb = torch.func.functional_call(ours, pb, (x2,))[0]
        if together:
            (ya.float().pow(2).sum() + yb.float().sum()).backward()
        else:
            yb.float().sum().backward()
        grads.append([*(pa[n].grad for n in base), *(pb[n].grad for n in base)])
    assert_same(*grads, rtol=0)


def test_outside_autocast_and_for_float64_nothing_changes():
    ours, _ = pair("LSTM")
    x = randn(6, 2, 3, seed=1).float()
    before = ours(x)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours(x)
    after = ours(x)[0]
    assert after.dtype == torch.float32 and torch.equal(before, after)
    wide = rt.Recurrent(mgu_cell, 3, 4, dtype=F64)
    xd = randn(6, 2, 3, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = wide(xd)[0]
    assert y.dtype == F64 and torch.equal(y, wide(xd)[0])


def test_half_inputs_and_float32_states_under_autocast():
    """Inside autocast an input may already be half (another autocast op's output) and h0 float32: both are
    cast, as torch casts an autocast op's inputs."""
    ours, _ = pair("LSTM")
    x, h0 = randn(6, 2, 3, seed=1).float(), randn(1, 2, 8, seed=2).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = ours(x, (h0, h0))[0]
        b = ours(x.to(torch.bfloat16), (h0.to(torch.bfloat16), h0))[0]
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)


def test_a_step_under_autocast():
    cell, _ = pair("LSTM")
    x = randn(2, 3, seed=1).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, (h, c) = cell.step(x)
        y_seq = cell(x[None])[0][0]
    assert y.dtype == torch.bfloat16 and torch.equal(y, y_seq)
