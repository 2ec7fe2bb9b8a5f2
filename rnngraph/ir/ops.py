"""The op table: one enum of op kinds and one rule table per fact about an op (shape, forward, backward,
kernel, FLOPs, symbol, torch).

Arrays passed to the rules are 2-D rows ``[N, F]`` (N = B for one frame, T·B for all frames at once);
a matrix parameter is ``[F_out, F_in]`` (a head-wise one ``[k, F_out/k, F_in/k]``: k blocks on the diagonal)
and a vector parameter ``[F]`` broadcasts over the rows.
Adding an op means one enum entry plus one entry in each table below; tests/test_ops.py fails on a gap.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from ..errors import RnnGraphError


class OpKind(enum.Enum):
    INPUT = "input"          # per-frame input x_t                      value [N, F]
    PARAM = "param"          # trainable parameter, matrix or vector    [F_out, F_in] or [F]
    LINEAR = "linear"        # x · Wᵀ                                   [N, F_in], [F_out, F_in] -> [N, F_out]
    HEAD_LINEAR = "head_linear"  # per head h: x[:, h] · W[h]ᵀ (block-diagonal W), k in attrs
                                 #                                       [N, k·i], [k, o, i] -> [N, k·o]
    ADD = "add"
    SUB = "sub"
    MUL = "mul"              # Hadamard product (a vector parameter makes it a diagonal weight)
    SCALE = "scale"          # c · x, c a Python float in attrs
    ONE_MINUS = "one_minus"  # 1 − x
    SIGMOID = "sigmoid"
    TANH = "tanh"
    RELU = "relu"
    SOFTPLUS = "softplus"    # log(1 + eˣ)
    EXP = "exp"
    DIV = "div"              # a / b
    MAXIMUM = "maximum"      # max(a, b) elementwise; its gradient goes to the larger, on a tie to a
    RSQRT = "rsqrt"          # 1 / √(x + ε), ε in attrs
    SUM = "sum"              # Σ_j x[:, j], broadcast back to every feature (so the size is kept)
    MEAN = "mean"            # the same divided by F: the layer norm's μ and σ², the RMS norm's mean square
    IDENTITY = "identity"
    CONCAT = "concat"        # along features
    SLICE = "slice"          # x[:, start:stop], (start, stop) in attrs


@dataclass(frozen=True)
class Op:
    """One node of a cell graph: its kind, its feature size and its static attributes."""
    kind: OpKind
    size: int                # features of the value; rows of a matrix parameter
    attrs: tuple = ()        # PARAM: shape; SCALE: (c,); SLICE: (start, stop); RSQRT: (ε,); HEAD_LINEAR: (k,)


SOURCES = {OpKind.INPUT, OpKind.PARAM}
BINARY = {OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.MAXIMUM}
UNARY = {OpKind.SCALE, OpKind.ONE_MINUS, OpKind.SIGMOID, OpKind.TANH, OpKind.RELU, OpKind.SOFTPLUS,
         OpKind.EXP, OpKind.RSQRT, OpKind.IDENTITY, OpKind.SLICE}
ELEMENTWISE = BINARY | UNARY  # ops a fused kernel evaluates element by element
REDUCE = {OpKind.SUM, OpKind.MEAN}    # row-wide: each output reads every feature of its row
MOVES = {OpKind.IDENTITY, OpKind.SLICE, OpKind.CONCAT}   # ops that only move data: no arithmetic
MATMUL = {OpKind.LINEAR, OpKind.HEAD_LINEAR}          # ops run as GEMMs (plan items Gemm), weights their slot 1


def split_heads(a, k: int):
    """Rows a [N, k·c] as k heads [k, N, c]: a view (head h holds the columns h·c … (h+1)·c − 1)."""
    return a.reshape(a.shape[0], k, a.shape[1] // k).transpose(1, 0, 2)


def join_heads(a):
    """The inverse of split_heads: heads [k, N, c] as rows [N, k·c] (a copy unless already so laid out)."""
    return a.transpose(1, 0, 2).reshape(a.shape[1], -1)


# ---------------------------------------------------------------------------------------------
# Shape rules: (attrs, input shapes) -> output feature size, or an error text.
# A value's shape is (F,); a parameter's shape is its own (F_out, F_in) or (F,).

def _linear_shape(attrs, shapes):
    (x,), w = shapes[0], shapes[1]
    if len(w) != 2:
        return f"its weight must be a matrix parameter [out, in], got shape {list(w)}"
    if w[1] != x:
        return f"input has {x} features but the weight is {list(w)} (expects {w[1]} inputs)"
    return w[0]


def _head_linear_shape(attrs, shapes):
    (x,), w, (k,) = shapes[0], shapes[1], attrs
    if len(w) != 3 or w[0] != k:
        return f"its weight must be a head-wise parameter [{k}, out/{k}, in/{k}], got shape {list(w)}"
    if k * w[2] != x:
        return f"input has {x} features but the weight is {list(w)} (expects {k}·{w[2]} = {k * w[2]} inputs)"
    return k * w[1]


def _same_shape(attrs, shapes):
    if any(len(s) != 1 for s in shapes):
        return f"elementwise operands must be vectors of features, got {[list(s) for s in shapes]}"
    if len({s[0] for s in shapes}) != 1:
        return "operand sizes differ: " + " vs ".join(str(s[0]) for s in shapes)
    return shapes[0][0]


def _slice_shape(attrs, shapes):
    start, stop = attrs
    (n,) = shapes[0]
    if not 0 <= start < stop <= n:
        return f"slice [{start}:{stop}] is outside the input's {n} features"
    return stop - start


SHAPE = {
    OpKind.LINEAR: _linear_shape,
    OpKind.HEAD_LINEAR: _head_linear_shape,
    **{k: _same_shape for k in BINARY | UNARY - {OpKind.SLICE}},
    OpKind.SLICE: _slice_shape,
    OpKind.CONCAT: lambda attrs, shapes: sum(s[0] for s in shapes),
    **{k: _same_shape for k in REDUCE},
}

ARITY = {OpKind.INPUT: 0, OpKind.PARAM: 0, OpKind.LINEAR: 2, OpKind.HEAD_LINEAR: 2, OpKind.CONCAT: None,
         **{k: 2 for k in BINARY}, **{k: 1 for k in UNARY | REDUCE}}


# ---------------------------------------------------------------------------------------------
# Forward rules: rule(xp, out [N, F], ins, attrs) writes the value into `out`.

def _sigmoid(xp, out, a):
    xp.multiply(a, 0.5, out=out)     # σ(a) = ½·tanh(a/2) + ½, stable for any a, no temporaries
    xp.tanh(out, out=out)
    xp.multiply(out, 0.5, out=out)
    xp.add(out, 0.5, out=out)


def _softplus(xp, out, a):
    xp.abs(a, out=out)               # log(1 + eᵃ) = log1p(e^−|a|) + max(a, 0): eᵃ overflows for large a
    xp.negative(out, out=out)        # and log(1 + tiny) loses tiny for very negative a; this does neither
    xp.exp(out, out=out)
    xp.log1p(out, out=out)
    out += xp.maximum(a, 0.0)


def _rsqrt(xp, out, a, eps):
    xp.add(a, eps, out=out)
    xp.sqrt(out, out=out)
    xp.divide(1.0, out, out=out)


def _row_sum(xp, out, a, scale):
    """out [N, F] = scale · Σ_j a[:, j] in every column, with no temporary (capturable)."""
    xp.sum(a, axis=1, keepdims=True, out=out[:, :1])
    out[:, 1:] = out[:, :1]
    if scale != 1:
        xp.multiply(out, scale, out=out)


def _concat(xp, out, *ins):
    off = 0
    for a in ins:
        out[:, off:off + a.shape[-1]] = a
        off += a.shape[-1]


FORWARD = {
    OpKind.LINEAR: lambda xp, out, x, w, attrs: xp.matmul(x, w.T, out=out),
    OpKind.HEAD_LINEAR: lambda xp, out, x, w, attrs: xp.matmul(split_heads(x, attrs[0]), w.transpose(0, 2, 1),
                                                               out=split_heads(out, attrs[0])),
    OpKind.ADD: lambda xp, out, a, b, attrs: xp.add(a, b, out=out),
    OpKind.SUB: lambda xp, out, a, b, attrs: xp.subtract(a, b, out=out),
    OpKind.MUL: lambda xp, out, a, b, attrs: xp.multiply(a, b, out=out),
    OpKind.SCALE: lambda xp, out, a, attrs: xp.multiply(a, attrs[0], out=out),
    OpKind.ONE_MINUS: lambda xp, out, a, attrs: xp.subtract(1.0, a, out=out),
    OpKind.SIGMOID: lambda xp, out, a, attrs: _sigmoid(xp, out, a),
    OpKind.TANH: lambda xp, out, a, attrs: xp.tanh(a, out=out),
    OpKind.RELU: lambda xp, out, a, attrs: xp.maximum(a, 0.0, out=out),
    OpKind.SOFTPLUS: lambda xp, out, a, attrs: _softplus(xp, out, a),
    OpKind.EXP: lambda xp, out, a, attrs: xp.exp(a, out=out),
    OpKind.DIV: lambda xp, out, a, b, attrs: xp.divide(a, b, out=out),
    OpKind.MAXIMUM: lambda xp, out, a, b, attrs: xp.maximum(a, b, out=out),
    OpKind.RSQRT: lambda xp, out, a, attrs: _rsqrt(xp, out, a, attrs[0]),
    OpKind.SUM: lambda xp, out, a, attrs: _row_sum(xp, out, a, 1.0),
    OpKind.MEAN: lambda xp, out, a, attrs: _row_sum(xp, out, a, 1.0 / a.shape[1]),
    OpKind.IDENTITY: lambda xp, out, a, attrs: xp.copyto(out, a),
    OpKind.SLICE: lambda xp, out, a, attrs: xp.copyto(out, a[:, attrs[0]:attrs[1]]),
    OpKind.CONCAT: lambda xp, out, *ins: _concat(xp, out, *ins[:-1]),
}


# ---------------------------------------------------------------------------------------------
# Backward rules (vector-Jacobian products): VJP[kind][slot](xp, add, g [N, F], ins, y [N, F], attrs)
# hands operand `slot`'s gradient contribution to the sink add(v, cols=ALL), which adds v into the
# operand's gradient columns `cols` (summing over rows when the operand is a vector parameter).

ALL = slice(None)


def accumulate(acc, v):
    """acc += v, where a vector parameter's gradient acc [F] sums v [N, F] over its rows."""
    if v.ndim > acc.ndim:
        v = v.sum(axis=0)
    acc += v


