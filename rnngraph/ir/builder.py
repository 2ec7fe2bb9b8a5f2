"""The builder: `Cell` and its `Node` handles, so that a cell is written the way its equations read.

Each handle names a node of the graph being built; `Cell.state()` hands out a placeholder that reads
the state's earlier value, and `Cell.build()` wires each placeholder to the state's producer and
returns the validated, immutable CellGraph (rnngraph.ir.graph).
"""
from __future__ import annotations

import warnings
from numbers import Integral, Number

import networkx as nx

from ..errors import RnnGraphError, RnnGraphWarning
from .graph import CellGraph
from .ops import ARITY, SHAPE, Op, OpKind, parse_kind

_PLACEHOLDER = "@state:"  # builder-only node key prefix of a state read; never survives build()


class Node:
    """A handle on a value while a cell is built. Supports +, -, *, unary -, 1 - x and c * x."""
    __slots__ = ("cell", "name", "delay")

    def __init__(self, cell: "Cell", name: str, delay: int = 0):
        self.cell, self.name, self.delay = cell, name, delay

    @property
    def size(self) -> int:
        return self.cell._g.nodes[self.cell._current(self.name)]["op"].size

    def ago(self, d: int) -> "Node":
        """This state's value d frames back (d ≥ 0); only for handles from Cell.state()."""
        if not self.name.startswith(_PLACEHOLDER):
            raise RnnGraphError(f"'{self.name}' is not a state; only Cell.state() handles can be "
                                "read from earlier frames")
        if int(d) != d or d < 0:
            raise RnnGraphError(f"delay of state '{self.label}' must be an integer ≥ 0, got {d}")
        return Node(self.cell, self.name, int(d))

    @property
    def label(self) -> str:
        return self.name[len(_PLACEHOLDER):] if self.name.startswith(_PLACEHOLDER) else self.name

    def __add__(self, o): return self.cell.add(self, o)
    def __radd__(self, o): return self.cell.add(o, self)
    def __sub__(self, o): return self.cell.sub(self, o)
    def __neg__(self): return self.cell.scale(self, -1.0)

    def __rsub__(self, o):
        if isinstance(o, Number) and o == 1:
            return self.cell.one_minus(self)
        raise RnnGraphError(f"only 1 - x is supported for a number minus a node, got {o} - {self.label}")

    def __mul__(self, o):
        return self.cell.scale(self, o) if isinstance(o, Number) else self.cell.mul(self, o)

    __rmul__ = __mul__

    def __truediv__(self, o):
        return self.cell.scale(self, 1.0 / o) if isinstance(o, Number) else self.cell.div(self, o)

    def __repr__(self):
        return f"Node({self.label}{'@t-%d' % self.delay if self.delay else ''}, [{self.size}])"


