"""The op table: one enum of op kinds and one small rule table per pass (shape, forward, backward, kernel).

Arrays passed to the rules are 2-D rows ``[N, F]`` (N = B for one frame, T·B for all frames at once);
a matrix parameter is ``[F_out, F_in]`` and a vector parameter ``[F]`` broadcasts over the rows.
Adding an op means one enum entry plus one entry in each table below.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import RnnGraphError


class OpKind(enum.Enum):
    INPUT = "input"          # per-frame input x_t                      value [N, F]
    PARAM = "param"          # trainable parameter, matrix or vector    [F_out, F_in] or [F]
    LINEAR = "linear"        # x · Wᵀ                                   [N, F_in], [F_out, F_in] -> [N, F_out]
    ADD = "add"
    SUB = "sub"
    MUL = "mul"              # Hadamard product (a vector parameter makes it a diagonal weight)
    SCALE = "scale"          # c · x, c a Python float in attrs
    ONE_MINUS = "one_minus"  # 1 − x
    SIGMOID = "sigmoid"
    TANH = "tanh"
    RELU = "relu"
    IDENTITY = "identity"
    CONCAT = "concat"        # along features
    SLICE = "slice"          # x[:, start:stop], (start, stop) in attrs


@dataclass(frozen=True)
class Op:
    """One node of a cell graph: its kind, its feature size and its static attributes."""
    kind: OpKind
    size: int                # features of the value; rows of a matrix parameter
    attrs: tuple = ()        # PARAM: shape; SCALE: (c,); SLICE: (start, stop)


SOURCES = {OpKind.INPUT, OpKind.PARAM}
BINARY = {OpKind.ADD, OpKind.SUB, OpKind.MUL}
UNARY = {OpKind.SCALE, OpKind.ONE_MINUS, OpKind.SIGMOID, OpKind.TANH, OpKind.RELU,
         OpKind.IDENTITY, OpKind.SLICE}
ELEMENTWISE = BINARY | UNARY  # ops a fused kernel evaluates element by element


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
    **{k: _same_shape for k in BINARY | UNARY - {OpKind.SLICE}},
    OpKind.SLICE: _slice_shape,
    OpKind.CONCAT: lambda attrs, shapes: sum(s[0] for s in shapes),
}

ARITY = {OpKind.INPUT: 0, OpKind.PARAM: 0, OpKind.LINEAR: 2, OpKind.CONCAT: None,
         **{k: 2 for k in BINARY}, **{k: 1 for k in UNARY}}


# ---------------------------------------------------------------------------------------------
# Forward rules: rule(xp, out [N, F], ins, attrs) writes the value into `out`.

def _sigmoid(xp, out, a):
    xp.multiply(a, 0.5, out=out)     # σ(a) = ½·tanh(a/2) + ½, stable for any a, no temporaries
    xp.tanh(out, out=out)
    xp.multiply(out, 0.5, out=out)
    xp.add(out, 0.5, out=out)


def _concat(xp, out, *ins):
    off = 0
    for a in ins:
        out[:, off:off + a.shape[-1]] = a
        off += a.shape[-1]


FORWARD = {
    OpKind.LINEAR: lambda xp, out, x, w, attrs: xp.matmul(x, w.T, out=out),
    OpKind.ADD: lambda xp, out, a, b, attrs: xp.add(a, b, out=out),
    OpKind.SUB: lambda xp, out, a, b, attrs: xp.subtract(a, b, out=out),
    OpKind.MUL: lambda xp, out, a, b, attrs: xp.multiply(a, b, out=out),
    OpKind.SCALE: lambda xp, out, a, attrs: xp.multiply(a, attrs[0], out=out),
    OpKind.ONE_MINUS: lambda xp, out, a, attrs: xp.subtract(1.0, a, out=out),
    OpKind.SIGMOID: lambda xp, out, a, attrs: _sigmoid(xp, out, a),
    OpKind.TANH: lambda xp, out, a, attrs: xp.tanh(a, out=out),
    OpKind.RELU: lambda xp, out, a, attrs: xp.maximum(a, 0.0, out=out),
    OpKind.IDENTITY: lambda xp, out, a, attrs: xp.copyto(out, a),
    OpKind.SLICE: lambda xp, out, a, attrs: xp.copyto(out, a[:, attrs[0]:attrs[1]]),
    OpKind.CONCAT: lambda xp, out, *ins: _concat(xp, out, *ins[:-1]),
}


# ---------------------------------------------------------------------------------------------
# Backward rules (vector-Jacobian products): rule(xp, g [N, F], ins, y [N, F], attrs) returns
# one contribution per input slot, as a function of that slot; `accumulate` adds it into the
# slot's gradient buffer, summing over rows when the operand is a vector parameter.

def accumulate(acc, v):
    """acc += v, where a vector parameter's gradient acc [F] sums v [N, F] over its rows."""
    if v.ndim > acc.ndim:
        v = v.sum(axis=0)
    acc += v


