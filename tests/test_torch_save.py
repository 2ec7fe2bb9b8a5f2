"""Whole models saved with torch.save(model) and loaded with torch.load(weights_only=True), allowing only the
model's own classes and the rnngraph.torch classes it holds: the same model, and training on equals never
saving (float64, with dropout, Adam). The pickled state is plain data: no rnngraph internals inside."""
import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch")
import rnngraph.torch as rt  # noqa: E402
from torch_cases import F64, assert_same, mgu_cell  # noqa: E402

RNNS = {"LSTM": lambda: rt.LSTM(4, 5, num_layers=2, dropout=0.3, dtype=F64),
        "GRU": lambda: rt.GRU(4, 5, num_layers=2, bidirectional=True, dtype=F64),
        "user_mgu": lambda: rt.Recurrent(mgu_cell, 4, 5, num_layers=2, dropout=0.3, dtype=F64),
        "LSTM_proj": lambda: rt.LSTM(4, 5, proj_size=3, dtype=F64),
        "LSTMCell": lambda: rt.LSTMCell(4, 5, dtype=F64)}


class CharModel(torch.nn.Module):
    """Embedding, an rnngraph.torch recurrent module, a Linear head."""

    def __init__(self, rnn):
        super().__init__()
        self.emb, self.rnn = torch.nn.Embedding(12, 4, dtype=F64), rnn
        out = rnn(torch.zeros(1, 1, 4, dtype=F64))[0].shape[-1] if not isinstance(rnn, rt.LSTMCell) else 5
        self.head = torch.nn.Linear(out, 12, dtype=F64)

    def forward(self, tokens):                        # tokens [T, B]
        x = self.emb(tokens)
        if isinstance(self.rnn, rt.LSTMCell):
            state, ys = None, []
            for t in range(x.shape[0]):
                state = self.rnn(x[t], state)
                ys.append(state[0])
            return self.head(torch.stack(ys))
        return self.head(self.rnn(x)[0])


def train(model, steps, seed):
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    g, losses = torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        tokens = torch.randint(0, 12, (7, 3), generator=g)
        loss = torch.nn.functional.cross_entropy(model(tokens[:-1]).reshape(-1, 12), tokens[1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def save_and_load(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    with torch.serialization.safe_globals([CharModel, torch.nn.Embedding, torch.nn.Linear, type(model.rnn)]):
        return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("kind", RNNS)
def test_saved_whole_loads_with_weights_only_and_trains_on_as_never_saved(kind):
    torch.manual_seed(0)
    model = CharModel(RNNS[kind]())
    train(model, 3, seed=1)                           # the engines exist, the dropout generator has moved
    loaded = save_and_load(model)
    assert type(loaded.rnn) is type(model.rnn) and loaded.rnn._engines == {}
    assert repr(loaded) == repr(model)
    assert_same(list(loaded.parameters()), list(model.parameters()), rtol=0)
    assert_same(train(loaded, 4, seed=2), train(model, 4, seed=2), rtol=0, what="loss")
    assert_same(list(loaded.parameters()), list(model.parameters()), rtol=0)


def test_a_weights_only_load_needs_only_the_rnngraph_torch_class_named():
    torch.manual_seed(0)
    model = CharModel(rt.Recurrent(mgu_cell, 4, 5, dtype=F64))
    model(torch.zeros(2, 1, dtype=torch.long))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    with torch.serialization.safe_globals([CharModel, torch.nn.Embedding, torch.nn.Linear]):
        with pytest.raises(pickle.UnpicklingError, match="rnngraph.torch.modules.Recurrent"):
            torch.load(buf, weights_only=True)


def test_the_pickled_state_is_plain_data():
    rnn = rt.Recurrent(mgu_cell, 4, 5, num_layers=2)
    rnn(torch.zeros(3, 2, 4))
    state = rnn.__getstate__()
    assert state["_engines"] == {} and state["_graphs"] is None
    assert isinstance(state["_cell_data"], list) and state["_cell_data"][0]["format"] == "rnngraph-cell"
    assert rt.GRU(4, 5).__getstate__()["_cell_data"] == "gru"           # a built-in by name

    def plain(v):
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        if isinstance(v, (list, tuple, set)):
            return all(plain(x) for x in v)
        return v is None or isinstance(v, (bool, int, float, str, torch.Tensor))
    own = {k: v for k, v in state.items() if not k.startswith("_") or k in ("_cell_data", "_sizes", "_groups",
                                                                          "_names", "_constants", "_rng")}
    assert plain(own), own


def test_deepcopy_keeps_the_dropout_generator_s_state():
    torch.manual_seed(0)
    rnn = rt.GRU(4, 5, num_layers=3, dropout=0.5, dtype=F64)
    x = torch.randn(6, 2, 4, dtype=F64)
    rnn(x)
    twin = copy.deepcopy(rnn)
    assert_same([twin(x)[0]], [rnn(x)[0]], rtol=0)                 # the same next masks


def test_numpy_sizes_and_seed_are_stored_as_plain_numbers():
    import numpy as np
    rnn = rt.GRU(np.int64(4), np.int64(5), num_layers=np.int64(2), seed=np.int64(3), dtype=F64)
    buf = io.BytesIO()
    torch.save(rnn, buf)
    buf.seek(0)
    with torch.serialization.safe_globals([rt.GRU]):
        loaded = torch.load(buf, weights_only=True)
    x = torch.randn(3, 2, 4, dtype=F64)
    assert_same([loaded(x)[0]], [rnn(x)[0]], rtol=0)
