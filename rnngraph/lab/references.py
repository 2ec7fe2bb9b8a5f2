"""The benchmark's torch references: cuDNN layers, and the same cell as a frame-by-frame torch loop.

Two eager loops run any cell the way a PyTorch user would, one frame at a time:
- STEPS: hand-written step functions, one per cell, written as researchers write custom cells in
  PyTorch (the gate products merged per operand and x·W_ih computed inside the loop, as in PyTorch's
  own benchmarks/fastrnns/custom_lstms.py);
- GraphLoop: interprets any CellGraph node by node with the op table's torch rules, so user cells run too.
`eager_loop` uses a hand-written step only after it matched GraphLoop on the first frames, so the
reference is always the same cell. torch is imported by the caller; this module needs it installed.
"""
from __future__ import annotations

import time
import warnings

import torch

from ..ir.cells import GATE_ORDER, GRU_GATE_ORDER, SLSTM_GATE_ORDER
from ..ir.loading import load_cell
from ..errors import RnnGraphError, RnnGraphWarning
from ..ir.ops import TORCH, OpKind

# how far two torch programs of one cell may differ, relative, by dtype: rounding order, not mistakes
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
CUDNN = {"lstm": ("LSTM", {}), "gru": ("GRU", {}), "rnn_tanh": ("RNN", {"nonlinearity": "tanh"}),
         "rnn_relu": ("RNN", {"nonlinearity": "relu"})}


def cudnn_layer(name: str, D: int, H: int, layers: int, dtype, device):
    """torch.nn.LSTM / GRU / RNN for a built-in cell name (cuDNN on a CUDA device)."""
    cls, kw = CUDNN[name]
    return getattr(torch.nn, cls)(D, H, num_layers=layers, **kw).to(device=device, dtype=dtype)


# -- hand-written steps: (prepare: cell params -> merged weights, step: (W, x_t, state) -> y_t, state)
def _cat(P, names):
    return torch.cat([P[n] for n in names])


def _gated(gates, keep=()):
    """weight_ih, weight_hh and the biases of one gate order, as torch.nn.LSTM/GRU stack them,
    plus the parameters named in `keep` as they are."""
    def prepare(P):
        return {"w_ih": _cat(P, [f"W_i{k}" for k in gates]), "w_hh": _cat(P, [f"W_h{k}" for k in gates]),
                "b_ih": _cat(P, [f"b_i{k}" for k in gates]), "b_hh": _cat(P, [f"b_h{k}" for k in gates]),
                **{n: P[n] for n in keep}}
    return prepare


def _lstm_step(W, x, s):
    gates = torch.mm(x, W["w_ih"].t()) + W["b_ih"] + torch.mm(s["h"], W["w_hh"].t()) + W["b_hh"]
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * s["c"] + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, {"h": h, "c": c}


def _peephole_step(W, x, s):
    gates = torch.mm(x, W["w_ih"].t()) + W["b_ih"] + torch.mm(s["h"], W["w_hh"].t()) + W["b_hh"]
    i, f, g, o = gates.chunk(4, 1)
    i = torch.sigmoid(i + W["w_ci"] * s["c"])
    f = torch.sigmoid(f + W["w_cf"] * s["c"])
    c = f * s["c"] + i * torch.tanh(g)
    h = torch.sigmoid(o + W["w_co"] * c) * torch.tanh(c)
    return h, {"h": h, "c": c}


def _cifg_step(W, x, s):
    gates = torch.mm(x, W["w_ih"].t()) + W["b_ih"] + torch.mm(s["h"], W["w_hh"].t()) + W["b_hh"]
    i, g, o = gates.chunk(3, 1)
    i = torch.sigmoid(i)
    c = (1 - i) * s["c"] + i * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, {"h": h, "c": c}


def _layernorm_lstm_step(W, x, s):
    F, H = torch.nn.functional, s["h"].shape[1]
    gates = (F.layer_norm(torch.mm(x, W["weight_ih"].t()), (4 * H,), W["ln_ih_weight"], None, 1e-5)
             + F.layer_norm(torch.mm(s["h"], W["weight_hh"].t()), (4 * H,), W["ln_hh_weight"], None, 1e-5) + W["bias"])
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * s["c"] + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(F.layer_norm(c, (H,), W["ln_c_weight"], W["ln_c_bias"], 1e-5))
    return h, {"h": h, "c": c}


def _gru_step(W, x, s):
    gi = torch.mm(x, W["w_ih"].t()) + W["b_ih"]
    gh = torch.mm(s["h"], W["w_hh"].t()) + W["b_hh"]
    ir, iz, in_ = gi.chunk(3, 1)
    hr, hz, hn = gh.chunk(3, 1)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    n = torch.tanh(in_ + r * hn)
    h = (1 - z) * n + z * s["h"]
    return h, {"h": h}