class Cell:
    """Builds a cell graph. Example (a minimal gated unit, not a built-in)::

        c = Cell("mgu")
        x, h = c.input("x", 8), c.state("h", 16)          # h reads h[t-1]
        f = c.sigmoid(c.linear(x, "W_f", 16, bias="b_f") + c.linear(h, "U_f", 16))
        n = c.tanh(c.linear(x, "W_n", 16, bias="b_n") + c.linear(f * h, "U_n", 16))
        c.bind(h, (1 - f) * h + f * n, name="h")
        c.output("h")
        cell = c.build()
    """

    def __init__(self, name: str):
        self.name = name
        self._g = nx.MultiDiGraph()
        self._inputs: dict[str, int] = {}
        self._states: dict[str, int] = {}
        self._bound: dict[str, str] = {}
        self._outputs: list[str] = []
        self._count = 0
        self._renamed: dict[str, str] = {}  # old -> new node name, so handles survive bind/output renames

    # -- sources ------------------------------------------------------------------------------
    def input(self, name: str, size: int) -> Node:
        size = _size(f"size of input '{name}' of cell '{self.name}'", size)
        self._add_node(name, Op(OpKind.INPUT, size))
        self._inputs[name] = size
        return Node(self, name)

    def state(self, name: str, size: int) -> Node:
        """A recurrent state; the handle reads its value one frame back (``.ago(d)`` for d)."""
        if name in self._states:
            raise RnnGraphError(f"duplicate state name '{name}'; give each state its own name")
        size = _size(f"size of state '{name}' of cell '{self.name}'", size)
        self._add_node(_PLACEHOLDER + name, Op(OpKind.IDENTITY, size))
        self._states[name] = size
        return Node(self, _PLACEHOLDER + name, 1)

    def param(self, name: str, shape) -> Node:
        """A parameter [out, in] (matrix), [k, out/k, in/k] (a head-wise matrix) or [n] (vector); reusing a name
        reuses the parameter."""
        shape = tuple(_size(f"shape of parameter '{name}' of cell '{self.name}'", s)
                      for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if name in self._g:
            op = self._g.nodes[name]["op"]
            if op.kind is not OpKind.PARAM:
                raise RnnGraphError(f"duplicate node name '{name}': it is already a {op.kind.value} op")
            if op.attrs != shape:
                raise RnnGraphError(f"shape mismatch for parameter '{name}': declared {list(op.attrs)}, "
                                    f"now used as {list(shape)}")
            return Node(self, name)
        self._add_node(name, Op(OpKind.PARAM, shape[0], shape))
        return Node(self, name)

    # -- ops ----------------------------------------------------------------------------------
    def apply(self, kind, *inputs, name: str | None = None, attrs: tuple = ()) -> Node:
        """Adds one op of `kind` (an OpKind or its name) reading `inputs` (handles or parameter names)."""
        kind = parse_kind(kind)
        if kind in (OpKind.INPUT, OpKind.PARAM):
            raise RnnGraphError(f"use Cell.{kind.value}() to declare a {kind.value}")
        ins = [self._handle(x) for x in inputs]
        arity = ARITY[kind]
        if (arity is not None and len(ins) != arity) or (arity is None and not ins):
            raise RnnGraphError(f"{kind.value} takes {arity or 'one or more'} inputs, got {len(ins)}")
        shapes = [self._shape(h.name) for h in ins]
        name = name or self._fresh(kind.value)
        size = SHAPE[kind](attrs, shapes)
        if isinstance(size, str):
            names = ", ".join(f"{h.label}{list(s)}" for h, s in zip(ins, shapes))
            raise RnnGraphError(f"shape mismatch in {kind.value} op '{name}' reading {names}: {size}")
        self._add_node(name, Op(kind, size, tuple(attrs)))
        for slot, h in enumerate(ins):
            self._g.add_edge(h.name, name, key=slot, slot=slot, delay=h.delay)
        return Node(self, name)

    def linear(self, x, weight: str, out_features: int, bias: str | None = None, name=None, heads: int = 1) -> Node:
        """x · Wᵀ (+ b), with W a parameter [out_features, x.size] and b a vector [out_features].

        heads=k > 1 makes W block-diagonal: x's features split into k equal heads, and head h of the output
        (features h·out_features/k onwards) is x's head h times its own block, so W is stored as
        [k, out_features/k, x.size/k] (W[h] the block of head h). Example, 4 heads of 16::

            r = c.linear(h, "R", 64, heads=4)           # R: [4, 16, 16]; r[:, 16h:16h+16] = h[:, 16h:16h+16] · R[h]ᵀ
        """
        x = self._handle(x)
        out_features = _size(f"out_features of linear '{weight}' in cell '{self.name}'", out_features)
        heads = _size(f"heads of linear '{weight}' in cell '{self.name}'", heads)
        if heads == 1:
            y = self.apply(OpKind.LINEAR, x, self.param(weight, (out_features, x.size)), name=None if bias else name)
        else:
            for what, n in (("its input", x.size), ("out_features", out_features)):
                if n % heads:
                    raise RnnGraphError(f"linear '{weight}' in cell '{self.name}' has {heads} heads but {what} has "
                                        f"{n} features, not a multiple of {heads}; pick heads that divide both")
            w = self.param(weight, (heads, out_features // heads, x.size // heads))
            y = self.apply(OpKind.HEAD_LINEAR, x, w, name=None if bias else name, attrs=(heads,))
        return self.add(y, self.param(bias, (out_features,)), name=name) if bias else y

    def diag(self, x, weight: str, name=None) -> Node:
        """w ⊙ x with a vector parameter w [x.size] (a diagonal weight, e.g. a peephole)."""
        x = self._handle(x)
        return self.mul(x, self.param(weight, (x.size,)), name=name)

    def bias(self, x, b: str, name=None) -> Node:
        x = self._handle(x)
        return self.add(x, self.param(b, (x.size,)), name=name)

    def add(self, a, b, name=None): return self.apply(OpKind.ADD, a, b, name=name)
    def sub(self, a, b, name=None): return self.apply(OpKind.SUB, a, b, name=name)
    def mul(self, a, b, name=None): return self.apply(OpKind.MUL, a, b, name=name)
    def one_minus(self, a, name=None): return self.apply(OpKind.ONE_MINUS, a, name=name)
    def sigmoid(self, a, name=None): return self.apply(OpKind.SIGMOID, a, name=name)
    def tanh(self, a, name=None): return self.apply(OpKind.TANH, a, name=name)
    def relu(self, a, name=None): return self.apply(OpKind.RELU, a, name=name)
    def identity(self, a, name=None): return self.apply(OpKind.IDENTITY, a, name=name)
    def concat(self, *xs, name=None): return self.apply(OpKind.CONCAT, *xs, name=name)
    def softplus(self, a, name=None): return self.apply(OpKind.SOFTPLUS, a, name=name)
    def exp(self, a, name=None): return self.apply(OpKind.EXP, a, name=name)
    def div(self, a, b, name=None): return self.apply(OpKind.DIV, a, b, name=name)

    def maximum(self, a, b, name=None):
        """max(a, b), elementwise; its gradient goes to the larger operand, on a tie to a."""
        return self.apply(OpKind.MAXIMUM, a, b, name=name)

    def rsqrt(self, a, eps: float = 0.0, name=None):
        """1 / √(a + eps), elementwise."""
        return self.apply(OpKind.RSQRT, a, name=name, attrs=(float(eps),))

    def sum(self, a, name=None):
        """Σ over a's features, in every feature (the result has a's size; a row-wide reduction)."""
        return self.apply(OpKind.SUM, a, name=name)

    def mean(self, a, name=None):
        """The mean over a's features, in every feature (the result has a's size)."""
        return self.apply(OpKind.MEAN, a, name=name)

    def layer_norm(self, x, gamma: str | None = "gamma", beta: str | None = "beta", eps: float = 1e-5, name=None):
        """torch.nn.LayerNorm over x's features: (x − μ) / √(σ² + eps) ⊙ gamma + beta, σ² the biased
        variance; gamma / beta name vector parameters [x.size], or None for none. Built from mean, sub,
        mul and rsqrt, so its backward is theirs and its elementwise parts fuse with their neighbours."""
        x = self._handle(x)
        d = x - self.mean(x)
        y = d * self.rsqrt(self.mean(d * d), eps)
        y = self._gain(y, gamma)
        if beta:
            y = self.bias(y, beta, name=name)
            self._g.nodes[beta]["init"] = 0.0
        return self.identity(y, name=name) if name and not beta else y

    def rms_norm(self, x, gamma: str | None = "gamma", eps: float = 1e-6, name=None):
        """RMSNorm over x's features: x / √(mean(x²) + eps) ⊙ gamma (gamma None: no gain)."""
        x = self._handle(x)
        y = self._gain(x * self.rsqrt(self.mean(x * x), eps), gamma)
        return self.identity(y, name=name) if name else y

    def _gain(self, y, gamma):
        """y ⊙ gamma (a vector parameter that starts at 1: the layers' initialisers read "init"), or y."""
        if not gamma:
            return y
        y = self.diag(y, gamma)
        self._g.nodes[gamma]["init"] = 1.0
        return y

    def scale(self, a, c: float, name=None):
        return self.apply(OpKind.SCALE, a, name=name, attrs=(float(c),))

    def slice(self, x, start: int, stop: int, name=None):
        bounds = tuple(_size(f"slice {b} in cell '{self.name}'", v, 0)
                       for b, v in (("start", start), ("stop", stop)))
        return self.apply(OpKind.SLICE, x, name=name, attrs=bounds)

    def split(self, x, parts: int, names=None) -> list[Node]:
        """Splits x's features into `parts` equal slices (e.g. a 4H gate block into i, f, g, o)."""
        x, parts = self._handle(x), _size(f"parts of split in cell '{self.name}'", parts)
        if x.size % parts:
            raise RnnGraphError(f"cannot split '{x.label}' [{x.size}] into {parts} equal parts")
        n = x.size // parts
        names = names or [None] * parts
        return [self.slice(x, k * n, (k + 1) * n, name=names[k]) for k in range(parts)]

    # -- recurrence and outputs ---------------------------------------------------------------
    def bind(self, state: Node, value, name: str | None = None) -> Node:
        """Makes `value` the new value of `state` at each frame (its producer); returns its handle."""
        value = self._handle(value)
        label = state.label if isinstance(state, Node) else str(state)
        if label not in self._states:
            raise RnnGraphError(f"'{label}' is not a state of cell '{self.name}'; declare it with Cell.state()")
        if label in self._bound:
            raise RnnGraphError(f"state '{label}' is bound twice (to '{self._bound[label]}' and "
                                f"'{value.label}'); bind each state once")
        if value.size != self._states[label]:
            raise RnnGraphError(f"shape mismatch binding state '{label}' [{self._states[label]}] to "
                                f"'{value.label}' [{value.size}]")
        kind = self._g.nodes[value.name]["op"].kind
        if kind is OpKind.PARAM:
            raise RnnGraphError(f"state '{label}' is bound to parameter '{value.label}', which would make it a "
                                "constant; bind it to a value computed each frame")
        if value.name in self._bound.values() or value.name.startswith(_PLACEHOLDER) or kind is OpKind.INPUT:
            value = self.identity(value, name=name)
        elif name and name != value.name:
            self._rename(value.name, name)
            value = Node(self, name)
        self._bound[label] = value.name
        return value

    def output(self, value, name: str | None = None) -> Node:
        """Marks a value as a per-frame output of the cell (the layer's y)."""
        value = self._handle(value)
        if name and name != value.name:
            self._rename(value.name, name)
            value = Node(self, name)
        self._outputs.append(value.name)
        return value

    def build(self) -> CellGraph:
        """The validated CellGraph: each state's placeholder is replaced by reads of its producer."""
        g = self._g.copy()
        for s in self._states:
            ph = _PLACEHOLDER + s
            readers = sorted({v for _, v in g.out_edges(ph)})
            if s not in self._bound:
                raise RnnGraphError(f"state '{s}' of cell '{self.name}' is read by {readers or 'nothing'} but "
                                    f"never bound to a producer; add cell.bind({s}, <its new value>)")
            prod = self._bound[s]
            for _, v, d in list(g.out_edges(ph, data=True)):
                g.add_edge(prod, v, key=d["slot"], slot=d["slot"], delay=d["delay"])
            g.remove_node(ph)
        states = {s: (self._bound[s], n) for s, n in self._states.items()}
        cell = CellGraph.from_graph(self.name, g, self._inputs, states, self._outputs)
        for n in self._inputs:
            if g.out_degree(n) == 0:
                warnings.warn(f"input '{n}' of cell '{self.name}' is never used", RnnGraphWarning, stacklevel=2)
        return cell

    # -- helpers ------------------------------------------------------------------------------
    def _handle(self, x) -> Node:
        if isinstance(x, Node):
            if x.cell is not self:
                raise RnnGraphError(f"'{x.label}' belongs to another cell")
            return Node(self, self._current(x.name), x.delay)
        if isinstance(x, str) and x in self._g:
            return Node(self, x)
        if isinstance(x, str) and x in self._states:
            return Node(self, _PLACEHOLDER + x, 1)
        raise RnnGraphError(f"unknown value {x!r} in cell '{self.name}': pass a node handle, or the "
                            "name of an existing node or parameter")

    def _shape(self, n: str) -> tuple:
        op = self._g.nodes[n]["op"]
        return op.attrs if op.kind is OpKind.PARAM else (op.size,)

    def _add_node(self, name: str, op: Op):
        if name in self._g:
            raise RnnGraphError(f"duplicate node name '{name}' in cell '{self.name}'; names must be unique")
        self._renamed.pop(name, None)       # the name now means this node, not a renamed one
        self._g.add_node(name, op=op)

    def _fresh(self, stem: str) -> str:
        while True:
            self._count += 1
            if f"{stem}{self._count}" not in self._g:
                return f"{stem}{self._count}"

    def _current(self, n: str) -> str:
        while n in self._renamed:
            n = self._renamed[n]
        return n

    def _rename(self, old: str, new: str):
        if new in self._g:
            raise RnnGraphError(f"duplicate node name '{new}' in cell '{self.name}'; names must be unique")
        if self._g.nodes[old]["op"].kind in (OpKind.INPUT, OpKind.PARAM):
            raise RnnGraphError(f"cannot rename {self._g.nodes[old]['op'].kind.value} '{old}'")
        self._g = nx.relabel_nodes(self._g, {old: new}, copy=True)  # copy keeps creation order
        self._renamed[old] = new
        self._bound = {k: (new if v == old else v) for k, v in self._bound.items()}
        self._outputs = [new if v == old else v for v in self._outputs]


def _size(what: str, v, low: int = 1) -> int:
    """`v` as an int ≥ low (numpy integers too); a bool, a float or a smaller int is an error naming `what`."""
    if isinstance(v, bool) or not isinstance(v, Integral) or v < low:
        raise RnnGraphError(f"{what} must be {'a positive integer' if low else 'an integer ≥ 0'}, got {v!r}")
    return int(v)
