"""PyTorch-shaped recurrent layers: Recurrent (any cell), LSTM, GRU and RNN, with explicit backward.

Shapes follow PyTorch exactly: x is [T, B, D] ([B, T, D] with batch_first), y is [T, B, dirs·H]
(or [B, T, dirs·H]) and every state (h0, c0, h_n, c_n) is [num_layers·num_directions, B, H]
whatever batch_first is. Parameters use PyTorch's names, shapes and gate order.

The layers build no autograd graph: ``backward`` differentiates the most recent call. Truncated
BPTT over a stream is therefore the plain loop ``y, state = layer(x_chunk, state)``; the backward
of a chunk covers that chunk only, and ``grad_state0`` is what would cross into the previous chunk.
A state carries what the cell can still read across calls. For PyTorch's cells (every state read
one frame back) that is its last frame, [L·dirs, B, S]. A cell that reads a state up to D ≥ 2
frames back (``h.ago(D)``) carries its last D frames, oldest first: h_n is [D, L·dirs, B, S], so
``layer(x[:4])`` then ``layer(x[4:], state)`` equals ``layer(x)``. Such a state's h0 may be given
as [D, L·dirs, B, S] or as [L·dirs, B, S] (one value for every frame before the call), and its
gradient grad_state0 comes back in the shape it was given ([D, ...] when it was None).
"""
from __future__ import annotations

from ..arrays import HALF_DTYPES, check_state_dict, float_dtype, make_rng
from ..errors import RnnGraphError
from ..ir.cells import lstm_cell
from ..ir.loading import load_cell
from ..run.backends import get_backend
from . import checks as chk
from .checks import check_finite
from .grads import GradGather, grad_views
from .init import init_orthogonal_, init_uniform_
from .layers import Parameterized
from .buckets import Padding, Policy
from .stacking import Frames, Stack


def detach(state):
    """A copy of a state (array, tuple of arrays or None) for the next chunk of truncated BPTT.

    The layers hold no autograd graph, so this only makes the cut explicit and guards the arrays
    against later in-place updates: ``y, state = layer(x_k, detach(state))``.
    """
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(detach(s) for s in state)
    return state.copy()