def _rnn_step(act):
    def step(W, x, s):
        h = act(torch.mm(x, W["weight_ih"].t()) + W["bias_ih"] + torch.mm(s["h"], W["weight_hh"].t())
                + W["bias_hh"])
        return h, {"h": h}
    return step


def _min_gru_step(W, x, s):
    z, h_tilde = (torch.mm(x, W["w_ih"].t()) + W["b_ih"]).chunk(2, 1)
    z = torch.sigmoid(z)
    h = (1 - z) * s["h"] + z * h_tilde
    return h, {"h": h}


def _indrnn_step(W, x, s):
    h = torch.relu(torch.mm(x, W["weight_ih"].t()) + W["bias_ih"] + W["weight_hh"] * s["h"])
    return h, {"h": h}


def _sru_step(W, x, s):
    u = torch.mm(x, W["w"].t())
    x_tilde, uf, ur, us = u.chunk(4, 1)
    f = torch.sigmoid(uf + W["b_f"] + W["v_f"] * s["c"])
    r = torch.sigmoid(ur + W["b_r"] + W["v_r"] * s["c"])
    c = f * s["c"] + (1 - f) * x_tilde
    return r * c + (1 - r) * us, {"c": c}


def _mgu_step(W, x, s):
    xf, xn = (torch.mm(x, W["w_x"].t()) + W["b_x"]).chunk(2, 1)
    f = torch.sigmoid(xf + torch.mm(s["h"], W["U_f"].t()))
    n = torch.tanh(xn + torch.mm(f * s["h"], W["U_n"].t()))
    h = (1 - f) * s["h"] + f * n
    return h, {"h": h}


def _per_head(h, r, gates: int):
    """h [B, H] times each gate's block-diagonal recurrent weights, r [gates·k, H/k, H/k] (the gates' heads
    stacked, as the layout stacks them), one einsum over (gate, head): [B, gates·H] in gate order; with one
    head r is the full [gates·H, H]."""
    if r.dim() == 2:
        return torch.mm(h, r.t())
    r = r.view(gates, -1, *r.shape[1:])                                  # [gates, k, H/k, H/k]
    return torch.einsum("bki,gkoi->bgko", h.view(h.shape[0], r.shape[1], -1), r).reshape(h.shape[0], -1)


def _mh_lstm_step(W, x, s):
    gates = torch.mm(x, W["w_ih"].t()) + W["b_ih"] + _per_head(s["h"], W["w_hh"], 4) + W["b_hh"]
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * s["c"] + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, {"h": h, "c": c}


def _slstm_step(W, x, s):
    """sLSTM as xLSTM's paper writes it (exponential gates, the log-space stabiliser m)."""
    i, f, z, o = (torch.mm(x, W["w_ih"].t()) + W["b"] + _per_head(s["h"], W["r"], 4)).chunk(4, 1)
    log_f = f + s["m"]
    m = torch.maximum(log_f, i)
    i, f = torch.exp(i - m), torch.exp(log_f - m)
    c = f * s["c"] + i * torch.tanh(z)
    n = f * s["n"] + i
    h = torch.sigmoid(o) * c / n
    return h, {"h": h, "c": c, "n": n, "m": m}


def _keep(*names, **merged):
    """prepare(): some parameters as they are, others merged along rows."""
    return lambda P: {**{n: P[n] for n in names}, **{k: _cat(P, v) for k, v in merged.items()}}


STEPS = {
    "lstm": (_gated(GATE_ORDER), _lstm_step),
    "peephole_lstm": (_gated(GATE_ORDER, keep=("w_ci", "w_cf", "w_co")), _peephole_step),
    "cifg_lstm": (_gated(("i", "g", "o")), _cifg_step),
    "gru": (_gated(GRU_GATE_ORDER), _gru_step),
    "layernorm_lstm": (_keep("weight_ih", "weight_hh", "ln_ih_weight", "ln_hh_weight", "bias", "ln_c_weight",
                             "ln_c_bias"), _layernorm_lstm_step),
    "rnn_tanh": (_keep("weight_ih", "weight_hh", "bias_ih", "bias_hh"), _rnn_step(torch.tanh)),
    "rnn_relu": (_keep("weight_ih", "weight_hh", "bias_ih", "bias_hh"), _rnn_step(torch.relu)),
    "min_gru": (_keep(w_ih=("W_z", "W_h"), b_ih=("b_z", "b_h")), _min_gru_step),
    "indrnn": (_keep("weight_ih", "weight_hh", "bias_ih"), _indrnn_step),
    "sru": (_keep("b_f", "b_r", "v_f", "v_r", w=("W", "W_f", "W_r", "W_s")), _sru_step),
    "mgu": (_keep("U_f", "U_n", w_x=("W_f", "W_n"), b_x=("b_f", "b_n")), _mgu_step),
    "mh_lstm": (_gated(GATE_ORDER), _mh_lstm_step),
    "slstm": (_keep(w_ih=tuple(f"W_{k}" for k in SLSTM_GATE_ORDER), b=tuple(f"b_{k}" for k in SLSTM_GATE_ORDER),
                    r=tuple(f"R_{k}" for k in SLSTM_GATE_ORDER)), _slstm_step),
}


