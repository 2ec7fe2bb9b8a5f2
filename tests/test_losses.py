"""The losses (softmax cross-entropy, MSE): against torch, against finite differences, and their errors."""
import numpy as np
import pytest

from numerics import F, close, directional, needs_torch, torch
from rnngraph.errors import RnnGraphError
from rnngraph.nn.layers import CrossEntropyLoss, MSELoss


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- CrossEntropyLoss -----------------------------------------------------------------------------------

def _ce_case(rng, T=6, B=4, C=5):
    logits = rng.standard_normal((T, B, C)) * 3
    target = rng.integers(0, C, (T, B))
    target[rng.random((T, B)) < 0.3] = -100
    return logits, target


@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_torch_with_ignore_index(reduction, rng):
    logits, target = _ce_case(rng)
    ce = CrossEntropyLoss(reduction=reduction)
    lt = torch.tensor(logits.reshape(-1, 5), requires_grad=True)
    ref = F.cross_entropy(lt, torch.tensor(target.reshape(-1)), ignore_index=-100, reduction=reduction)
    g = rng.standard_normal(target.shape) if reduction == "none" else 0.7
    ref.backward(torch.tensor(g, dtype=torch.float64).reshape(ref.shape))
    loss = ce(logits, target)
    assert type(loss) is np.ndarray and loss.shape == (() if reduction != "none" else target.shape)
    assert loss.dtype == np.float64
    close(np.reshape(loss, -1), ref.reshape(-1))
    close(ce.backward(g), lt.grad.reshape(logits.shape))


@needs_torch
def test_cross_entropy_on_2d_logits_and_custom_ignore_index(rng):
    logits, target = rng.standard_normal((10, 4)), rng.integers(0, 4, 10)
    target[[1, 5]] = 3
    ce = CrossEntropyLoss(ignore_index=3)
    ref = F.cross_entropy(torch.tensor(logits), torch.tensor(target), ignore_index=3)
    close(ce(logits, target), ref)


def test_cross_entropy_mask_equals_ignoring_the_padded_frames(rng):
    logits, target = _ce_case(rng)
    mask = rng.random(target.shape) < 0.7
    ce_mask, ce_ignore = CrossEntropyLoss(), CrossEntropyLoss()
    ignored = np.where(mask, target, -100)
    close(ce_mask(logits, target, mask), ce_ignore(logits, ignored))
    g = ce_mask.backward()
    close(g, ce_ignore.backward())
    assert (g[~mask] == 0).all()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_finite_differences(reduction, rng):
    logits, target = _ce_case(rng)
    mask = rng.random(target.shape) < 0.8
    ce = CrossEntropyLoss(reduction=reduction)
    ce(logits, target, mask)
    directional(lambda v: float(ce.forward(v, target, mask)[0]), logits, ce.backward(), rng)


def test_cross_entropy_is_stable_and_float32_stays_float32():
    logits = np.array([[1e4, -1e4, 0.0]], dtype=np.float32)
    ce = CrossEntropyLoss()
    loss = ce(logits, np.array([1]))
    assert loss.dtype == np.float32 and np.isclose(loss, 2e4) and np.isfinite(ce.backward()).all()


def test_cross_entropy_errors(rng):
    ce, logits = CrossEntropyLoss(), rng.standard_normal((6, 4, 5))
    with pytest.raises(RnnGraphError, match=r"targets of shape \(6, 4\).*got \(4, 6\) \(time and batch"):
        ce(logits, np.zeros((4, 6), dtype=int))
    with pytest.raises(RnnGraphError, match="one-hot"):
        ce(logits, np.zeros((6, 4, 5), dtype=int))
    with pytest.raises(RnnGraphError, match="integer class-index targets, got float64"):
        ce(logits, np.zeros((6, 4)))
    with pytest.raises(RnnGraphError, match=r"must lie in \[0, 5\)"):
        ce(logits, np.full((6, 4), 5))
    with pytest.raises(RnnGraphError, match=r"expected mask of shape \(6, 4\), got \(6, 3\)"):
        ce(logits, np.zeros((6, 4), dtype=int), np.ones((6, 3), dtype=bool))
    with pytest.raises(RnnGraphError, match="at least 2 dimensions"):
        ce(np.zeros(5), np.zeros((), dtype=int))
    with pytest.raises(RnnGraphError, match="reduction must be"):
        CrossEntropyLoss(reduction="avg")


# -- MSELoss --------------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_matches_torch(reduction, rng):
    a, b = rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 3, 2))
    mse = MSELoss(reduction)
    at = torch.tensor(a, requires_grad=True)
    ref = F.mse_loss(at, torch.tensor(b), reduction=reduction)
    g = rng.standard_normal(a.shape) if reduction == "none" else 1.3
    ref.backward(torch.tensor(g, dtype=torch.float64))
    close(mse(a, b), ref)
    close(mse.backward(g), at.grad)


def test_mse_mask_and_finite_differences(rng):
    a, b = rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 3, 2))
    mask = rng.random((5, 3)) < 0.6
    mse = MSELoss()
    close(mse(a, b, mask), ((a - b)[mask] ** 2).mean())
    g = mse.backward()
    assert (g[~mask] == 0).all()
    directional(lambda v: float(mse.forward(v, b, mask)[0]), a, g, rng)


def test_mse_errors():
    mse = MSELoss()
    with pytest.raises(RnnGraphError, match=r"input's shape \(5, 3, 1\), got \(5, 3\)"):
        mse(np.zeros((5, 3, 1)), np.zeros((5, 3)))
    with pytest.raises(RnnGraphError, match="dtype mismatch, expected float64, got float32"):
        mse(np.zeros((5, 3)), np.zeros((5, 3), dtype=np.float32))
    with pytest.raises(RnnGraphError, match="expected mask of shape"):
        mse(np.zeros((5, 3, 1)), np.zeros((5, 3, 1)), np.ones((3, 5), dtype=bool))


def test_cross_entropy_with_nothing_counted_is_nan():
    ce = CrossEntropyLoss()
    loss = ce(np.zeros((2, 3)), np.full(2, -100))
    assert np.isnan(loss)


@needs_torch
def test_cross_entropy_with_nothing_counted_is_nan_in_torch_too():
    assert torch.isnan(F.cross_entropy(torch.zeros(2, 3), torch.full((2,), -100)))