class Recurrent(Parameterized):
    """A stack of recurrent layers running any cell, with PyTorch's layer conventions.

    cell: a built-in name (see rnngraph.CELLS), 'module:function', a cell function
    ``fn(input_size, hidden_size, bias=True) -> CellGraph``, a CellGraph (one layer, or layers
    whose inputs have the cell's input size) or a list of CellGraphs, one per layer (as a checkpoint
    stores them). Keyword options: ``backend`` 'numpy' | 'cupy' | 'auto' or a backend object
    (``layer.backend_name`` says which was picked), ``dtype`` 'float32' (default, as torch) or 'float64',
    ``mode`` 'staged' | 'naive' | 'graph' (cupy only; with a backend object, its own mode), ``loop`` the
    loop strategy ('auto' | 'stages' | 'elementwise' | 'scan' | 'persistent'; ``layer.loop_strategy`` says
    what the last call ran and ``layer.loop_note`` why a persistent loop ran frame by frame), ``seed`` for
    the layer's generator (initialisation and dropout masks), ``init`` 'uniform' (torch's U(±1/√H)) |
    'orthogonal' | a function of the layer, ``buckets`` bounds what calls of many shapes record: B padded to a
    step of a ladder, T run in a ladder of chunks (rnngraph.nn.buckets), so that a few recorded graphs serve every
    shape: True, False, or None (default: in graph mode, from a fifth distinct shape on), ``recompute`` keeps
    memory bounded over long sequences: the backward runs the forward again chunk by chunk instead of storing
    every value (True, False, or None (default): where the values a call stores would exceed
    RNNGRAPH_STORE_BYTES, by default a sixteenth of the device's memory and at least 2 GiB;
    ``layer.recomputed`` says whether the last call did). Other keywords are the cell function's own options,
    passed on to it for every layer, e.g. ``Recurrent("slstm", 8, 64, heads=8)``.

    Example::

        layer = Recurrent("gru", 8, 16, num_layers=2, bidirectional=True, dtype="float64")
        y, h_n = layer(x)                       # x [T, B, 8] -> y [T, B, 32], h_n [4, B, 16]
        grad_x, grad_h0, grads = layer.backward(grad_y)
        y_t, h = Recurrent("gru", 8, 16).step(x_t, h)   # one frame (one direction): x_t [B, 8] -> y_t [B, 16]
    """

    def __init__(self, cell, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, *,
                 backend: str = "numpy", dtype="float32", mode: str | None = None, loop: str = "auto",
                 seed: int = 0, init="uniform", buckets: bool | None = None, recompute: bool | None = None,
                 **cell_options):
        super().__init__()
        self.cell_options = cell_options
        chk.check_config(input_size, hidden_size, num_layers, dropout)
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.dropout = bool(bias), bool(batch_first), float(dropout)
        self.bidirectional, self.num_directions = bool(bidirectional), 2 if bidirectional else 1
        self.backend = _make_backend(backend, mode)
        self.backend_name = self.backend.name
        self.dtype = float_dtype(dtype, half=True)
        if self.dtype.name in HALF_DTYPES and (why := self.backend.half_problem(self.dtype)):
            raise RnnGraphError(f"dtype {self.dtype.name} does not run here: {why}")
        self.mode, self.loop = self.backend.mode, loop
        if buckets not in (None, True, False):
            raise RnnGraphError(f"buckets must be True, False or None (automatic in graph mode), got {buckets!r}")
        self.buckets = buckets if buckets is not None or self.mode == "graph" else False
        self._shapes = Policy(self.buckets)
        self.rng = make_rng(seed)
        self.stream_window = None       # (offset, total): dropout as the part of a larger batch (a rank's)
        self.training = True
        self.check_finite = False       # True: raise on NaN/inf in inputs, outputs and gradients
        self.cells = self._load_cells(cell)
        self.cell = self.cells[0]
        self.state_names = tuple(self.cell.states)
        if recompute not in (None, True, False):
            raise RnnGraphError(f"recompute must be True, False or None (where a call's values exceed "
                                f"RNNGRAPH_STORE_BYTES), got {recompute!r}")
        self._stack = Stack(self.cells, self.backend, self.num_directions, loop, recompute)
        self._layout = [[_param_layout(c, _suffix(l, d)) for d in range(self.num_directions)]
                        for l, c in enumerate(self.cells)]
        self._params = {name: self.backend.zeros(shape, self.dtype)
                        for per_l in self._layout for per_d in per_l for name, shape, _ in per_d}
        self._views = self._cell_params()   # stable objects: the executor uses parameters in place
        self._last = None
        self._gather = GradGather(self.backend, self._layout, self.dtype)
        chk.resolve_init(init, _INIT)(self)

    # the loop strategy the last call ran (before any, the plan's), and why 'persistent' ran as 'stages'
    loop_strategy = property(lambda self: self._stack.runs[0][0].ex.loop_runs)
    loop_note = property(lambda self: self._stack.runs[0][0].ex.loop_note)
    recomputed = property(lambda self: self._stack.runs[0][0].ex.recomputed)
    # whether the last call's backward spent what another backward of it would need (a call in chunks: its
    # stored values), so that differentiating it again needs the call run again
    spent = property(lambda self: any(r.ex.chunked and r.ex.chunks.last is None for l in self._stack.runs for r in l))

    def _load_cells(self, spec) -> list:
        """One cell per layer, built for that layer's input size, or taken from a list (one per layer)."""
        per_layer = isinstance(spec, (list, tuple))
        if per_layer and len(spec) != self.num_layers:
            raise RnnGraphError(f"a list of cells needs one cell per layer: got {len(spec)} for num_layers="
                                f"{self.num_layers}; pass {self.num_layers} cells, or one cell for every layer")
        cells, size = [], self.input_size
        for l in range(self.num_layers):
            spec_l = spec[l] if per_layer else spec
            cell = load_cell(spec_l, size, self.hidden_size, self.bias, **self.cell_options)
            chk.check_cell(cell, size, l)
            if cells and _state_kinds(cell) != _state_kinds(cells[0]):
                raise RnnGraphError(f"layer {l}'s cell '{cell.name}' has states {_state_kinds(cell)} but layer 0's "
                                    f"has {_state_kinds(cells[0])}; every layer needs the same states "
                                    "(name: features, frames carried)")
            cells.append(cell)
            size = cell.op(cell.outputs[0]).size * self.num_directions
        return cells

    # -- parameters: parameters(), state_dict() and load_state_dict() come from Parameterized ----
    def _cell_params(self) -> list:
        """[l][d]: cell param -> row-block view of its PyTorch-layout parameter (contiguous rows)."""
        views = []
        for per_l in self._layout:
            views.append([])
            for per_d in per_l:
                v = {}
                for name, _, parts in per_d:
                    for p, start, stop in parts:
                        v[p] = self._params[name][start:stop]
                views[-1].append(v)
        return views

    def share_parameters(self, arrays: dict):
        """Runs on `arrays` (name -> array of this layer's backend, dtype and shape, every parameter) in
        place from now on, without copying: e.g. views of torch Parameters (rnngraph.torch). Updating
        them in place updates the layer; graph-mode replays see it."""
        check_state_dict(type(self).__name__, {k: p.shape for k, p in self._params.items()}, arrays, True)
        for k, a in arrays.items():
            chk.check_array(k, a, self.backend, self.dtype)
        self._params = {k: arrays[k] for k in self._params}
        self._views = self._cell_params()

    # -- modes --------------------------------------------------------------------------------
    def train(self, mode: bool = True):
        """Training mode (dropout between layers active), as torch's Module.train()."""
        self.training = bool(mode)
        return self

    def eval(self):
        """Inference mode (no dropout), as torch's Module.eval()."""
        return self.train(False)

    # -- forward and backward -----------------------------------------------------------------
    def __call__(self, x, state=None, lengths=None):
        return self.forward(x, state, lengths)

    def forward(self, x, state=None, lengths=None):
        """x: [T, B, D] ([B, T, D] with batch_first); state: h0, or a tuple in cell.states order
        (LSTM: (h0, c0)), each [L·dirs, B, S], or None for zeros; lengths: [B] ints, or None.
        Returns (y, state_n) with y [T, B, dirs·F] (or [B, T, dirs·F]) and state_n shaped like state.
        Returned arrays are fresh copies: keep them as long as you like."""
        x = chk.check_array("x", x, self.backend, self.dtype)
        chk.check_input(x, self.input_size, self.batch_first)
        xt = x.transpose(1, 0, 2) if self.batch_first else x
        y, finals = self._run(xt, state, lengths, self._shapes.pads(*xt.shape[:2]), step=False)
        return self._to_user(y), self._pack(finals)

    def step(self, x, state=None):
        """One frame, for loops that feed outputs back (sampling, decoding, streaming): x [B, D] ->
        (y [B, F], state_n), the same numbers as ``forward(x[None], state)`` with y[0]; never padded to a
        shape bucket, so graph mode replays one recording of T = 1. ``backward(grad_y [B, F],
        grad_state_n)`` then gives grad_x [B, D]. A bidirectional layer has no one-frame step.

        Example::

            y, state = layer.step(x_t)             # x_t [B, D]
            y, state = layer.step(y_to_x(y), state)
        """
        if self.bidirectional:
            raise RnnGraphError("step() advances a layer one frame forward in time; a bidirectional layer also "
                                "reads the frames after it: call the layer on the whole sequence instead")
        x = chk.check_array("x", x, self.backend, self.dtype)
        if x.ndim != 2 or x.shape[1] != self.input_size:
            raise RnnGraphError(f"step() takes one frame x [B, input_size={self.input_size}], got shape "
                                f"{list(x.shape)}; for a sequence call the layer itself")
        y, finals = self._run(x[None], state, None, False, step=True)
        return y[0], self._pack(finals)

    def _run(self, xt, state, lengths, may_pad: bool, step: bool):
        """The forward of time-major xt [T, B, D], bounded where may_pad says (B padded to a bucket, T in the
        executors' ladder of chunks), B padded where the executors run more rows faster (Stack.batch_rows); keeps
        what backward needs. Returns (y [T, B, dirs·F], state -> final)."""
        T, B = xt.shape[:2]
        init = self._unpack(state, "{}0", T, B, every_frame=True)
        lengths = chk.check_lengths(lengths, T, B)
        if self.check_finite:
            for name, a in [("x", xt)] + [(f"{s}0", a) for s, a in init.items() if a is not None]:
                check_finite(name, a)
        spread = {s for s, a in init.items() if a is not None and a.ndim < len(self._stack.shape(s, B))}
        rows = self._shapes.rows(B) if may_pad else B
        if not step and self.stream_window is None:     # where the GPU's loop runs more rows faster
            rows = self._stack.batch_rows(rows, xt.dtype)
        pad = Padding(self.backend.xp, T, B, rows) if rows != B else None
        if pad:         # masks only where the caller gave lengths: added sequences need none (Frames)
            xt, init = pad.frames(xt), pad.states(init)
        frames = Frames(self.backend.xp, T, rows, pad.lengths(lengths) if pad else lengths, masked=lengths is not None)
        dropout = self.dropout if self.training else 0.0
        self._last = None               # the executors' workspaces are about to change
        y, finals = self._stack.forward(self._views, xt, init, frames, dropout, self.rng,
                                          None if pad else self.stream_window, ladder=may_pad)
        if pad:
            y, finals = pad.unframes(y), pad.unstates(finals)
        self._last = (frames, y.shape, spread, pad, step)
        if self.check_finite:
            chk.check_stored(self._stack.runs, self.dtype)
            for n, a in [("output y", y)] + [(f"final state {s}_n", a) for s, a in finals.items()]:
                check_finite(n, a)
        return y, finals

    def backward(self, grad_y, grad_state_n=None):
        """Gradients of the most recent call (or step). grad_y: like y (or None); grad_state_n: like
        state_n (or None; entries may be None). Returns (grad_x like x, grad_state0 like state, grads: name
        -> array keyed like parameters()); grads are also kept in ``layer.grads``."""
        gx, ginit = self.backward_flat(grad_y, grad_state_n)
        self.grads = grad_views(self.grad_flat, self._params)
        return gx, ginit, dict(self.grads)

    def backward_flat(self, grad_y, grad_state_n=None):
        """backward(), its parameter gradients left as one fresh buffer, ``layer.grad_flat`` [Σ sizes]: each
        parameter's after the one before it, in parameters() order and PyTorch's layout (rnngraph.torch splits it
        as tensors; backward() makes array views of it). Returns (grad_x like x, grad_state0 like state)."""
        if self._last is None:
            raise RnnGraphError("backward() called before the layer was called on an input")
        frames, y_shape, spread, pad, step = self._last
        user_shape = y_shape[1:] if step else (y_shape[1], y_shape[0], y_shape[2]) if self.batch_first else y_shape
        if grad_y is None:
            gy = self.backend.zeros(y_shape, self.dtype)
        else:
            gy = chk.check_array("grad_y", grad_y, self.backend, self.dtype)
            chk.check_grad_shape("grad_y", gy.shape, user_shape, "the output y")
            if self.check_finite:
                check_finite("grad_y", gy)
            gy = gy[None] if step else gy.transpose(1, 0, 2) if self.batch_first else gy
        gfin = self._unpack(grad_state_n, "grad_{}_n", y_shape[0], y_shape[1])
        if pad:
            gy, gfin = pad.frames(gy), pad.states(gfin)
        gx, ginit, grads = self._stack.backward(gy, gfin, frames)
        if pad:
            gx, ginit = pad.unframes(gx), pad.unstates(ginit)
        ginit = {s: g.sum(axis=0) if s in spread else g for s, g in ginit.items()}   # h0 given for every frame
        gx, self.grads = (gx[0] if step else self._to_user(gx)), {}
        self.grad_flat = self._gather(grads, self._stack.grad_sources())
        if self.check_finite:
            for n, g in [("grad_x", gx)] + [(f"gradient of {n}", g) for n, g in
                                            grad_views(self.grad_flat, self._params).items()]:
                check_finite(n, g)
        return gx, self._pack(ginit)

    # -- states -------------------------------------------------------------------------------
    def _unpack(self, state, label: str, T: int, B: int, every_frame: bool = False) -> dict:
        """User state (None, array, or tuple in cell.states order) -> state name -> array or None.
        label: e.g. '{}0' names each part ('h0', 'c0') in error messages; every_frame: a state carried
        as [D, L·dirs, B, S] may also come as [L·dirs, B, S], its value at every earlier frame."""
        parts = chk.split_state(state, self.state_names, type(self).__name__, label)
        out = {}
        for s, a in zip(self.state_names, parts):
            if a is not None:
                name, shape = label.format(s), self._stack.shape(s, B)
                a = chk.check_array(name, a, self.backend, self.dtype)
                if len(shape) == 4 and (a.ndim != 3 or not every_frame):
                    _check_history_shape(name, a.shape, shape, self.cell.name, every_frame)
                else:
                    chk.check_state_shape(name, a.shape, shape[-3:], T, self)
            out[s] = a
        return out

    def _pack(self, states: dict):
        vals = tuple(states[s] for s in self.state_names)
        return vals[0] if len(vals) == 1 else vals

    def _to_user(self, a):
        return self.backend.xp.ascontiguousarray(a.transpose(1, 0, 2)) if self.batch_first else a

    def __repr__(self):
        opts = [f"cell={self.cell.name}"] if type(self) is Recurrent else []
        opts += [str(self.input_size), str(self.hidden_size)]
        for k, dflt in (("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0.0),
                        ("bidirectional", False)):
            if getattr(self, k) != dflt:
                opts.append(f"{k}={getattr(self, k)}")
        opts += [f"backend={self.backend_name}", f"dtype={self.dtype.name}", f"mode={self.mode}"]
        return f"{type(self).__name__}({', '.join(opts)})"


class LSTM(Recurrent):
    """torch.nn.LSTM's signature and equations (gates i, f, g, o): ``y, (h_n, c_n) = lstm(x, (h0, c0))``.
    proj_size > 0 projects h as torch does (weight_hr_l{k} [proj_size, hidden_size]): y and h are
    proj_size features per direction, c hidden_size."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, **options):
        self.proj_size = proj_size
        super().__init__(lstm_cell(proj_size), input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, **options)


class GRU(Recurrent):
    """torch.nn.GRU's signature and equations (gates r, z, n): ``y, h_n = gru(x, h0)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, **options):
        super().__init__("gru", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, **options)


class RNN(Recurrent):
    """torch.nn.RNN's signature (nonlinearity 'tanh' or 'relu'): ``y, h_n = rnn(x, h0)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, **options):
        if nonlinearity not in ("tanh", "relu"):
            raise RnnGraphError(f"unknown nonlinearity {nonlinearity!r} for RNN; choose 'tanh' or 'relu'")
        self.nonlinearity = nonlinearity
        super().__init__(f"rnn_{nonlinearity}", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, **options)


def _state_kinds(cell) -> dict:
    return {s: (n, cell.depths[s]) for s, (_, n) in cell.states.items()}


def _check_history_shape(name: str, got: tuple, expected: tuple, cell: str, every_frame: bool):
    if tuple(got) != tuple(expected):
        D, K, B, S = expected
        alt = f", or [{K}, {B}, {S}] for one value at every earlier frame" if every_frame else ""
        raise RnnGraphError(f"{name} must be [D, num_layers·num_directions, B, S] = {list(expected)}{alt}: cell "
                            f"'{cell}' reads this state up to {D} frames back, so it carries its last {D} frames, "
                            f"oldest first; got {list(got)}")


def _make_backend(backend, mode: str | None):
    """A backend object made for `mode` ('staged' where None) from a name, or an object, whose own mode a
    given `mode` must be."""
    if isinstance(backend, str):
        return get_backend(backend, mode or "staged")
    if mode not in (None, backend.mode):
        raise RnnGraphError(f"the backend object was made for mode {backend.mode!r}, not {mode!r}: pass one made "
                            f"for it, get_backend(name, {mode!r}), or leave mode out")
    return backend


# -- parameter layout ------------------------------------------------------
def _suffix(layer: int, direction: int) -> str:
    return f"_l{layer}" + ("_reverse" if direction else "")


def _param_layout(cell, suffix: str) -> list:
    """[(name, shape, [(cell param, row start, row stop)])] for one (layer, direction): PyTorch's
    stems from cell.layout first, then every other cell parameter under its own name."""
    groups = list(cell.layout.items())
    covered = {p for _, parts in groups for p in parts}
    groups += [(p, (p,)) for p in cell.params if p not in covered]
    out = []
    for stem, parts in groups:
        shapes = [tuple(cell.params[p]) for p in parts]
        if len({s[1:] for s in shapes}) != 1:
            raise RnnGraphError(f"layout entry '{stem}' of cell '{cell.name}' stacks parameters of "
                                f"incompatible shapes {shapes}; stacked parameters must share trailing dims")
        rows, off = [], 0
        for p, s in zip(parts, shapes):
            rows.append((p, off, off + s[0]))
            off += s[0]
        out.append((stem + suffix, (off,) + shapes[0][1:], rows))
    return out


_INIT = {"uniform": init_uniform_, "orthogonal": init_orthogonal_}