class _EachSlot:
    """The backward entry of an op with any number of operands: entry[slot] is rule(slot, ...)."""

    def __init__(self, rule):
        self.rule = rule

    def __getitem__(self, slot):
        return functools.partial(self.rule, slot)


def _concat_vjp(slot, xp, add, g, *ins_y_attrs):
    """Gradient of one concat operand: its column range of g."""
    ins = ins_y_attrs[:-2]
    off = sum(a.shape[-1] for a in ins[:slot])
    add(g[:, off:off + ins[slot].shape[-1]])


VJP = {
    OpKind.LINEAR: (lambda xp, add, g, x, w, y, attrs: add(g @ w),           # dx [N, F_in]
                    lambda xp, add, g, x, w, y, attrs: add(g.T @ x)),        # dW [F_out, F_in]
    OpKind.HEAD_LINEAR: (                                                   # dx [N, k·i], dW [k, o, i]
        lambda xp, add, g, x, w, y, attrs: add(join_heads(split_heads(g, attrs[0]) @ w)),
        lambda xp, add, g, x, w, y, attrs: add(split_heads(g, attrs[0]).transpose(0, 2, 1) @ split_heads(x, attrs[0]))),
    OpKind.ADD: (lambda xp, add, g, a, b, y, attrs: add(g),
                 lambda xp, add, g, a, b, y, attrs: add(g)),
    OpKind.SUB: (lambda xp, add, g, a, b, y, attrs: add(g),
                 lambda xp, add, g, a, b, y, attrs: add(-g)),
    OpKind.MUL: (lambda xp, add, g, a, b, y, attrs: add(g * b),
                 lambda xp, add, g, a, b, y, attrs: add(g * a)),
    OpKind.SCALE: (lambda xp, add, g, a, y, attrs: add(g * attrs[0]),),
    OpKind.ONE_MINUS: (lambda xp, add, g, a, y, attrs: add(-g),),
    OpKind.SIGMOID: (lambda xp, add, g, a, y, attrs: add(g * y * (1.0 - y)),),
    OpKind.TANH: (lambda xp, add, g, a, y, attrs: add(g * (1.0 - y * y)),),
    OpKind.RELU: (lambda xp, add, g, a, y, attrs: add(g * (y > 0)),),
    OpKind.SOFTPLUS: (lambda xp, add, g, a, y, attrs: add(g * (0.5 * xp.tanh(0.5 * a) + 0.5)),),  # g·σ(a)
    OpKind.EXP: (lambda xp, add, g, a, y, attrs: add(g * y),),
    OpKind.DIV: (lambda xp, add, g, a, b, y, attrs: add(g / b),
                 lambda xp, add, g, a, b, y, attrs: add(-g * y / b)),
    OpKind.MAXIMUM: (lambda xp, add, g, a, b, y, attrs: add(g * (a >= b)),      # a tie: all of it to a
                     lambda xp, add, g, a, b, y, attrs: add(g * (a < b))),
    OpKind.RSQRT: (lambda xp, add, g, a, y, attrs: add(-0.5 * g * y * y * y),),
    OpKind.SUM: (lambda xp, add, g, a, y, attrs: add(xp.broadcast_to(g.sum(axis=1, keepdims=True), g.shape)),),
    OpKind.MEAN: (lambda xp, add, g, a, y, attrs: add(xp.broadcast_to(g.mean(axis=1, keepdims=True), g.shape)),),
    OpKind.IDENTITY: (lambda xp, add, g, a, y, attrs: add(g),),
    OpKind.SLICE: (lambda xp, add, g, a, y, attrs: add(g, slice(*attrs)),),  # into the sliced columns
    OpKind.CONCAT: _EachSlot(_concat_vjp),
}