VJP = {
    OpKind.LINEAR: (lambda xp, g, x, w, y, attrs: g @ w,              # dx [N, F_in]
                    lambda xp, g, x, w, y, attrs: g.T @ x),           # dW [F_out, F_in]
    OpKind.ADD: (lambda xp, g, a, b, y, attrs: g,
                 lambda xp, g, a, b, y, attrs: g),
    OpKind.SUB: (lambda xp, g, a, b, y, attrs: g,
                 lambda xp, g, a, b, y, attrs: -g),
    OpKind.MUL: (lambda xp, g, a, b, y, attrs: g * b,
                 lambda xp, g, a, b, y, attrs: g * a),
    OpKind.SCALE: (lambda xp, g, a, y, attrs: g * attrs[0],),
    OpKind.ONE_MINUS: (lambda xp, g, a, y, attrs: -g,),
    OpKind.SIGMOID: (lambda xp, g, a, y, attrs: g * y * (1.0 - y),),
    OpKind.TANH: (lambda xp, g, a, y, attrs: g * (1.0 - y * y),),
    OpKind.RELU: (lambda xp, g, a, y, attrs: g * (y > 0),),
    OpKind.IDENTITY: (lambda xp, g, a, y, attrs: g,),
    OpKind.SLICE: (None,),  # handled by slice_vjp: it adds into a column range, not the whole input
}


def slice_vjp(acc, g, attrs):
    """Gradient of x[:, start:stop]: add g [N, stop-start] into acc[:, start:stop]."""
    acc[:, attrs[0]:attrs[1]] += g


def concat_vjp(g, sizes, slot):
    """Gradient of one concat operand: its column range of g."""
    off = sum(sizes[:slot])
    return g[:, off:off + sizes[slot]]


# ---------------------------------------------------------------------------------------------
# Kernel rules: C expressions for generated elementwise kernels. {0}, {1}: operands; {y}: the
# op's value; {g}: the gradient arriving at the op; {c}: the SCALE constant.
# LINEAR runs as a GEMM and CONCAT as column copies; neither is an elementwise expression.

KERNEL = {
    OpKind.ADD: ("{0} + {1}", ("{g}", "{g}")),
    OpKind.SUB: ("{0} - {1}", ("{g}", "-{g}")),
    OpKind.MUL: ("{0} * {1}", ("{g} * {1}", "{g} * {0}")),
    OpKind.SCALE: ("{0} * ({c})", ("{g} * ({c})",)),
    OpKind.ONE_MINUS: ("1 - {0}", ("-{g}",)),
    OpKind.SIGMOID: ("1 / (1 + exp(-{0}))", ("{g} * {y} * (1 - {y})",)),
    OpKind.TANH: ("tanh({0})", ("{g} * (1 - {y} * {y})",)),
    OpKind.RELU: ("({0} > 0 ? {0} : 0)", ("({y} > 0 ? {g} : 0)",)),
    OpKind.IDENTITY: ("{0}", ("{g}",)),
    OpKind.SLICE: ("{0}", ("{g}",)),  # the executor hands the kernel the sliced view
    OpKind.LINEAR: "gemm",
    OpKind.CONCAT: "copy",
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
