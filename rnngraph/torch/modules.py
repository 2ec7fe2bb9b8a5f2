"""torch.nn.Modules over rnngraph's recurrent layers: Recurrent (any cell) and LSTM, GRU and RNN with
torch.nn's constructors, call signatures, parameter names and layouts, so that state dicts load both
ways and torch optimisers, schedulers, clip_grad_norm_, .to(), .double(), autocast and DDP work as with any
module; ``step`` advances one frame for loops that feed outputs back.

Each module keeps one rnngraph layer (rnngraph.nn.Recurrent, "engine") per (device, compute dtype, TF32)
it has run with; the engine computes in place on the Parameters' memory, so an optimiser's in-place update
is what the next call (or CUDA-graph replay) reads, and a Parameter given new memory (.to(), .double(),
load_state_dict into a moved module) is rebound on the next call. Under autocast the engine runs on a copy of
the parameters in the autocast dtype, refilled each call, and their gradients come back in their own dtype.
A module pickles as plain data (its cell by name or as stored JSON, its options, its Parameters), so
torch.save(model) loads with torch.load(weights_only=True); the engines are rebuilt on first use.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..errors import RnnGraphError
from ..ir.cellio import cell_from_dict, cell_to_dict
from ..ir.cells import CELLS, lstm_cell
from ..ir.loading import load_cell
from ..nn.recurrent import Recurrent as Engine
from ..run.backends import MODES, cpu_backend, get_backend
from .autograd import RecurrentFunction, on_stream
from .precision import autocast_input, compute_dtype, tf32_allowed

DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}
TORCH_ORDER = {"weight_ih": 0, "weight_hh": 1, "bias_ih": 2, "bias_hh": 3}   # torch.nn.RNNBase's parameter order


class Recurrent(torch.nn.Module):
    """Any cell (a built-in name, 'module:function', a function or a CellGraph) as a torch module:
    ``y, state_n = rnn(x, state0)`` with x [T, B, input_size] ([B, T, ...] with batch_first, [T, input_size]
    unbatched, or a PackedSequence), state0 None, a tensor [L·dirs, B, S] or a tuple in the cell's state
    order (the LSTM's (h0, c0)). ``y_t, state = rnn.step(x_t, state)`` advances one frame (x_t [B, input_size]).

    mode: None (default) runs graph mode on CUDA tensors and the staged schedule on CPU tensors; 'staged'
    (eager kernels), 'graph' or 'naive' choose one. Graph mode records each call shape's forward and backward
    once as CUDA graphs and replays them: up to 4 shapes (T, B) as they come, then every call bounded (T in a
    ladder of chunk lengths, B padded to a step of 4, 8, 12, 16, 24, 32, 48, 64, 96, ... unless every call has
    the same B), long calls in chunks of each loop strategy's length (RNNGRAPH_CHUNK_FRAMES sets one), and the
    recordings kept within RNNGRAPH_GRAPH_CACHE_BYTES (2G; least recently used dropped first). loop is
    rnngraph's loop strategy. Inside torch.autocast the layer computes in the autocast dtype (float32
    parameters, their gradients in float32, outputs in that dtype); float32 on CUDA uses TF32 where torch would
    for the same layer (rnngraph.torch.precision). Dropout masks come from the module's own generator (seed),
    not torch's. Other keywords are the cell function's own options, e.g. ``Recurrent("slstm", 16, 32, heads=4)``."""

    _strip = ""             # what the engine's parameter names carry that the module's do not (cells: '_l0')

    def __init__(self, cell, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, *,
                 mode: str | None = None, loop: str = "auto", seed: int = 0, device=None, dtype=None,
                 **cell_options):
        super().__init__()
        if mode is not None and mode not in MODES:
            raise RnnGraphError(f"unknown mode {mode!r}; choose None (graph on CUDA, staged on the CPU) or one of "
                                f"{', '.join(MODES)}")
        template = Engine(cell, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                          backend="numpy", dtype="float64", loop=loop,
                          mode="naive" if mode == "naive" else "staged", **cell_options)   # checks everything once
        self._cell_options = dict(cell_options)         # plain data: pickled, and given to the cell again
        self._cell_data = cell if isinstance(cell, str) and cell in CELLS else [cell_to_dict(c) for c in template.cells]
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.dropout = bool(bias), bool(batch_first), float(dropout)
        self.bidirectional = bool(bidirectional)
        self.state_names, self.mode, self.loop = template.state_names, mode, loop
        self.seed = None if seed is None else int(seed)         # plain types only: they are pickled
        self._sizes = (self.input_size, self.hidden_size, self.num_layers, self.bias, self.batch_first, self.dropout,
                       self.bidirectional)
        self._graphs = template.cells
        factory = {"device": device, "dtype": dtype if dtype is not None else torch.get_default_dtype()}
        self._groups, self._names = [], []      # module parameter names per (layer, direction); the engine's
        for per_l in template._layout:          # torch's order of its four stems first
            for per_d in per_l:
                group = sorted(per_d, key=lambda entry: TORCH_ORDER.get(entry[0].rsplit("_l", 1)[0], 4))
                for name, shape, _ in group:
                    self.register_parameter(self._own(name), torch.nn.Parameter(torch.empty(shape, **factory)))
                self._groups.append([self._own(name) for name, _, _ in group])
                self._names += [name for name, _, _ in group]
        self._constants = [(self._own(name), start, stop, cell.inits[p]) for cell, per_l in
                           zip(template.cells, template._layout) for per_d in per_l for name, _, parts in per_d
                           for p, start, stop in parts if p in cell.inits]
        self._rng = np.random.default_rng(seed)     # dropout masks, one generator for every engine
        self._engines: dict = {}
        self.reset_parameters()

    def _own(self, engine_name: str) -> str:
        return engine_name[:-len(self._strip)] if self._strip else engine_name

    @property
    def cell(self):
        """The cell graph of the first layer."""
        return self._cells()[0]

    def _cells(self) -> list:
        """One CellGraph per layer, made again from the stored data after unpickling."""
        if self._graphs is None:
            if isinstance(self._cell_data, str):
                cells, size = [], self.input_size
                for _ in range(self.num_layers):
                    cells.append(load_cell(self._cell_data, size, self.hidden_size, self.bias, **self._cell_options))
                    size = cells[-1].op(cells[-1].outputs[0]).size * (2 if self.bidirectional else 1)
                self._graphs = cells
            else:
                self._graphs = [cell_from_dict(d) for d in self._cell_data]
        return self._graphs

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
                           ("bidirectional", False), ("mode", None), ("loop", "auto")):
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
        _check_tensor(type(self).__name__, x)
        unbatched = not packed and x.dim() == 2
        states = self._states(hx, unbatched)
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        y, finals = self._call(x, states, lengths, step=False)
        if unbatched:
            y, finals = y.squeeze(0 if self.batch_first else 1), [f.squeeze(-2) for f in finals]
        state_n = finals[0] if len(finals) == 1 else tuple(finals)
        return (_repack(y, lens, input, self.batch_first) if packed else y), state_n

    @torch.compiler.disable
    def step(self, input, hx=None):
        """One frame with autograd, for loops that feed outputs back (sampling, decoding, reinforcement
        learning, streaming): input [B, input_size] (or [input_size]), hx as forward's (None, or states
        [L, B, S]) -> (output [B, F], state_n), the numbers of ``forward(input[None], hx)`` with output[0]. On
        CUDA in graph mode a step replays one recording (T = 1). Not for bidirectional layers.

        Example::

            y, state = lstm.step(x0)
            for t in range(100):
                y, state = lstm.step(embed(head(y).argmax(-1)), state)
        """
        _check_tensor(type(self).__name__, input)
        if input.dim() not in (1, 2):
            raise RnnGraphError(f"step() takes one frame [B, {self.input_size}] or [{self.input_size}], got shape "
                                f"{list(input.shape)}; for a sequence call the module itself")
        unbatched = input.dim() == 1
        states = self._states(hx, unbatched)
        y, finals = self._call(input.unsqueeze(0) if unbatched else input, states, None, step=True)
        if unbatched:
            y, finals = y.squeeze(0), [f.squeeze(-2) for f in finals]
        return y, (finals[0] if len(finals) == 1 else tuple(finals))

    def _call(self, x, states: tuple, lengths, step: bool):
        """(y, [final states]) of the engine for x's device and the compute dtype, through autograd."""
        params = tuple(self._parameters.values())
        dtype = compute_dtype(params[0].device, params[0].dtype)
        if dtype != params[0].dtype:            # autocast: inputs cast as torch casts them, differentiably
            x, states = autocast_input(x, dtype), tuple(autocast_input(s, dtype) for s in states)
        for name, h in zip(self.state_names, states):
            if h is not None and (h.dtype, h.device) != (x.dtype, x.device):
                raise RnnGraphError(f"{name}0 is {h.dtype} on {h.device} but the input is {x.dtype} on {x.device}; "
                                    f"pass {name}0.to(input)")
        engine = self._engine(x, params[0], dtype)
        y, *finals = RecurrentFunction.apply(engine, lengths, step, tuple(self._names), x, *states, *params)
        return y, finals

    def _states(self, hx, unbatched: bool) -> tuple:
        """hx as one entry (tensor or None) per state, with a batch axis."""
        n = len(self.state_names)
        parts = (None,) * n if hx is None else tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
        if len(parts) != n:
            names = ", ".join(f"{s}0" for s in self.state_names)
            raise RnnGraphError(f"{type(self).__name__} takes {n} initial state tensor(s) ({names}), got {len(parts)}")
        return tuple(p.unsqueeze(-2) if unbatched and p is not None else p for p in parts)

    def _engine(self, x: torch.Tensor, first: torch.Tensor, dtype: torch.dtype) -> Engine:
        """The rnngraph layer for x's device and the compute dtype (TF32 or not), made on first use."""
        if x.dtype not in DTYPES:
            raise RnnGraphError(f"rnngraph.torch runs float32, float64, bfloat16 and float16 tensors; the input is "
                                f"{x.dtype}")
        if (x.device, x.dtype) != (first.device, dtype):
            layer = (f"the layer computes in {dtype} under autocast (its parameters are {first.dtype})"
                     if dtype != first.dtype else f"the parameters are {first.dtype}")
            raise RnnGraphError(f"the input is {x.dtype} on {x.device} but {layer} on {first.device}; move one to "
                                "the other (module.to(input.device, input.dtype), or input.to(...))")
        gpu = x.device.type == "cuda"
        tf32 = gpu and dtype == torch.float32 and tf32_allowed(self.cell.name)
        key = (x.device, dtype, tf32)
        engine = self._engines.get(key)
        if engine is None:
            mode = self.mode or ("graph" if gpu else "staged")
            mode = mode if gpu or mode == "naive" else "staged"
            with on_stream(x.device):       # its buffers on x's device
                engine = Engine(self._cells(), *self._sizes, backend="cupy" if gpu else _host_backend(mode),
                                dtype=DTYPES[dtype], mode=mode, loop=self.loop, seed=self.seed)
            if tf32 and getattr(engine.backend, "blas", None) is not None:
                engine.backend.blas.tf32 = True     # before anything is recorded: it is a separate engine
            engine.rng = self._rng
            engine.torch_serial, engine.torch_params, engine.torch_dtype, engine.torch_copy = 0, None, dtype, None
            self._engines[key] = engine
        engine.train(self.training)
        return engine

    # -- pickling: plain data only -------------------------------------------------------------------
    def __getstate__(self):
        """The module's state as plain data, so that torch.load(weights_only=True) reads it with only the
        rnngraph.torch classes allowed: the engines (CUDA graphs, cupy arrays) and cell graphs are left
        behind and made again on first use, the dropout generator kept as its state (a dict of ints)."""
        state = self.__dict__.copy()
        state.update(_engines={}, _graphs=None, _rng=self._rng.bit_generator.state)
        return state

    def __setstate__(self, state):
        rng = np.random.default_rng()
        rng.bit_generator.state = state["_rng"]
        super().__setstate__({**state, "_rng": rng})


