"""One-frame cells with torch.nn.LSTMCell's, GRUCell's and RNNCell's constructors, calls, parameter names
(weight_ih, weight_hh, bias_ih, bias_hh) and initialisation: a one-layer Recurrent advanced by ``step``, so
that on CUDA a call is one recorded graph replay (graph mode, T = 1) rather than a kernel per op."""
from __future__ import annotations

import torch

from ..errors import RnnGraphError
from .modules import Recurrent


class _Cell(Recurrent):
    """A one-layer Recurrent called one frame at a time: input [B, input_size] or [input_size]; each state
    [B, hidden_size] (or [hidden_size]), or None for zeros."""

    _strip = "_l0"          # torch's cells name their parameters without the layer suffix

    def __init__(self, cell: str, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None,
                 **options):
        super().__init__(cell, input_size, hidden_size, 1, bias, device=device, dtype=dtype, **options)

    @torch.compiler.disable
    def forward(self, input, hx=None):
        name = type(self).__name__
        if not isinstance(input, torch.Tensor) or input.dim() not in (1, 2):
            got = list(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
            raise RnnGraphError(f"{name} takes one frame [B, {self.input_size}] or [{self.input_size}], got {got}")
        parts = (None,) * len(self.state_names) if hx is None else tuple(hx) if isinstance(hx, (tuple, list)) \
            else (hx,)
        for s, h in zip(self.state_names, parts):
            if h is not None and h.dim() != input.dim():
                raise RnnGraphError(f"{name}: {s} must be [B, {self.hidden_size}] for input [B, {self.input_size}] "
                                    f"([{self.hidden_size}] for unbatched input), got {list(h.shape)}")
        _, state = self.step(input, tuple(None if h is None else h.unsqueeze(0) for h in parts))   # [1, B, S]
        return tuple(s.squeeze(0) for s in state) if isinstance(state, tuple) else state.squeeze(0)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class LSTMCell(_Cell):
    """torch.nn.LSTMCell: ``h_1, c_1 = cell(input, (h_0, c_0))``, input [B, input_size], each state
    [B, hidden_size] (hx None: zeros)."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None, **options):
        super().__init__("lstm", input_size, hidden_size, bias, device, dtype, **options)


class GRUCell(_Cell):
    """torch.nn.GRUCell: ``h_1 = cell(input, h_0)``."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None, **options):
        super().__init__("gru", input_size, hidden_size, bias, device, dtype, **options)


class RNNCell(_Cell):
    """torch.nn.RNNCell (nonlinearity 'tanh' or 'relu'): ``h_1 = cell(input, h_0)``."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None, **options):
        if nonlinearity not in ("tanh", "relu"):
            raise RnnGraphError(f"unknown nonlinearity {nonlinearity!r} for RNNCell; choose 'tanh' or 'relu'")
        super().__init__(f"rnn_{nonlinearity}", input_size, hidden_size, bias, device, dtype, **options)
        self.nonlinearity = nonlinearity

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.nonlinearity == "tanh" else f", nonlinearity={self.nonlinearity}")
