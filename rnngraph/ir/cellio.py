"""A canonical, versioned form of a CellGraph as plain JSON data, so that a checkpoint stores the cell
itself rather than its name."""
from __future__ import annotations

from itertools import zip_longest
from numbers import Integral

import networkx as nx

from ..errors import RnnGraphError
from .graph import CellGraph, fmt_read
from .ops import ARITY, SHAPE, Op, OpKind, parse_kind

FORMAT = "rnngraph-cell"
VERSION = 1


def cell_to_dict(cell: CellGraph) -> dict:
    """The cell as JSON-able data: nodes and edges in the graph's order (it breaks scheduling ties), inputs,
    states in declaration order, outputs, parameter shapes and the PyTorch layout.

    Example: ``json.dumps(cell_to_dict(load_cell("gru", 8, 16)))``; ``cell_from_dict`` inverts it.
    """
    return {"format": FORMAT, "version": VERSION, "name": cell.name,
            "nodes": [{"name": n, "op": op.kind.value, "size": op.size, "attrs": [_plain(a) for a in op.attrs],
                       **({"init": cell.inits[n]} if n in cell.inits else {})}
                      for n, op in ((n, cell.op(n)) for n in cell.graph)],
            "edges": [{"src": u, "dst": v, "slot": d["slot"], "delay": d["delay"]}
                      for u, v, d in cell.graph.edges(data=True)],
            "inputs": dict(cell.inputs),
            "states": [{"name": s, "producer": p, "size": n} for s, (p, n) in cell.states.items()],
            "outputs": list(cell.outputs),
            "params": {n: list(shape) for n, shape in cell.params.items()},
            "layout": {k: list(ps) for k, ps in cell.layout.items()}}