def _host_backend(mode: str):
    """The backend for CPU tensors: the compiled CPU backend where it runs here (its BLAS on one thread, since torch's
    own pool computes the rest of the model on the same cores), else numpy."""
    name = cpu_backend()
    return get_backend(name, mode, **({"blas_threads": 1} if name == "cpu" else {}))


def _check_tensor(owner: str, x):
    if not isinstance(x, torch.Tensor):
        raise RnnGraphError(f"{owner} takes a torch.Tensor or a PackedSequence, got {type(x).__name__}; for "
                            "numpy or cupy arrays use rnngraph.nn.Recurrent")


def _repack(y, lens, packed: PackedSequence, batch_first: bool) -> PackedSequence:
    """The padded output y as a PackedSequence with the input's batch sizes and sorting."""
    yt = y.transpose(0, 1) if batch_first else y
    if packed.sorted_indices is not None:
        yt, lens = yt.index_select(1, packed.sorted_indices), lens[packed.sorted_indices.cpu()]
    data = pack_padded_sequence(yt, lens, enforce_sorted=True).data
    return PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)


class LSTM(Recurrent):
    """torch.nn.LSTM's constructor and call: ``output, (h_n, c_n) = lstm(input, (h_0, c_0))``; proj_size > 0
    projects h as torch does (weight_hr_l{k} [proj_size, hidden_size]; h_0 [L·dirs, B, proj_size], c_0
    [L·dirs, B, hidden_size])."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None, **options):
        super().__init__(lstm_cell(proj_size), input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device=device, dtype=dtype, **options)
        self.proj_size = int(proj_size)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", proj_size={self.proj_size}" if self.proj_size else "")


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