def _leaves(tensors: dict) -> dict:
    return {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}


def _zeros_init(cell, init, x):
    init = init or {}
    return {s: init[s] if init.get(s) is not None else x.new_zeros((x.shape[1], n))
            for s, (_, n) in cell.states.items()}


class HandWritten:
    """A cell's hand-written torch step in a Python loop over frames; weights are leaf tensors."""
    kind = "hand-written"

    def __init__(self, cell, P: dict):
        prepare, self.step = STEPS[cell.name]
        self.cell, self.W = cell, _leaves(prepare(P))

    def parameters(self) -> list:
        return list(self.W.values())

    def __call__(self, x, init: dict | None = None):
        """x: [T, B, D]; init: state -> [B, S] or None. Returns (y [T, B, F], state -> [B, S])."""
        s, ys = _zeros_init(self.cell, init, x), []
        for t in range(x.shape[0]):
            y, s = self.step(self.W, x[t], s)
            ys.append(y)
        return torch.stack(ys), s


class GraphLoop:
    """Any CellGraph, frame by frame and node by node, with the op table's torch rules (TORCH)."""
    kind = "graph interpreter"

    def __init__(self, cell, P: dict):
        self.cell, self.W = cell, _leaves(P)
        self.order = [(n, cell.op(n), cell.reads(n)) for n in cell.frame_order()
                      if cell.op(n).kind is not OpKind.INPUT]
        self.x_name = next(iter(cell.inputs))

    def parameters(self) -> list:
        return list(self.W.values())

    def _read(self, u, d, t, env, hist, before):
        """Node u read with delay d at frame t."""
        if u in self.W:
            return self.W[u]
        return env[u] if d == 0 else self._at(u, t - d, hist, before, env[self.x_name])

    def _at(self, u, t, hist, before, x_t):
        """Node u's value at frame t; before frame 0 (t < 0) a state's initial value ([B, S] for every
        earlier frame, or [D, B, S]: the D frames before, oldest first), other nodes' zeros."""
        if t >= 0:
            return hist[t][u]
        if u not in before:
            return x_t.new_zeros((x_t.shape[0], self.cell.op(u).size))
        return before[u] if before[u].dim() == 2 else before[u][t]

    def __call__(self, x, init: dict | None = None):
        """x: [T, B, D]; init: state -> [B, S], [D, B, S] or None (as Executor.forward). Returns (y [T, B, F],
        state -> its last D frames: [B, S] where D = cell.depths[s] is 1, else [D, B, S])."""
        cell, init = self.cell, _zeros_init(self.cell, init, x)
        before = {p: init[s] for s, (p, _) in cell.states.items()}
        hist, y_name, T = [], cell.outputs[0], x.shape[0]     # hist[t]: node -> its value at frame t
        for t in range(T):
            env = {self.x_name: x[t]}
            for n, op, reads in self.order:
                env[n] = TORCH[op.kind](torch, *[self._read(u, d, t, env, hist, before) for u, d in reads],
                                        op.attrs)
            hist.append(env)
        last = {s: [self._at(p, T - k, hist, before, x[0]) for k in range(cell.depths[s], 0, -1)]
                for s, (p, _) in cell.states.items()}
        return torch.stack([e[y_name] for e in hist]), {s: v[0] if len(v) == 1 else torch.stack(v)
                                                         for s, v in last.items()}


def eager_loop(cell, P: dict, check: bool = True):
    """The torch eager loop of `cell` with parameters P (cell name -> tensor): its hand-written step
    when there is one and it matches GraphLoop on two frames (check=True), else GraphLoop."""
    graph = GraphLoop(cell, P)
    if cell.name not in STEPS:
        return graph
    try:
        hand = HandWritten(cell, P)
    except KeyError:              # a user cell that shares a built-in name but not its parameters
        return graph
    if check:
        x = torch.randn(2, 1, cell.inputs[graph.x_name], dtype=next(iter(P.values())).dtype,
                        device=next(iter(P.values())).device)
        with torch.no_grad():
            a, b = hand(x)[0], graph(x)[0]
        tol = TOL[a.dtype]
        if a.shape != b.shape or float((a - b).norm()) > tol * max(float(b.norm()), 1e-30):
            warnings.warn(f"cell '{cell.name}' differs from rnngraph's built-in of that name; its torch "
                          "eager loop interprets the graph instead", RnnGraphWarning, stacklevel=2)
            return graph
    return hand


