"""SGD, Adam, clipping and learning-rate schedules against torch.optim; initialisers; seeded reproducibility."""
import numpy as np
import pytest

from numerics import needs_torch, torch
from rnngraph.errors import RnnGraphError
from rnngraph.nn.init import init_orthogonal, init_uniform
from rnngraph.nn.layers import CrossEntropyLoss, Dense
from rnngraph.nn.optim import SGD, Adam, CosineLR, StepLR, clip_grad_norm

SHAPES = {"w": (4, 3), "b": (4,), "v": (2, 2, 2)}


def rel_err(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def run_both(make_ours, make_torch, steps=6, seed=0, skip=()):
    """Runs our optimizer and torch's on the same float64 params and grads; returns the max relative error."""
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    tparams = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in params.items()}
    ours, theirs = make_ours(params), make_torch(list(tparams.values()))
    worst = 0.0
    for step in range(steps):
        grads = {k: rng.standard_normal(s) for k, s in SHAPES.items() if not (step % 2 and k in skip)}
        for k, p in tparams.items():
            p.grad = torch.tensor(grads[k].copy()) if k in grads else None
        ours.step(grads)
        theirs.step()
        worst = max(worst, *(rel_err(params[k], tparams[k].detach().numpy()) for k in params))
    return worst


@pytest.mark.parametrize("kw", [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.05, momentum=0.8, weight_decay=0.01),
    dict(lr=0.05, momentum=0.8, weight_decay=0.01, nesterov=True),
    dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.1),
])
@needs_torch
def test_sgd_matches_torch(kw):
    assert run_both(lambda p: SGD(p, **kw), lambda p: torch.optim.SGD(p, **kw), skip=("b",)) <= 1e-12


@pytest.mark.parametrize("kw", [
    dict(),
    dict(lr=0.01, weight_decay=0.05),
    dict(lr=0.02, betas=(0.3, 0.99), eps=1e-6),     # beta1 < 0.5: torch's lerp takes its other branch
    dict(lr=0.5, betas=(0.95, 0.9)),
])
@needs_torch
def test_adam_matches_torch(kw):
    assert run_both(lambda p: Adam(p, **kw), lambda p: torch.optim.Adam(p, **kw), steps=8, skip=("v",)) <= 1e-12


def test_optimizers_do_not_touch_the_gradients():
    rng = np.random.default_rng(0)
    params, grads = {"w": rng.standard_normal(5)}, {"w": rng.standard_normal(5)}
    before = grads["w"].copy()
    for opt in (SGD(params, 0.1, momentum=0.9, weight_decay=0.1), Adam(params, weight_decay=0.1)):
        opt.step(grads)
        opt.step(grads)
    assert np.array_equal(grads["w"], before)


@pytest.mark.parametrize("make", [lambda p: SGD(p, 0.1, momentum=0.9, nesterov=True),
                                  lambda p: Adam(p, 0.01, weight_decay=0.01)])
def test_state_dict_resumes_bit_identically(make):
    rng = np.random.default_rng(5)
    start = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    grads = [{k: rng.standard_normal(s) for k, s in SHAPES.items()} for _ in range(6)]
    full = {k: v.copy() for k, v in start.items()}
    opt = make(full)
    for g in grads:
        opt.step(g)
    resumed = {k: v.copy() for k, v in start.items()}
    first = make(resumed)
    for g in grads[:3]:
        first.step(g)
    saved = first.state_dict()
    assert all(isinstance(a, (int, np.ndarray)) for st in saved["state"].values() for a in st.values())
    second = make(resumed)
    second.load_state_dict(saved)
    for g in grads[3:]:
        second.step(g)
    assert all(np.array_equal(full[k], resumed[k]) for k in full)


def test_optimizer_errors():
    params = {"w": np.zeros((2, 3))}
    with pytest.raises(RnnGraphError, match="non-empty dict"):
        SGD([np.zeros(3)], lr=0.1)
    with pytest.raises(RnnGraphError, match=r"unknown parameters \['x'\]"):
        SGD(params, 0.1).step({"x": np.zeros(1)})
    with pytest.raises(RnnGraphError, match=r"shape \(2, 3\) and dtype float64, got \(3, 2\) float64"):
        Adam(params).step({"w": np.zeros((3, 2))})
    with pytest.raises(RnnGraphError, match="got \\(2, 3\\) float32"):
        Adam(params).step({"w": np.zeros((2, 3), dtype=np.float32)})
    with pytest.raises(RnnGraphError, match="Nesterov"):
        SGD(params, 0.1, nesterov=True)
    with pytest.raises(RnnGraphError, match="betas"):
        Adam(params, betas=(0.9, 1.0))
    with pytest.raises(RnnGraphError, match="unknown parameters"):
        SGD(params, 0.1).load_state_dict({"hyper": {}, "state": {"x": {}}})


