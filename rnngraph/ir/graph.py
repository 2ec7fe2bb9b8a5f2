"""The cell IR: the validated, immutable CellGraph, the whole-graph checks it passes, and the delay-0
view of a graph that the passes share (rnngraph.ir.builder writes one).

A cell is a networkx MultiDiGraph (a DiGraph subclass that allows x * x). Each node holds one
``Op`` under ``G.nodes[n]["op"]``; each edge holds ``slot`` (input position) and ``delay`` (frames
back). A delayed read before frame 0 reads the state's initial value (h0, c0).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import networkx as nx

from ..errors import RnnGraphError
from .ops import ELEMENTWISE, Op, OpKind


@dataclass(frozen=True, eq=False)
class CellGraph:
    """A validated cell: the graph plus its inputs, states (with their producers), outputs and params."""
    name: str
    graph: nx.MultiDiGraph
    inputs: dict            # name -> features
    states: dict            # state name -> (producer node, features), in declaration order
    outputs: tuple          # per-frame output node names
    params: dict            # name -> shape
    layout: dict = field(default_factory=dict)  # optional PyTorch name -> cell params concatenated

    def op(self, n: str) -> Op:
        return self._ops[n]

    @functools.cached_property
    def _ops(self) -> dict:
        return dict(self.graph.nodes(data="op"))

    def reads(self, n: str) -> list[tuple[str, int]]:
        """(source, delay) for each input slot of node n, in slot order (a new list each call)."""
        return list(self._reads[n])

    @functools.cached_property
    def _reads(self) -> dict:
        """node -> its reads, sorted once: the interpreters ask for every op at every frame."""
        return {n: tuple((u, d["delay"]) for u, _, d in sorted(self.graph.in_edges(n, data=True),
                                                               key=lambda e: e[2]["slot"])) for n in self.graph}

    def frame_order(self) -> list[str]:
        """Every non-parameter node, in an order that respects all delay-0 edges."""
        return [n for n in topo_order(self.graph, self.graph)
                if self.op(n).kind is not OpKind.PARAM]

    @functools.cached_property
    def inits(self) -> dict:
        """parameter -> the constant it starts at where the cell says (a norm's gain 1, its bias 0); the
        layers' initialisers draw every other parameter."""
        return {n: v for n, v in self.graph.nodes(data="init") if v is not None}

    @property
    def producers(self) -> dict:
        return {p: s for s, (p, _) in self.states.items()}

    @functools.cached_property
    def depths(self) -> dict:
        """state -> how many past frames the cell reads (its largest delay, at least 1); computed once
        (the executor asks on every call)."""
        return {s: max([d for _, _, d in self.graph.out_edges(p, data="delay")] + [1])
                for s, (p, _) in self.states.items()}

    def with_layout(self, layout: dict) -> "CellGraph":
        """A copy that maps PyTorch parameter names to (row-concatenated) cell parameters."""
        missing = [p for ps in layout.values() for p in ps if p not in self.params]
        if missing:
            raise RnnGraphError(f"layout names unknown parameters {missing} of cell '{self.name}'")
        return CellGraph(self.name, self.graph, self.inputs, self.states, self.outputs, self.params,
                         dict(layout))

    def __str__(self) -> str:
        head = (f"cell {self.name}(" + ", ".join(f"{k}[{v}]" for k, v in self.inputs.items()) + ") -> "
                + ", ".join(self.outputs) + "   states: "
                + ", ".join(f"{s}[{n}] <- {p}" for s, (p, n) in self.states.items()))
        lines = [head]
        params = sorted(self.params)
        width = max(len(n) for n in list(self.graph) + params)
        for n in params:
            lines.append(f"  {n:<{width}}  param     {list(self.params[n])}")
        for n in self.frame_order():
            op = self.op(n)
            args = ", ".join(fmt_read(u, d) for u, d in self.reads(n))
            extra = f" {list(op.attrs)}" if op.attrs else ""
            lines.append(f"  {n:<{width}}  {op.kind.value:<9} {args}{extra}".ljust(width + 52) + f"[{op.size}]")
        return "\n".join(lines)

    __repr__ = __str__

    # -- validation ---------------------------------------------------------------------------
    @classmethod
    def from_graph(cls, name: str, g: nx.MultiDiGraph, inputs: dict, states: dict, outputs,
                   layout: dict | None = None) -> "CellGraph":
        """A cell from a finished graph (delayed reads already come from the state producers), checked as
        build() checks a whole graph: an output, no algebraic loop, outputs reachable from an input."""
        if not outputs:
            raise RnnGraphError(f"cell '{name}' has no output; mark one with cell.output(node)")
        _check_algebraic_loops(name, g)
        _check_reachable(name, g, outputs)
        _check_elementwise_params(name, g)
        params = {n: d["op"].attrs for n, d in g.nodes(data=True) if d["op"].kind is OpKind.PARAM}
        cell = cls(name, nx.freeze(g), dict(inputs), dict(states), tuple(outputs), params)
        return cell.with_layout(layout) if layout else cell


def fmt_read(u: str, d: int) -> str:
    """A read of node u, d frames back, as graph and schedule listings print it: u, or u@t-d."""
    return f"{u}@t-{d}" if d else u


def same_frame(g: nx.MultiDiGraph) -> nx.DiGraph:
    """The delay-0 part of a cell graph: the dependences inside one frame."""
    h = nx.DiGraph()
    h.add_nodes_from(g.nodes)
    h.add_edges_from((u, v) for u, v, d in g.edges(data=True) if d["delay"] == 0)
    return h


def topo_order(g: nx.MultiDiGraph, nodes) -> list:
    """`nodes` in an order that respects delay-0 edges, ties broken by creation order."""
    pos = {n: k for k, n in enumerate(g)}
    return list(nx.lexicographical_topological_sort(same_frame(g).subgraph(nodes), key=pos.__getitem__))


def _check_algebraic_loops(name, g):
    try:
        cycle = nx.find_cycle(same_frame(g))
    except nx.NetworkXNoCycle:
        return
    path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
    raise RnnGraphError(f"algebraic loop in cell '{name}': {path} has total delay 0; read one of these "
                        "values from an earlier frame (a state with delay ≥ 1) to break the loop")


def _check_reachable(name, g, outputs):
    inputs = {n for n, d in g.nodes(data=True) if d["op"].kind is OpKind.INPUT}
    for o in outputs:
        if not inputs & nx.ancestors(g, o):
            raise RnnGraphError(f"output '{o}' of cell '{name}' is not reachable from any input "
                                f"({sorted(inputs) or 'none declared'}); make it depend on the cell's input")


def _check_elementwise_params(name, g):
    for n, d in g.nodes(data=True):
        op = d["op"]
        if op.kind in ELEMENTWISE and all(g.nodes[u]["op"].kind is OpKind.PARAM for u in g.predecessors(n)):
            raise RnnGraphError(f"op '{n}' of cell '{name}' reads only parameters; fold them into one parameter")
