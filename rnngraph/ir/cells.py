"""The cell library, each cell written with the public builder (loading.py turns a spec into a cell).

A cell function is ``fn(input_size, hidden_size, bias=True, **options) -> CellGraph``; options are keywords
of its own (the head-wise cells' ``heads``), which load_cell and the layers pass on. Its ``layout`` maps
PyTorch's parameter names to the cell parameters stacked along rows, in PyTorch's gate order.
"""
from __future__ import annotations

import functools
from numbers import Integral
from typing import Callable

from ..errors import RnnGraphError
from .builder import Cell
from .graph import CellGraph

GATE_ORDER = ("i", "f", "g", "o")   # PyTorch's LSTM gate order
GRU_GATE_ORDER = ("r", "z", "n")    # PyTorch's GRU gate order
SLSTM_GATE_ORDER = ("i", "f", "z", "o")   # sLSTM's gates in xLSTM's order (z, the cell input, in the LSTM's g place)
HEADS = 4                           # the head-wise cells' default heads: 4, or fewer where 4 does not divide H


def _gates(c: Cell, x, h, H: int, names, bias: bool, heads: int = 1):
    """Per gate k: W_ik·x (+ b_ik) + W_hk·h (+ b_hk), the sums PyTorch's LSTM/GRU gates start from (W_hk
    block-diagonal over `heads` heads where heads > 1)."""
    out = {}
    for k in names:
        xi = c.linear(x, f"W_i{k}", H, bias=f"b_i{k}" if bias else None)
        hh = c.linear(h, f"W_h{k}", H, bias=f"b_h{k}" if bias else None, heads=heads)
        out[k] = (xi, hh)
    return out


def _torch_layout(names, bias: bool) -> dict:
    lay = {"weight_ih": tuple(f"W_i{k}" for k in names), "weight_hh": tuple(f"W_h{k}" for k in names)}
    if bias:
        lay.update(bias_ih=tuple(f"b_i{k}" for k in names), bias_hh=tuple(f"b_h{k}" for k in names))
    return lay


def lstm(input_size: int, hidden_size: int, bias: bool = True, proj_size: int = 0) -> CellGraph:
    """PyTorch's LSTM. proj_size > 0 is torch.nn.LSTM(proj_size=...)'s projected LSTM ('lstm_proj'): the
    state and output h [proj_size] = W_hr·(o ⊙ tanh c), with W_hr (weight_hr) [proj_size, hidden_size] and
    no bias; the gates read that h (weight_hh [4·hidden_size, proj_size]); c keeps hidden_size features."""
    P = _size_below(proj_size, hidden_size)
    return _lstm("lstm_proj" if P else "lstm", input_size, hidden_size, bias, 1, P)


def mh_lstm(input_size: int, hidden_size: int, bias: bool = True, heads: int | None = None) -> CellGraph:
    """Multi-head LSTM (as FlashRNN's): PyTorch's LSTM with its four recurrent matrices W_hi, W_hf, W_hg, W_ho
    block-diagonal over `heads` heads of hidden_size/heads features, each [heads, H/heads, H/heads]; weight_hh
    stacks them, [4·heads, H/heads, H/heads] in gate order i, f, g, o. heads defaults to 4, or to the largest
    number below 4 that divides hidden_size (1: full matrices, weight_hh [4H, H] as the LSTM's). Each head is
    a recurrence of its own (the plan finds it); the input weights stay full, as the LSTM's."""
    return _lstm("mh_lstm", input_size, hidden_size, bias, _heads("mh_lstm", hidden_size, heads))


def _heads(name: str, hidden_size: int, heads) -> int:
    """The heads a head-wise cell splits hidden_size into: `heads`, which must divide it, or for None the
    largest number up to HEADS that does (1: full matrices)."""
    if heads is None:
        return max(k for k in range(1, HEADS + 1) if hidden_size % k == 0)
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or hidden_size % heads:
        raise RnnGraphError(f"cell '{name}' splits hidden_size {hidden_size} into heads={heads!r} heads: pass a "
                            f"positive integer that divides it, or leave heads out ({HEADS} where that divides it)")
    return heads