def cell_from_dict(d: dict) -> CellGraph:
    """The CellGraph that `d` (from cell_to_dict) describes, checked as Cell.build() checks a new cell;
    an unknown format or version, or inconsistent data, is one RnnGraphError."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise RnnGraphError(f"not a stored cell graph (no format '{FORMAT}'); write one with cellio.cell_to_dict")
    if d.get("version") != VERSION:
        raise RnnGraphError(f"stored cell graph '{d.get('name')}' has format version {d.get('version')}; this "
                            f"rnngraph reads version {VERSION}; upgrade rnngraph to load it")
    try:
        return _rebuild(d)
    except RnnGraphError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _malformed(d.get("name"), f"{type(e).__name__}: {e}") from None


def first_difference(a: CellGraph, b: CellGraph, a_is: str, b_is: str) -> str | None:
    """The first way cell `a` differs from cell `b`, as one phrase (e.g. "node 'n' is relu in mycells:mgu
    but tanh in the checkpoint"), or None when both are the same graph, node order included."""
    da, db = cell_to_dict(a), cell_to_dict(b)
    for k, (p, q) in enumerate(zip_longest(da["nodes"], db["nodes"])):
        if p != q:
            return _node_difference(k, p, q, a_is, b_is)
    reads_a, reads_b = _reads(da), _reads(db)
    for n, r in reads_a.items():
        if r != reads_b[n]:
            return f"node '{n}' reads ({r}) in {a_is} but ({reads_b[n]}) in {b_is}"
    for key in ("name", "inputs", "states", "outputs", "params", "layout"):
        if da[key] != db[key]:
            verb = "is" if key in ("name", "layout") else "are"
            return f"the cell's {key} {verb} {da[key]} in {a_is} but {db[key]} in {b_is}"
    if da["edges"] != db["edges"]:
        return f"the same edges are listed in another order in {a_is} than in {b_is}"
    return None


def _rebuild(d: dict) -> CellGraph:
    name, g = d["name"], nx.MultiDiGraph()
    for n in d["nodes"]:
        if n["name"] in g:
            raise _malformed(name, f"node '{n['name']}' is listed twice")
        g.add_node(n["name"], op=Op(parse_kind(n["op"]), _count(n["size"], f"size of node '{n['name']}'", 1),
                                    tuple(n["attrs"])))
        if "init" in n:
            g.nodes[n["name"]]["init"] = float(n["init"])
    for e in d["edges"]:
        if e["src"] not in g or e["dst"] not in g:
            raise _malformed(name, f"edge {e['src']} -> {e['dst']} joins a node that is not listed")
        g.add_edge(e["src"], e["dst"], key=e["slot"], slot=_count(e["slot"], "an edge's slot"),
                   delay=_count(e["delay"], "an edge's delay"))
    states = {s["name"]: (s["producer"], _count(s["size"], f"size of state '{s['name']}'", 1)) for s in d["states"]}
    for s, (p, n) in states.items():
        if p not in g or g.nodes[p]["op"].size != n or g.nodes[p]["op"].kind in (OpKind.PARAM, OpKind.INPUT):
            raise _malformed(name, f"state '{s}' [{n}] names producer '{p}', which is not a computed node of that "
                                   "size")
    for v in g:
        _check_node(name, g, v, {p for p, _ in states.values()})
    found = {n: op.size for n, op in g.nodes(data="op") if op.kind is OpKind.INPUT}
    if len(states) != len(d["states"]) or d["inputs"] != found or not set(d["outputs"]) <= set(g):
        raise _malformed(name, f"its states {d['states']}, inputs {d['inputs']} or outputs {d['outputs']} do "
                               f"not match its nodes (input nodes: {found})")
    cell = CellGraph.from_graph(name, g, d["inputs"], states, d["outputs"],
                                {k: tuple(ps) for k, ps in d["layout"].items()})
    if {n: list(shape) for n, shape in cell.params.items()} != d["params"]:
        raise _malformed(name, f"its params {d['params']} do not match its parameter nodes")
    return cell


def _check_node(name: str, g, v, producers: set) -> None:
    """Slots 0..k-1, the op's arity, delays only from state producers, and the op's shape rule."""
    op = g.nodes[v]["op"]
    reads = sorted(g.in_edges(v, data=True), key=lambda e: e[2]["slot"])
    arity = ARITY[op.kind]
    if [d["slot"] for *_, d in reads] != list(range(len(reads))) or \
            (arity is not None and len(reads) != arity) or (arity is None and not reads):
        raise _malformed(name, f"{op.kind.value} node '{v}' reads slots {[d['slot'] for *_, d in reads]}; it "
                               f"takes {'one or more' if arity is None else arity} inputs in slots 0, 1, ...")
    for u, _, d in reads:
        if d["delay"] and u not in producers:
            raise _malformed(name, f"node '{v}' reads '{u}' {d['delay']} frames back, but '{u}' is no state")
    if op.kind is OpKind.PARAM:
        if op.attrs[:1] != (op.size,):
            raise _malformed(name, f"parameter '{v}' has {op.size} rows but shape {list(op.attrs)}")
        return
    if op.kind is OpKind.INPUT:
        return
    size = SHAPE[op.kind](op.attrs, [_shape(g.nodes[u]["op"]) for u, _, _ in reads])
    if size != op.size:
        got = size if isinstance(size, str) else f"its inputs make {size} features, not {op.size}"
        raise _malformed(name, f"{op.kind.value} node '{v}': {got}")


def _node_difference(k: int, p, q, a_is: str, b_is: str) -> str:
    if p is None or q is None:
        extra, where = (q, b_is) if p is None else (p, a_is)
        return f"node '{extra['name']}' ({extra['op']}) is only in {where}"
    if p["name"] != q["name"]:
        return f"node {k} is '{p['name']}' ({p['op']}) in {a_is} but '{q['name']}' ({q['op']}) in {b_is}"
    n = p["name"]
    if p["op"] != q["op"]:
        return f"node '{n}' is {p['op']} in {a_is} but {q['op']} in {b_is}"
    if p["size"] != q["size"]:
        return f"node '{n}' has {p['size']} features in {a_is} but {q['size']} in {b_is}"
    return f"node '{n}' has attributes {p['attrs']} in {a_is} but {q['attrs']} in {b_is}"


def _reads(d: dict) -> dict:
    """node -> its reads in slot order, as the schedule listing writes them ('h@t-1, W_f')."""
    reads = {n["name"]: [] for n in d["nodes"]}
    for e in sorted(d["edges"], key=lambda e: e["slot"]):
        reads[e["dst"]].append(fmt_read(e["src"], e["delay"]))
    return {n: ", ".join(r) for n, r in reads.items()}


def _shape(op: Op) -> tuple:
    """What a shape rule sees of an operand: a parameter's own shape, else (features,)."""
    return op.attrs if op.kind is OpKind.PARAM else (op.size,)


def _plain(a):
    """An op attribute as a JSON number that reads back equal (ints stay ints, floats stay floats)."""
    return int(a) if isinstance(a, Integral) else float(a)


def _count(v, what: str, low: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{what} must be an integer ≥ {low}, got {v!r}")
    return v


def _malformed(name, why: str) -> RnnGraphError:
    return RnnGraphError(f"stored cell graph '{name}' is malformed: {why}")
