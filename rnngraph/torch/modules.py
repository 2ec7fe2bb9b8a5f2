"""torch.nn.Modules over rnngraph's recurrent layers: Recurrent (any cell) and LSTM, GRU and RNN with
torch.nn's constructors, call signatures, parameter names and layouts, so that state dicts load both
ways and torch optimisers, schedulers, clip_grad_norm_, .to(), .double() and DDP work as with any module.

Each module keeps one rnngraph layer (rnngraph.nn.Recurrent, "engine") per (device, dtype) it has run
on; the engine computes in place on the Parameters' memory, so an optimiser's in-place update is what
the next call (or CUDA-graph replay) reads, and a Parameter given new memory (.to(), .double(),
load_state_dict into a moved module) is rebound on the next call.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..errors import RnnGraphError
from ..nn.recurrent import Recurrent as Engine
from .autograd import RecurrentFunction, bind, on_stream

DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}
TORCH_ORDER = {"weight_ih": 0, "weight_hh": 1, "bias_ih": 2, "bias_hh": 3}   # torch.nn.RNNBase's parameter order


class Recurrent(torch.nn.Module):
    """Any cell (a built-in name, 'module:function', a function or a CellGraph) as a torch module:
    ``y, state_n = rnn(x, state0)`` with x [T, B, input_size] ([B, T, ...] with batch_first, [T, input_size]
    unbatched, or a PackedSequence), state0 None, a tensor [L·dirs, B, S] or a tuple in the cell's state
    order (the LSTM's (h0, c0)). mode ('staged' | 'graph' | 'naive') and loop are rnngraph's options for
    CUDA tensors; CPU tensors run the staged (or naive) schedule on numpy. Dropout masks come from the
    layer's own generator (seed), not torch's. Other keywords are the cell function's own options, e.g.
    ``Recurrent("slstm", 16, 32, heads=4)``."""

    def __init__(self, cell, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, *,
                 mode: str = "staged", loop: str = "auto", seed: int = 0, device=None, dtype=None, **cell_options):
        super().__init__()
        self._spec = (cell, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)
        self._cell_options = cell_options
        template = Engine(*self._spec, backend="numpy", dtype="float64", loop=loop,
                          mode="naive" if mode == "naive" else "staged", **cell_options)   # checks everything once
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.dropout = bool(bias), bool(batch_first), float(dropout)
        self.bidirectional = bool(bidirectional)
        self.cell, self.state_names, self.mode, self.loop, self.seed = template.cell, template.state_names, mode, loop, seed
        factory = {"device": device, "dtype": dtype if dtype is not None else torch.get_default_dtype()}
        self._groups = []                       # parameter names per (layer, direction)
        for per_l in template._layout:          # torch's order of its four stems first
            for per_d in per_l:
                group = sorted(per_d, key=lambda entry: TORCH_ORDER.get(entry[0].rsplit("_l", 1)[0], 4))
                for name, shape, _ in group:
                    self.register_parameter(name, torch.nn.Parameter(torch.empty(shape, **factory)))
                self._groups.append([name for name, _, _ in group])
        self._constants = [(name, start, stop, cell.inits[p]) for cell, per_l in zip(template.cells, template._layout)
                           for per_d in per_l for name, _, parts in per_d for p, start, stop in parts if p in cell.inits]
        self._engines: dict = {}
        self.reset_parameters()

    def reset_parameters(self):
        """torch.nn.RNNBase's initialisation: every parameter ~ U(-1/√H, 1/√H), from torch's generator;
        then the ones the cell starts at a constant (a norm's gain 1, its bias 0)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -bound, bound)
        with torch.no_grad():
            for name, start, stop, value in self._constants:
                getattr(self, name)[start:stop].fill_(value)

    def flatten_parameters(self):
        """Accepted for torch.nn.RNNBase compatibility; parameters are already used in place."""

    @property
    def all_weights(self) -> list:
        """Parameters per (layer, direction), as torch.nn.RNNBase.all_weights."""
        return [[self._parameters[n] for n in group] for group in self._groups]

    def extra_repr(self) -> str:
        s = f"cell={self.cell.name}, {self.input_size}, {self.hidden_size}"
        for k, default in (("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0.0),
                           ("bidirectional", False), ("mode", "staged"), ("loop", "auto")):
            if getattr(self, k) != default:
                s += f", {k}={getattr(self, k)!r}"
        return s + "".join(f", {k}={v!r}" for k, v in self._cell_options.items())

    # -- the call ---------------------------------------------------------------------------------
    @torch.compiler.disable      # torch.compile cannot trace rnngraph's kernels: one clean graph break here
    def forward(self, input, hx=None):
        packed = isinstance(input, PackedSequence)
        lengths = None
        if packed:
            x, lens = pad_packed_sequence(input, batch_first=self.batch_first)
            lengths = lens.numpy().astype(np.int64)
        else:
            x = input
        if not isinstance(x, torch.Tensor):
            raise RnnGraphError(f"{type(self).__name__} takes a torch.Tensor or a PackedSequence, got "
                                f"{type(x).__name__}; for numpy or cupy arrays use rnngraph.nn.Recurrent")
        unbatched = not packed and x.dim() == 2
        states = self._states(hx, unbatched)
        for name, h in zip(self.state_names, states):
            if h is not None and (h.dtype, h.device) != (x.dtype, x.device):
                raise RnnGraphError(f"{name}0 is {h.dtype} on {h.device} but the input is {x.dtype} on {x.device}; "
                                    f"pass {name}0.to(input)")
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        engine = self._engine(x)
        y, *finals = RecurrentFunction.apply(engine, lengths, tuple(self._parameters), x, *states,
                                             *self._parameters.values())
        if unbatched:
            y, finals = y.squeeze(0 if self.batch_first else 1), [f.squeeze(-2) for f in finals]
        state_n = finals[0] if len(finals) == 1 else tuple(finals)
        return (_repack(y, lens, input, self.batch_first) if packed else y), state_n

    def _states(self, hx, unbatched: bool) -> tuple:
        """hx as one entry (tensor or None) per state, with a batch axis."""
        n = len(self.state_names)
        parts = (None,) * n if hx is None else tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
        if len(parts) != n:
            names = ", ".join(f"{s}0" for s in self.state_names)
            raise RnnGraphError(f"{type(self).__name__} takes {n} initial state tensor(s) ({names}), got {len(parts)}")
        return tuple(p.unsqueeze(-2) if unbatched and p is not None else p for p in parts)

    def _engine(self, x: torch.Tensor) -> Engine:
        """The rnngraph layer for x's device and dtype, running on the Parameters' memory."""
        params = self._parameters
        first = next(iter(params.values()))
        if x.dtype not in DTYPES:
            raise RnnGraphError(f"rnngraph.torch runs float32, float64, bfloat16 and float16 tensors; the input is "
                                f"{x.dtype}")
        if (x.device, x.dtype) != (first.device, first.dtype):
            raise RnnGraphError(f"the input is {x.dtype} on {x.device} but the parameters are {first.dtype} on "
                                f"{first.device}; move one to the other (module.to(input.device, input.dtype), "
                                "or input.to(...))")
        key = (x.device, x.dtype)
        engine = self._engines.get(key)
        if engine is None:
            gpu = x.device.type == "cuda"
            mode = self.mode if gpu or self.mode == "naive" else "staged"
            with on_stream(x.device):       # its buffers on x's device
                engine = Engine(*self._spec, backend="cupy" if gpu else "numpy", dtype=DTYPES[x.dtype], mode=mode,
                                loop=self.loop, seed=self.seed, **self._cell_options)
            engine.torch_serial, engine.torch_params = 0, None
            self._engines[key] = engine
        bind(engine, params)          # device and dtype: checked above
        engine.train(self.training)
        return engine

    def __getstate__(self):
        """Pickling and copy.deepcopy leave the engines behind (CUDA graphs, cupy arrays); they are rebuilt
        on the next call."""
        state = self.__dict__.copy()
        state["_engines"] = {}
        return state


def _repack(y, lens, packed: PackedSequence, batch_first: bool) -> PackedSequence:
    """The padded output y as a PackedSequence with the input's batch sizes and sorting."""
    yt = y.transpose(0, 1) if batch_first else y
    if packed.sorted_indices is not None:
        yt, lens = yt.index_select(1, packed.sorted_indices), lens[packed.sorted_indices.cpu()]
    data = pack_padded_sequence(yt, lens, enforce_sorted=True).data
    return PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)


class LSTM(Recurrent):
    """torch.nn.LSTM's constructor and call: ``output, (h_n, c_n) = lstm(input, (h_0, c_0))``."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None, **options):
        if proj_size:
            raise RnnGraphError("rnngraph.torch.LSTM has no proj_size (projected LSTMs are not supported); "
                                "use proj_size=0, or torch.nn.LSTM")
        super().__init__("lstm", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype, **options)


class GRU(Recurrent):
    """torch.nn.GRU's constructor and call: ``output, h_n = gru(input, h_0)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, device=None, dtype=None, **options):
        super().__init__("gru", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype, **options)


class RNN(Recurrent):
    """torch.nn.RNN's constructor and call (nonlinearity 'tanh' or 'relu'): ``output, h_n = rnn(input, h_0)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None, **options):
        if nonlinearity not in ("tanh", "relu"):
            raise RnnGraphError(f"unknown nonlinearity {nonlinearity!r} for RNN; choose 'tanh' or 'relu'")
        super().__init__(f"rnn_{nonlinearity}", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device=device, dtype=dtype, **options)
        self.nonlinearity = nonlinearity