def _lstm(name: str, input_size: int, hidden_size: int, bias: bool, heads: int, P: int = 0) -> CellGraph:
    """The LSTM of `name`: its recurrent matrices block-diagonal over `heads`, its h projected to P (0: not)."""
    c, H = Cell(name), hidden_size
    x, h, cs = c.input("x", input_size), c.state("h", P or H), c.state("c", H)
    a = _gates(c, x, h, H, GATE_ORDER, bias, heads)
    i = c.sigmoid(a["i"][0] + a["i"][1], name="i")
    f = c.sigmoid(a["f"][0] + a["f"][1], name="f")
    g = c.tanh(a["g"][0] + a["g"][1], name="g")
    o = c.sigmoid(a["o"][0] + a["o"][1], name="o")
    c_new = c.bind(cs, f * cs + i * g, name="c")
    out = o * c.tanh(c_new)
    c.output(c.bind(h, c.linear(out, "W_hr", P) if P else out, name="h"))
    layout = _torch_layout(GATE_ORDER, bias)
    if P:
        layout["weight_hr"] = ("W_hr",)
    return c.build().with_layout(layout)


def lstm_cell(proj_size: int = 0):
    """The cell spec of torch.nn.LSTM(proj_size=...): 'lstm', or the projected LSTM's cell function."""
    return functools.partial(lstm, proj_size=proj_size) if proj_size else "lstm"


def _size_below(proj_size, hidden_size: int) -> int:
    """proj_size as an int in [0, hidden_size), torch.nn.LSTM's rule, or one clear error."""
    if proj_size == 0 and not isinstance(proj_size, bool):
        return 0
    if isinstance(proj_size, bool) or not isinstance(proj_size, Integral) or not 0 < proj_size < hidden_size:
        raise RnnGraphError(f"proj_size must be an integer in [0, hidden_size={hidden_size}) (0: no projection), "
                            f"got {proj_size!r}")
    return int(proj_size)


