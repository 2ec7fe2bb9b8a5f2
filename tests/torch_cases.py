"""Shared cases of the rnngraph.torch tests: torch.nn/rnngraph.torch layer pairs, a fixed loss over every
output, equality to a relative tolerance, user cells. Imported by test files after
pytest.importorskip("torch")."""
import socket

import torch

import rnngraph
import rnngraph.torch as rt
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

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


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


class Tagger(torch.nn.Module):
    """Embedding, a 2-layer bidirectional LSTM of the given class, a Linear head."""

    def __init__(self, lstm_cls):
        super().__init__()
        self.emb = torch.nn.Embedding(12, 4, dtype=F64)
        self.lstm = lstm_cls(4, 5, num_layers=2, bidirectional=True, dtype=F64)
        self.head = torch.nn.Linear(10, 12, dtype=F64)

    def forward(self, tokens):
        return self.head(self.lstm(self.emb(tokens))[0])