# ---------------------------------------------------------------------------------------------
# Kernel rules of the elementwise ops: (C expression of the value, C expression of each operand's
# gradient contribution). {0}, {1}: operands; {y}: the op's value; {g}: the gradient arriving at the
# op; {a0}, {a1}: its attrs (SCALE's constant). LINEAR runs as a GEMM and CONCAT as column copies;
# SUM and MEAN, which read a whole row, in a group's row kernel (run/backends/cuda/rows.py: a block per row).

KERNEL = {
    OpKind.ADD: ("{0} + {1}", ("{g}", "{g}")),
    OpKind.SUB: ("{0} - {1}", ("{g}", "-{g}")),
    OpKind.MUL: ("{0} * {1}", ("{g} * {1}", "{g} * {0}")),
    OpKind.SCALE: ("{0} * ({a0})", ("{g} * ({a0})",)),
    OpKind.ONE_MINUS: ("1 - {0}", ("-{g}",)),
    OpKind.SIGMOID: ("1 / (1 + exp(-{0}))", ("{g} * {y} * (1 - {y})",)),
    OpKind.TANH: ("tanh({0})", ("{g} * (1 - {y} * {y})",)),
    OpKind.RELU: ("({0} > 0 ? {0} : 0)", ("({y} > 0 ? {g} : 0)",)),
    OpKind.SOFTPLUS: ("log1p(exp(-fabs({0}))) + ({0} > 0 ? {0} : 0)", ("{g} / (1 + exp(-{0}))",)),
    OpKind.EXP: ("exp({0})", ("{g} * {y}",)),
    OpKind.DIV: ("{0} / {1}", ("{g} / {1}", "-{g} * {y} / {1}")),
    OpKind.MAXIMUM: ("({0} >= {1} ? {0} : {1})", ("({0} >= {1} ? {g} : 0)", "({0} >= {1} ? 0 : {g})")),
    OpKind.RSQRT: ("rsqrt({0} + ({a0}))", ("-0.5 * {g} * {y} * {y} * {y}",)),
    OpKind.IDENTITY: ("{0}", ("{g}",)),
    OpKind.SLICE: ("{0}", ("{g}",)),  # the executor hands the kernel the sliced view
}