def layernorm_lstm(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    """LayerNorm-LSTM in Haste's form (Ba et al. 2016): gates = LN(W_ih·x) + LN(W_hh·h) + b, each with
    its own gain; i, f, g, o as the LSTM; c' = f⊙c + i⊙g; h' = o⊙tanh(LN(c')), with gain and bias."""
    c, H = Cell("layernorm_lstm"), hidden_size
    x, h, cs = c.input("x", input_size), c.state("h", H), c.state("c", H)
    gates = (c.layer_norm(c.linear(x, "weight_ih", 4 * H), "ln_ih_weight", None)
             + c.layer_norm(c.linear(h, "weight_hh", 4 * H), "ln_hh_weight", None))
    gates = c.bias(gates, "bias") if bias else gates
    pi, pf, pg, po = c.split(gates, 4)
    i, f, g, o = c.sigmoid(pi, name="i"), c.sigmoid(pf, name="f"), c.tanh(pg, name="g"), c.sigmoid(po, name="o")
    c_new = c.bind(cs, f * cs + i * g, name="c")
    c.output(c.bind(h, o * c.tanh(c.layer_norm(c_new, "ln_c_weight", "ln_c_bias")), name="h"))
    return c.build()


def layernorm_gru(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    """LayerNorm-GRU in Haste's form: gi = LN(W_ih·x) + b_ih, gh = LN(W_hh·h) + b_hh, each LN with its own
    gain; r, z, n and h' as PyTorch's GRU (the reset applied to gh's n block)."""
    c, H = Cell("layernorm_gru"), hidden_size
    x, h = c.input("x", input_size), c.state("h", H)
    gi = c.layer_norm(c.linear(x, "weight_ih", 3 * H), "ln_ih_weight", None)
    gh = c.layer_norm(c.linear(h, "weight_hh", 3 * H), "ln_hh_weight", None)
    if bias:
        gi, gh = c.bias(gi, "bias_ih"), c.bias(gh, "bias_hh")
    (ir, iz, i_n), (hr, hz, hn) = c.split(gi, 3), c.split(gh, 3)
    r, z = c.sigmoid(ir + hr, name="r"), c.sigmoid(iz + hz, name="z")
    n = c.tanh(i_n + r * hn, name="n")
    c.output(c.bind(h, (1 - z) * n + z * h, name="h"))
    return c.build()


def gru(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    c, H = Cell("gru"), hidden_size
    x, h = c.input("x", input_size), c.state("h", H)
    a = _gates(c, x, h, H, GRU_GATE_ORDER, bias)
    r = c.sigmoid(a["r"][0] + a["r"][1], name="r")
    z = c.sigmoid(a["z"][0] + a["z"][1], name="z")
    n = c.tanh(a["n"][0] + r * a["n"][1], name="n")
    c.output(c.bind(h, (1 - z) * n + z * h, name="h"))
    return c.build().with_layout(_torch_layout(GRU_GATE_ORDER, bias))


def _rnn(name: str, act: str, input_size: int, hidden_size: int, bias: bool) -> CellGraph:
    c, H = Cell(name), hidden_size
    x, h = c.input("x", input_size), c.state("h", H)
    pre = (c.linear(x, "weight_ih", H, bias="bias_ih" if bias else None)
           + c.linear(h, "weight_hh", H, bias="bias_hh" if bias else None))
    c.output(c.bind(h, getattr(c, act)(pre), name="h"))
    return c.build()


def rnn_tanh(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    return _rnn("rnn_tanh", "tanh", input_size, hidden_size, bias)


def rnn_relu(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    return _rnn("rnn_relu", "relu", input_size, hidden_size, bias)


def peephole_lstm(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    c, H = Cell("peephole_lstm"), hidden_size
    x, h, cs = c.input("x", input_size), c.state("h", H), c.state("c", H)
    a = _gates(c, x, h, H, GATE_ORDER, bias)
    i = c.sigmoid(a["i"][0] + a["i"][1] + c.diag(cs, "w_ci"), name="i")
    f = c.sigmoid(a["f"][0] + a["f"][1] + c.diag(cs, "w_cf"), name="f")
    g = c.tanh(a["g"][0] + a["g"][1], name="g")
    c_new = c.bind(cs, f * cs + i * g, name="c")
    o = c.sigmoid(a["o"][0] + a["o"][1] + c.diag(c_new, "w_co"), name="o")
    c.output(c.bind(h, o * c.tanh(c_new), name="h"))
    lay = _torch_layout(GATE_ORDER, bias)
    lay["weight_peephole"] = ("w_ci", "w_cf", "w_co")
    return c.build().with_layout(lay)


def cifg_lstm(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    c, H, gates = Cell("cifg_lstm"), hidden_size, ("i", "g", "o")
    x, h, cs = c.input("x", input_size), c.state("h", H), c.state("c", H)
    a = _gates(c, x, h, H, gates, bias)
    i = c.sigmoid(a["i"][0] + a["i"][1], name="i")
    g = c.tanh(a["g"][0] + a["g"][1], name="g")
    o = c.sigmoid(a["o"][0] + a["o"][1], name="o")
    c_new = c.bind(cs, (1 - i) * cs + i * g, name="c")
    c.output(c.bind(h, o * c.tanh(c_new), name="h"))
    return c.build().with_layout(_torch_layout(gates, bias))


def min_gru(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    c, H = Cell("min_gru"), hidden_size
    x, h = c.input("x", input_size), c.state("h", H)
    z = c.sigmoid(c.linear(x, "W_z", H, bias="b_z" if bias else None), name="z")
    h_tilde = c.linear(x, "W_h", H, bias="b_h" if bias else None)
    c.output(c.bind(h, (1 - z) * h + z * h_tilde, name="h"))
    lay = {"weight_ih": ("W_z", "W_h")}
    if bias:
        lay["bias_ih"] = ("b_z", "b_h")
    return c.build().with_layout(lay)


def _x_gates(c: Cell, x, H: int, names, bias: bool) -> dict:
    """Per name k: W_k·x (+ b_k), the gate inputs of cells whose gates read x only."""
    return {k: c.linear(x, f"W_{k}", H, bias=f"b_{k}" if bias else None) for k in names}


def _x_layout(names, bias: bool) -> dict:
    lay = {"weight_ih": tuple(f"W_{k}" for k in names)}
    if bias:
        lay["bias_ih"] = tuple(f"b_{k}" for k in names)
    return lay


def min_lstm(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    """minLSTM with normalised gates: f' = f / (f + i) = σ(log f − log i), i' = 1 − f'.

    With f = σ(u) and i = σ(v), log σ(u) = −softplus(−u), so f' = σ(softplus(−v) − softplus(−u)):
    the same number as the division, without a division op and without overflow for large |u|, |v|."""
    c, H = Cell("min_lstm"), hidden_size
    x, h = c.input("x", input_size), c.state("h", H)
    a = _x_gates(c, x, H, ("f", "i", "h"), bias)
    log_f_minus_log_i = c.apply("softplus", -a["i"]) - c.apply("softplus", -a["f"])
    f = c.sigmoid(log_f_minus_log_i, name="f")
    c.output(c.bind(h, f * h + (1 - f) * a["h"], name="h"))
    return c.build().with_layout(_x_layout(("f", "i", "h"), bias))


def qrnn(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    """QRNN with fo-pooling and window 1: z = tanh(W_z·x), f = σ(W_f·x), o = σ(W_o·x),
    c = f ⊙ c + (1 − f) ⊙ z, h = o ⊙ c (Bradbury et al. 2016)."""
    c, H = Cell("qrnn"), hidden_size
    x, cs = c.input("x", input_size), c.state("c", H)
    a = _x_gates(c, x, H, ("z", "f", "o"), bias)
    z, f, o = c.tanh(a["z"], name="z"), c.sigmoid(a["f"], name="f"), c.sigmoid(a["o"], name="o")
    c_new = c.bind(cs, f * cs + (1 - f) * z, name="c")
    c.output(o * c_new, name="h")
    return c.build().with_layout(_x_layout(("z", "f", "o"), bias))


def mgu(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    c, H = Cell("mgu"), hidden_size
    x, h = c.input("x", input_size), c.state("h", H)
    f = c.sigmoid(c.linear(x, "W_f", H, bias="b_f" if bias else None) + c.linear(h, "U_f", H), name="f")
    n = c.tanh(c.linear(x, "W_n", H, bias="b_n" if bias else None) + c.linear(f * h, "U_n", H), name="n")
    c.output(c.bind(h, (1 - f) * h + f * n, name="h"))
    return c.build()


def indrnn(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    c, H = Cell("indrnn"), hidden_size
    x, h = c.input("x", input_size), c.state("h", H)
    pre = c.linear(x, "weight_ih", H, bias="bias_ih" if bias else None) + c.diag(h, "weight_hh")
    c.output(c.bind(h, c.relu(pre), name="h"))
    return c.build()


def sru(input_size: int, hidden_size: int, bias: bool = True) -> CellGraph:
    c, H = Cell("sru"), hidden_size
    x, cs = c.input("x", input_size), c.state("c", H)
    x_tilde = c.linear(x, "W", H)
    f = c.sigmoid(c.linear(x, "W_f", H, bias="b_f" if bias else None) + c.diag(cs, "v_f"), name="f")
    r = c.sigmoid(c.linear(x, "W_r", H, bias="b_r" if bias else None) + c.diag(cs, "v_r"), name="r")
    c_new = c.bind(cs, f * cs + (1 - f) * x_tilde, name="c")
    c.output(r * c_new + (1 - r) * c.linear(x, "W_s", H), name="h")
    return c.build()


def slstm(input_size: int, hidden_size: int, bias: bool = True, heads: int | None = None) -> CellGraph:
    """sLSTM (xLSTM, Beck et al. 2024, section 2.2) with exponential input and forget gates, stabilised in log
    space. Per gate k in SLSTM_GATE_ORDER (i, f, z, o): k̃ = W_k·x + b_k + R_k·h[t-1], R_k block-diagonal over
    `heads` heads ([heads, H/heads, H/heads]; heads defaults to 4, or to the largest number below 4 that divides
    hidden_size, 1 meaning full matrices [H, H]); z = tanh(z̃), o = σ(õ), log i = ĩ, log f = f̃, and

        m = max(f̃ + m[t-1], ĩ),  i' = exp(ĩ − m),  f' = exp(f̃ + m[t-1] − m)
        c = f'·c[t-1] + i'·z,   n = f'·n[t-1] + i',   h = o·c / n

    States h, c, n, m (zeros at the start: n's first frame is i' > 0). The stabiliser m keeps every exp ≤ 1 and
    changes no h: c and n are the unstabilised sums times e^(−m). Layout: weight_ih [4H, D], weight_hh
    [4·heads, H/heads, H/heads] and bias [4H], each in gate order."""
    heads = _heads("slstm", hidden_size, heads)
    c, H = Cell("slstm"), hidden_size
    x, h = c.input("x", input_size), c.state("h", H)
    cs, n, m = c.state("c", H), c.state("n", H), c.state("m", H)
    pre = {k: c.linear(x, f"W_{k}", H, bias=f"b_{k}" if bias else None) + c.linear(h, f"R_{k}", H, heads=heads)
           for k in SLSTM_GATE_ORDER}
    z, o = c.tanh(pre["z"], name="z"), c.sigmoid(pre["o"], name="o")
    log_f = c.add(pre["f"], m, name="log_f")                # log f + m[t-1]
    m_new = c.bind(m, c.maximum(log_f, pre["i"]), name="m")
    i, f = c.exp(pre["i"] - m_new, name="i"), c.exp(log_f - m_new, name="f")     # i', f'
    c_new, n_new = c.bind(cs, f * cs + i * z, name="c"), c.bind(n, f * n + i, name="n")
    c.output(c.bind(h, o * (c_new / n_new), name="h"))
    lay = {"weight_ih": tuple(f"W_{k}" for k in SLSTM_GATE_ORDER),
           "weight_hh": tuple(f"R_{k}" for k in SLSTM_GATE_ORDER)}
    if bias:
        lay["bias"] = tuple(f"b_{k}" for k in SLSTM_GATE_ORDER)
    return c.build().with_layout(lay)


CELLS: dict[str, tuple[Callable, str]] = {
    "lstm": (lstm, "LSTM with PyTorch's equations and gate order (i, f, g, o)"),
    "layernorm_lstm": (layernorm_lstm, "LayerNorm-LSTM (Ba et al. 2016, Haste's form): LN on both gate "
                                       "products and on c before tanh"),
    "gru": (gru, "GRU with PyTorch's equations (r, z, n; reset applied after W_hn·h)"),
    "layernorm_gru": (layernorm_gru, "LayerNorm-GRU (Haste's form): LN on both gate products"),
    "rnn_tanh": (rnn_tanh, "Elman RNN, h = tanh(W_ih·x + b_ih + W_hh·h + b_hh)"),
    "rnn_relu": (rnn_relu, "Elman RNN with ReLU"),
    "peephole_lstm": (peephole_lstm, "LSTM with peephole connections c -> i, f, o (Graves 2013)"),
    "cifg_lstm": (cifg_lstm, "Coupled input-forget gate LSTM, f = 1 - i"),
    "min_gru": (min_gru, "minGRU (Feng et al. 2024): gates from x only, h = (1-z)·h + z·h~"),
    "min_lstm": (min_lstm, "minLSTM (Feng et al. 2024): normalised gates from x only, h = f'·h + (1-f')·h~"),
    "qrnn": (qrnn, "QRNN fo-pooling, window 1 (Bradbury et al. 2016): c = f·c + (1-f)·z, h = o·c"),
    "mgu": (mgu, "Minimal gated unit (Zhou et al. 2016): one gate f resets h inside n and updates it"),
    "indrnn": (indrnn, "IndRNN (Li et al. 2018): h = relu(W·x + b + u ⊙ h)"),
    "sru": (sru, "SRU (Lei et al. 2018): light recurrence c with diagonal v ⊙ c, highway output"),
    "slstm": (slstm, "sLSTM (xLSTM, Beck et al. 2024): exponential gates stabilised in log space, states h, c, n, m, "
                     "recurrent weights block-diagonal over heads (heads, default 4)"),
    "mh_lstm": (mh_lstm, "Multi-head LSTM: the LSTM with block-diagonal recurrent weights over heads "
                         "(heads, default 4)"),
}