# -- what bench.measure() times ---------------------------------------------------------------
def torch_fns(spec, impl, T, B, H, D, layers, dtype, seed, cell_options=None):
    """({"forward": fn, "train": fn}, backend name, "gpu" | "cpu", extra result fields) of impl
    'cudnn', 'torch_eager', 'torch_compile' (the eager loop through torch.compile: mode 'reduce-overhead' on
    CUDA, its default on the CPU; compiled here, its compile time in compile_s) or 'rnngraph_torch'
    (rnngraph.torch.Recurrent through autograd), on CUDA when torch sees a GPU, else on the CPU; 'torch_cpu'
    (torch.nn.LSTM / GRU / RNN on the CPU, oneDNN's fused RNN) always on the CPU. The forward runs under
    torch.no_grad(); a training step sets .grad to None, then backpropagates a fixed grad_y. cell_options: the cell
    function's own keywords (e.g. heads)."""
    dev = torch.device("cuda" if torch.cuda.is_available() and impl != "torch_cpu" else "cpu")
    opts = cell_options or {}
    tdt, gen = getattr(torch, dtype), torch.Generator().manual_seed(seed)
    if impl in ("cudnn", "torch_cpu", "rnngraph_torch"):
        torch.manual_seed(seed)
        if impl in ("cudnn", "torch_cpu"):
            model = cudnn_layer(load_cell(spec, D, H).name, D, H, layers, tdt, dev)
        else:                   # what a PyTorch user sees: the torch module, autograd, its default mode
            import rnngraph.torch as rt
            model = rt.Recurrent(spec, D, H, layers, device=dev, dtype=tdt, **opts)
        params, F, extra = list(model.parameters()), model(torch.zeros(1, 1, D, device=dev, dtype=tdt))[0].shape[-1], {}

        def run(x):
            return model(x)[0]
    else:
        loops, F = eager_stack(spec, D, H, layers, gen, dev, tdt, opts)
        params, extra = [p for lp in loops for p in lp.parameters()], {"eager_loop": loops[0].kind}

        def run(x):
            for lp in loops:
                x = lp(x)[0]
            return x
    x = torch.randn(T, B, D, generator=gen, dtype=torch.float64).to(dev, tdt).requires_grad_()
    gy = torch.randn(T, B, F, generator=gen, dtype=torch.float64).to(dev, tdt)
    if impl == "torch_compile":
        run = _compiled(run, x, gy, dev, extra)

    def forward():
        with torch.no_grad():
            run(x)

    def train():
        x.grad = None
        for p in params:
            p.grad = None
        run(x).backward(gy)
    return {"forward": forward, "train": train}, f"torch-{dev.type}", "gpu" if dev.type == "cuda" else "cpu", extra


def _compiled(run, x, gy, dev, extra: dict):
    """torch.compile of the eager loop `run`, compiled now for the forward and the training step (the time
    goes to extra['compile_s']), after checking that it computes what the eager loop computes."""
    compiled = torch.compile(run, mode="reduce-overhead" if dev.type == "cuda" else "default", dynamic=False)

    def call(x):
        if dev.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()      # each call a new step: outputs may be replaced
        return compiled(x)
    start = time.perf_counter()
    with torch.no_grad():
        want, got = run(x), call(x).clone()
    call(x).backward(gy)
    x.grad = None
    extra["compile_s"] = round(time.perf_counter() - start, 2)
    tol = TOL[x.dtype]
    if float((got - want).norm()) > tol * max(float(want.norm()), 1e-30):
        raise RnnGraphError("torch.compile of the eager loop computes something else than the loop itself "
                            f"(relative difference {float((got - want).norm() / want.norm()):.1e})")
    return call


def eager_stack(spec, D: int, H: int, layers: int, gen, device, dtype, cell_options=None):
    """(one eager loop per layer with U(±1/√H) parameters, output features of the last layer)."""
    loops, size = [], D
    for _ in range(layers):
        cell = load_cell(spec, size, H, **(cell_options or {}))
        P = {p: ((torch.rand(s, generator=gen, dtype=torch.float64) * 2 - 1) / H ** 0.5).to(device, dtype)
             for p, s in cell.params.items()}
        loops.append(eager_loop(cell, P))
        size = cell.op(cell.outputs[0]).size
    return loops, size