def hands_on(kind: OpKind, slot: int) -> bool:
    """Whether an op's gradient rule hands operand `slot` the arriving gradient itself, whole ('{g}'): an add's
    operands, a subtraction's first, an identity's (not a slice's: its operand is wider)."""
    rule = KERNEL.get(kind)
    return rule is not None and kind is not OpKind.SLICE and rule[1][slot] == "{g}"


# ---------------------------------------------------------------------------------------------
# FLOP rules: rule(F, operand sizes) -> (forward FLOPs, backward FLOPs per operand slot) per row.
# An arithmetic op counts one per element (a transcendental too: operations, not cycles), forward
# and per operand backward; a linear op 2·in·out forward, as much for each operand's gradient (a head-wise
# one with k heads 2·in·out/k: its weight has k blocks of (out/k)·(in/k)).

def _per_element(F, ins):
    return F, tuple(F for _ in ins)


def _moves(F, ins):
    return 0, tuple(0 for _ in ins)


FLOPS = {
    OpKind.LINEAR: lambda F, ins: (2 * ins[0] * F, (2 * ins[0] * F, 2 * ins[0] * F)),
    OpKind.HEAD_LINEAR: lambda F, ins: (2 * ins[0] * F // ins[1], (2 * ins[0] * F // ins[1],) * 2),  # ins[1]: k
    **{k: _per_element for k in (ELEMENTWISE | REDUCE) - MOVES},
    **{k: _moves for k in MOVES},
}


# ---------------------------------------------------------------------------------------------
# Symbols in drawings of a cell (LINEAR, HEAD_LINEAR, SCALE and SLICE labels also show their weight or attrs).

SYMBOL = {OpKind.LINEAR: "·", OpKind.HEAD_LINEAR: "·ₕ", OpKind.ADD: "+", OpKind.SUB: "−", OpKind.MUL: "⊙",
          OpKind.SCALE: "×",
          OpKind.ONE_MINUS: "1 − x", OpKind.SIGMOID: "σ", OpKind.TANH: "tanh", OpKind.RELU: "relu",
          OpKind.SOFTPLUS: "softplus", OpKind.IDENTITY: "id", OpKind.SLICE: "[:]", OpKind.CONCAT: "concat",
          OpKind.EXP: "exp", OpKind.DIV: "÷", OpKind.MAXIMUM: "max", OpKind.RSQRT: "1/√", OpKind.SUM: "Σ",
          OpKind.MEAN: "mean"}


# ---------------------------------------------------------------------------------------------
# Torch rules, for the benchmark's reference loop: rule(torch, ins, attrs) -> tensor. The torch
# module comes in as an argument (as `xp` does for the forward rules), so this module never imports it.

TORCH = {
    OpKind.LINEAR: lambda torch, x, w, attrs: torch.mm(x, w.t()),
    OpKind.HEAD_LINEAR: lambda torch, x, w, attrs: torch.einsum("nki,koi->nko", x.reshape(x.shape[0], attrs[0], -1),
                                                                w).reshape(x.shape[0], -1),
    OpKind.ADD: lambda torch, a, b, attrs: a + b,
    OpKind.SUB: lambda torch, a, b, attrs: a - b,
    OpKind.MUL: lambda torch, a, b, attrs: a * b,
    OpKind.SCALE: lambda torch, a, attrs: a * attrs[0],
    OpKind.ONE_MINUS: lambda torch, a, attrs: 1 - a,
    OpKind.SIGMOID: lambda torch, a, attrs: torch.sigmoid(a),
    OpKind.TANH: lambda torch, a, attrs: torch.tanh(a),
    OpKind.RELU: lambda torch, a, attrs: torch.relu(a),
    OpKind.SOFTPLUS: lambda torch, a, attrs: torch.nn.functional.softplus(a),
    OpKind.EXP: lambda torch, a, attrs: torch.exp(a),
    OpKind.DIV: lambda torch, a, b, attrs: a / b,
    OpKind.MAXIMUM: lambda torch, a, b, attrs: torch.where(a >= b, a, b),   # torch.maximum splits a tie's gradient
    OpKind.RSQRT: lambda torch, a, attrs: torch.rsqrt(a + attrs[0]),
    OpKind.SUM: lambda torch, a, attrs: a.sum(1, keepdim=True).expand_as(a),
    OpKind.MEAN: lambda torch, a, attrs: a.mean(1, keepdim=True).expand_as(a),
    OpKind.IDENTITY: lambda torch, a, attrs: a,
    OpKind.SLICE: lambda torch, a, attrs: a[:, attrs[0]:attrs[1]],
    OpKind.CONCAT: lambda torch, *ins: torch.cat(ins[:-1], dim=1),
}


def parse_kind(kind) -> OpKind:
    """OpKind from an enum member or its name; an unknown name raises RnnGraphError."""
    if isinstance(kind, OpKind):
        return kind
    try:
        return OpKind(str(kind).lower())
    except ValueError:
        known = ", ".join(k.value for k in OpKind if k not in SOURCES)
        raise RnnGraphError(f"unknown op {kind!r}; known ops: {known}") from None
