"""rnngraph.nn.Recurrent.step (one frame, for loops that feed outputs back) in float64 on the CPU: T steps
equal one call over T frames in outputs and states, the backward of a step equals the backward of that frame
called as a sequence, a step is never padded to a shape bucket, clear errors; the sampler steps and draws
what calling the model frame by frame draws."""
import numpy as np
import pytest

import rnngraph
from rnngraph import RnnGraphError
from rnngraph.nn import Recurrent
from rnngraph.run.chunk_plan import LADDER_TOP, ladder
from rnngraph.train.charlm import CharLM
from rnngraph.train.data import Vocab
from rnngraph.train.sample import generate


def delay_cell(input_size, hidden_size):
    """A cell that reads its state two frames back: its state carries the last two frames."""
    c = rnngraph.Cell("step_delay")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    f = c.sigmoid(c.linear(x, "W_f", hidden_size, bias="b_f") + c.linear(h, "U_f", hidden_size) + c.diag(h.ago(2), "p"))
    c.output(c.bind(h, (1 - f) * h + f * c.tanh(c.linear(x, "W_n", hidden_size)), name="h"))
    return c.build()


CASES = [("lstm", 2), ("gru", 1), ("mgu", 2), (delay_cell, 1)]
IDS = ["lstm_2layer", "gru", "mgu_2layer", "delay_cell"]


def states_of(layer, B, seed):
    rng = np.random.default_rng(seed)
    shapes = [layer._stack.shape(s, B) for s in layer.state_names]
    parts = tuple(rng.standard_normal(s) for s in shapes)
    return parts[0] if len(parts) == 1 else parts


def as_list(state):
    return list(state) if isinstance(state, tuple) else [state]


@pytest.mark.parametrize("cell, layers", CASES, ids=IDS)
def test_steps_equal_one_call(cell, layers):
    layer = Recurrent(cell, 3, 5, num_layers=layers, dtype="float64", seed=1)
    x = np.random.default_rng(0).standard_normal((6, 2, 3))
    state0 = states_of(layer, 2, seed=2)
    y, state_n = layer(x, state0)
    state, ys = state0, []
    for t in range(6):
        y_t, state = layer.step(x[t], state)
        assert y_t.shape == (2, y.shape[-1])
        ys.append(y_t)
    np.testing.assert_allclose(np.stack(ys), y, rtol=1e-12, atol=1e-14)
    for a, b in zip(as_list(state), as_list(state_n)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cell, layers", CASES, ids=IDS)
def test_the_backward_of_a_step_is_that_frame_s(cell, layers):
    layer = Recurrent(cell, 3, 5, num_layers=layers, dtype="float64", seed=1)
    rng = np.random.default_rng(0)
    x, state0 = rng.standard_normal((2, 3)), states_of(layer, 2, seed=2)
    y, state = layer.step(x, state0)
    gy, gs = rng.standard_normal(y.shape), tuple(rng.standard_normal(a.shape) for a in as_list(state))
    gs = gs[0] if len(gs) == 1 else gs
    gx, g0, grads = layer.backward(gy, gs)
    want_y, _ = layer(x[None], state0)
    want_gx, want_g0, want_grads = layer.backward(gy[None], gs)
    np.testing.assert_array_equal(y, want_y[0])
    assert gx.shape == x.shape
    np.testing.assert_array_equal(gx, want_gx[0])
    for a, b in zip(as_list(g0), as_list(want_g0)):
        np.testing.assert_array_equal(a, b)
    assert all(np.array_equal(grads[n], want_grads[n]) for n in want_grads)


def test_a_step_is_never_padded_to_a_shape_bucket():
    layer = Recurrent("gru", 3, 4, dtype="float64", buckets=True)       # every call in chunks of the ladder
    x = np.random.default_rng(0).standard_normal((1, 2, 3))
    y, h = layer(x)
    assert layer._stack.runs[0][0].ex.ws.T == ladder(LADDER_TOP)[-1]     # a frame padded to the smallest step
    y_t, h_t = layer.step(x[0])
    assert layer._stack.runs[0][0].ex.ws.T == 1
    np.testing.assert_allclose(y_t, y[0], rtol=1e-12)
    np.testing.assert_allclose(h_t, h, rtol=1e-12)


def test_step_errors_are_clear():
    layer = Recurrent("lstm", 3, 4, dtype="float64")
    with pytest.raises(RnnGraphError, match=r"step\(\) takes one frame x \[B, input_size=3\], got shape \[5, 2, 3\]"):
        layer.step(np.zeros((5, 2, 3)))
    with pytest.raises(RnnGraphError, match=r"grad_y must have the shape of the output y, \[2, 4\]; got \[1, 2, 4\]"):
        layer.step(np.zeros((2, 3)))
        layer.backward(np.zeros((1, 2, 4)))
    with pytest.raises(RnnGraphError, match="bidirectional layer also reads the frames after it"):
        Recurrent("gru", 3, 4, bidirectional=True, dtype="float64").step(np.zeros((2, 3)))


def test_the_sampler_steps_and_draws_what_frame_by_frame_calls_draw():
    vocab = Vocab(sorted(set("the quick brown fox\n")))
    lm = CharLM({"cell": "lstm", "layers": 2, "hidden": 8, "dropout": 0.0, "dtype": "float64",
                 "vocab_size": len(vocab.chars), "seed": 0}).eval()
    got = generate(lm, vocab, "the", 25, temperature=0.7, seed=3)
    rng, out = np.random.default_rng(3), []
    logits, states = lm(vocab.encode("the")[:, None])
    for _ in range(25):
        z = logits[-1, 0] / 0.7
        p = np.exp(z - z.max())
        out.append(int(rng.choice(len(p), p=p / p.sum())))
        logits, states = lm(np.array([[out[-1]]]), states)          # a whole call of one frame
    assert got == vocab.decode(out)