@needs_torch
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(max_norm):
    rng = np.random.default_rng(2)
    grads = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    tgrads = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in SHAPES.values()]
    for p, g in zip(tgrads, grads.values()):
        p.grad = torch.tensor(g.copy())
    ref = torch.nn.utils.clip_grad_norm_(tgrads, max_norm)
    total = clip_grad_norm(grads, max_norm)
    assert abs(float(total) - float(ref)) <= 1e-12 * float(ref)
    for p, g in zip(tgrads, grads.values()):
        assert rel_err(g, p.grad.numpy()) <= 1e-12
    if max_norm < float(ref):
        assert np.isclose(np.sqrt(sum((g * g).sum() for g in grads.values())), max_norm, rtol=1e-5)


def test_clip_grad_norm_nonfinite():
    with pytest.raises(RnnGraphError, match="NaN or inf"):
        clip_grad_norm({"w": np.array([1.0, np.nan])}, 1.0, error_if_nonfinite=True)
    assert float(clip_grad_norm({}, 1.0)) == 0.0


def _torch_lrs(make_sched, lr, steps):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched, out = make_sched(opt), []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(out)


@needs_torch
def test_step_lr_matches_torch():
    ours = [StepLR(0.1, step_size=7, gamma=0.3)(s) for s in range(40)]
    ref = _torch_lrs(lambda o: torch.optim.lr_scheduler.StepLR(o, 7, 0.3), 0.1, 40)
    assert np.allclose(ours, ref, rtol=1e-12, atol=0)


@needs_torch
def test_cosine_lr_matches_torch():
    ours = [CosineLR(0.1, total_steps=30, min_lr=0.001)(s) for s in range(30)]
    ref = _torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 30, eta_min=0.001), 0.1, 30)
    assert np.allclose(ours, ref, rtol=1e-10, atol=0)


def test_cosine_lr_warms_up():
    warm = CosineLR(1.0, total_steps=110, warmup_steps=10)
    assert [warm(s) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3], rel=1e-15) and warm(9) == 1.0 == warm(10)
    assert warm(60) == pytest.approx(0.5) and warm(110) == 0.0 == warm(500)
    assert all(warm(s) >= warm(s + 1) for s in range(10, 120))
    with pytest.raises(RnnGraphError, match="warmup_steps < total_steps"):
        CosineLR(1.0, total_steps=10, warmup_steps=10)


def test_init_uniform_bounds_dtype_and_seed():
    a = init_uniform(np.random.default_rng(3), (64, 16), H=16)
    assert a.shape == (64, 16) and a.dtype == np.float64 and np.abs(a).max() <= 0.25 and np.abs(a).max() > 0.24
    assert np.array_equal(a, init_uniform(np.random.default_rng(3), (64, 16), H=16))
    assert init_uniform(np.random.default_rng(3), (2,), H=4, dtype="float32").dtype == np.float32


@pytest.mark.parametrize("shape", [(12, 4), (4, 12), (5, 5), (6, 2, 3)])
def test_init_orthogonal(shape):
    w = init_orthogonal(np.random.default_rng(0), shape, gain=2.0)
    flat = w.reshape(shape[0], -1) / 2.0
    gram = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
    assert w.shape == shape and np.allclose(gram, np.eye(len(gram)), atol=1e-12)
    assert np.array_equal(w, init_orthogonal(np.random.default_rng(0), shape, gain=2.0))
    with pytest.raises(RnnGraphError, match="at least 2 dimensions"):
        init_orthogonal(np.random.default_rng(0), (5,))


def _train(seed, steps=60):
    """Dense + cross-entropy + Adam with clipping on a seeded toy problem; returns (params, first, last loss)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((10, 8, 6))                           # [T, B, D]
    target = (x[..., 0] + x[..., 1] > 0).astype(np.int64)         # [T, B], linearly separable
    dense, ce = Dense(6, 2, dtype="float64", seed=seed), CrossEntropyLoss()
    opt, sched, losses = Adam(dense.parameters(), lr=0.1), CosineLR(0.1, steps, warmup_steps=5), []
    for step in range(steps):
        losses.append(float(ce(dense(x), target)))
        dense.backward(ce.backward())
        clip_grad_norm(dense.grads, 1.0)
        opt.lr = sched(step)
        opt.step(dense.grads)
    return dense.state_dict(), losses[0], losses[-1]


def test_training_is_seeded_bit_identical_and_learns():
    (p1, first, last), (p2, _, _), (p3, _, _) = _train(0), _train(0), _train(1)
    assert all(np.array_equal(p1[k], p2[k]) for k in p1) and not np.array_equal(p1["weight"], p3["weight"])
    assert last < 0.25 * first
