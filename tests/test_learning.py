"""Training end to end on the CPU: the adding problem learns, and the same seed trains bit-identically."""
import numpy as np
import pytest

from rnngraph import nn
from rnngraph.nn.optim import Adam, clip_grad_norm


def adding_batch(rng, T: int, B: int, dtype="float32"):
    """The adding problem: x [T, B, 2] holds U(0,1) values and a marker channel with one 1 in each half of
    the sequence; the target [B, 1] is the sum of the two marked values (variance 2/12 ≈ 0.167)."""
    x = np.zeros((T, B, 2), dtype)
    x[:, :, 0] = rng.random((T, B))
    b = np.arange(B)
    first, second = rng.integers(0, T // 2, B), rng.integers(T // 2, T, B)
    x[first, b, 1] = x[second, b, 1] = 1
    return x, (x[first, b, 0] + x[second, b, 0])[:, None]


def last_frame(y, T: int, B: int):
    """A target [T, B, 1] that is `y` [B, 1] at the last frame, and the mask [T, B] that counts only that frame."""
    target, mask = np.zeros((T, B, 1), y.dtype), np.zeros((T, B), bool)
    target[-1], mask[-1] = y, True
    return target, mask


def test_gru_learns_the_adding_problem_well_under_the_mean_baseline():
    # GRU(16) + Dense + masked MSE + Adam: 200 steps of B=64 take ~4 s of CPU time. With these settings every
    # seed tried (0-11) reaches a held-out MSE <= 0.003 by step 200, while predicting the mean gives ~0.167.
    T, B, steps = 50, 64, 200
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.GRU(2, 16, seed=0), nn.Dense(16, 1, seed=0))
    mse, opt = nn.MSELoss(), Adam(model.parameters(), lr=0.02)
    for _ in range(steps):
        x, y = adding_batch(rng, T, B)
        target, mask = last_frame(y, T, B)
        out, _ = model(x)                                   # out: [T, B, 1]
        mse(out, target, mask)
        model.backward(mse.backward())
        opt.step(model.grads)
    x, y = adding_batch(np.random.default_rng(1234), T, 512)   # held out
    out, _ = model(x)
    baseline = float(((y - y.mean()) ** 2).mean())
    test_mse = float(((out[-1] - y) ** 2).mean())
    assert 0.14 < baseline < 0.19
    assert test_mse < 0.02, f"held-out MSE {test_mse:.4f} (mean-prediction baseline {baseline:.4f})"


def _train(seed: int, steps: int = 3):
    """A few steps of a 2-layer LSTM with dropout + Dense + clipping + Adam; every random draw comes from `seed`."""
    T, B = 12, 4
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.LSTM(2, 8, num_layers=2, dropout=0.3, seed=seed), nn.Dense(8, 1, seed=seed))
    mse, opt = nn.MSELoss(), Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        x, y = adding_batch(rng, T, B)
        target, mask = last_frame(y, T, B)
        out, _ = model(x)
        losses.append(mse(out, target, mask))
        model.backward(mse.backward())
        clip_grad_norm(model.grads, 1.0)
        opt.step(model.grads)
    return losses, model.state_dict()


def test_same_seed_trains_bit_identically_on_the_cpu():
    losses_a, state_a = _train(seed=3)
    losses_b, state_b = _train(seed=3)
    assert [float(l) for l in losses_a] == [float(l) for l in losses_b]
    assert list(state_a) == list(state_b)
    for k in state_a:
        assert state_a[k].dtype == np.float32
        np.testing.assert_array_equal(state_a[k], state_b[k], err_msg=k)
    losses_c, state_c = _train(seed=4)
    assert not np.array_equal(state_a["0.weight_ih_l0"], state_c["0.weight_ih_l0"])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_default_seed_is_reproducible_for_recurrent_and_dense(kind):
    """Layers built without a seed use seed=0: two such models start from the same weights."""
    a, b = (nn.Sequential(nn.Recurrent(kind, 3, 5), nn.Dense(5, 2)) for _ in range(2))
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_array_equal(va, vb, err_msg=k)
