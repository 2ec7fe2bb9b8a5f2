"""The paper's analysis: recurrent core, hoisting, parallel stages and merges, as a plain Schedule.

Sections (a dependence pass, as in partial evaluation):
  pre  — ops that read no delayed value, directly or through others: run once over all T·B rows;
  loop — the recurrent core (strongly connected components through delayed edges) and every op that
         depends on a delayed value and feeds the core: run frame by frame;
  post — ops that depend on a delayed value but feed nothing back: run once over all frames.
Items (each a future kernel): a Gemm merges linear ops reading one operand (concatenated weights), or
head-wise linear ops of one head count reading one operand (a batched GEMM over the heads);
a Fused group joins connected elementwise ops and row reductions (SUM, MEAN) of one size: a group with
a reduction runs one block per row (run/backends/cuda/rows.py), so no reduction is split across blocks and
every op of the group works on the block's own row. Loop stages are topological generations of the
item DAG.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import networkx as nx

from ..ir.graph import CellGraph, fmt_read, same_frame, topo_order
from ..ir.ops import ELEMENTWISE, FLOPS, MATMUL, REDUCE, OpKind
from .aliases import grad_aliases
from .backward import backward_sections, capture_problem
from .classify import classify
from .items import Fused, Gemm, Pair, Section, describe
from .loops import STRATEGIES, admitted, blocked, resolve_loop, strategy_of


FUSES = ELEMENTWISE | REDUCE       # the ops a Fused group takes


@dataclass(frozen=True)
class Schedule:
    """The plan of one cell: forward sections, the loop strategy, and the backward plan derived from them."""
    cell: CellGraph
    pre: tuple          # items over all T·B rows, before the loop
    loop: tuple         # stages (tuples of items), per frame
    post: tuple         # items over all frames, after the loop
    hoist_param_grads: bool     # parameter gradients of loop ops as one reduction over all frames
    loop_strategy: str = "stages"
    state_classes: dict = field(default_factory=dict, compare=False)   # state -> classify.StateClass
    blocked_loops: dict = field(default_factory=dict, compare=False)   # strategy -> why an op of the loop rules it out
    forward: tuple = field(init=False, compare=False)    # Sections: pre, loop (one loop item), post
    backward: tuple = field(init=False, compare=False)   # Sections: post, loop, reduce, pre, shared

    def __post_init__(self):
        fwd_loop, bwd_loop = STRATEGIES[resolve_loop(self.loop_strategy, self.state_classes, self.cell.name,
                                                     blocked=self.blocked_loops)].plan(self)
        object.__setattr__(self, "forward", (Section("pre", self.pre), Section("loop", fwd_loop, per_frame=True),
                                             Section("post", self.post)))
        object.__setattr__(self, "backward", backward_sections(self, bwd_loop))

    @property
    def items(self):
        return [*self.pre, *(it for st in self.loop for it in st), *self.post]

    @property
    def loop_strategies(self) -> tuple:
        """The loop strategies every state's class admits and no op of the loop rules out (blocked_loops),
        best first (the plan runs loop_strategy)."""
        return admitted(self.state_classes, self.blocked_loops)

    @functools.cached_property
    def grad_aliases(self):
        """Which gradients are one another (plan/aliases.py), for backends that share their memory."""
        return grad_aliases(self, loop=all(hasattr(it, "stages") for it in self.backward[1].items))

    @functools.cached_property
    def capture_problem(self) -> str | None:
        """Why a whole backward body cannot be recorded as one CUDA graph, or None."""
        return capture_problem(self)

    def section_of(self) -> dict:
        out = {n: "pre" for it in self.pre for n in it.nodes}
        out.update({n: "post" for it in self.post for n in it.nodes})
        out.update({n: f"stage{k}" for k, st in enumerate(self.loop) for it in st for n in it.nodes})
        return out

    def plan_lines(self, sections) -> list:
        """[(section name, [lines])]: each item of a plan's sections, a loop's stages item by item."""
        out = []
        for sec in sections:
            lines = []
            for it in sec.items:
                stages = getattr(it, "stages", None)
                if stages is None:      # a plan item, or a loop item that describes itself (the scan)
                    lines.append((strategy_of(it).describe if sec.per_frame else describe)(it, self.cell))
                else:
                    lines += [f"{_stage_label(k, st)}: {describe(x, self.cell)}"
                              for k, st in zip(_stage_numbers(self, it), stages) for x in st.items]
            out.append((sec.name, lines))
        return out

    def summary(self) -> dict:
        cell = self.cell
        loop_ops = [n for st in self.loop for it in st for n in it.nodes]
        slots = sum(len(cell.reads(n)) for n in loop_ops)
        n_items = sum(len(st) for st in self.loop)
        gemms = [it for it in self.items if isinstance(it, Gemm)]
        fused = [it for it in self.items if isinstance(it, Fused)]
        where = self.section_of()
        order = {it: k for k, it in enumerate(it for st in self.loop for it in st)}
        reduce = next(sec for sec in self.backward if sec.name == "reduce").items
        return {
            "cell": cell.name,
            "ops": sum(1 for n in cell.graph if cell.op(n).kind not in (OpKind.INPUT, OpKind.PARAM)),
            "hoisted": [n for it in self.pre for n in it.nodes],
            "post_loop": [n for it in self.post for n in it.nodes],
            "per_frame_stages": [[n for it in st for n in it.nodes] for st in self.loop],
            "merged_gemms": [{"section": _section(where[it.nodes[0]]), "operand": fmt_read(it.operand, it.delay),
                              "ops": list(it.nodes), "weights": list(it.weights)} for it in gemms],
            "fused_groups": [{"section": _section(where[it.nodes[0]]), "ops": list(it.nodes)} for it in fused],
            "kernels_per_frame": {
                "forward": {"before_merge": len(loop_ops), "after_merge": n_items},
                "backward": {"before_merge": slots, "after_merge": n_items},
            },
            "param_grad_reductions": [describe(r, cell) for r in sorted(
                (r for r in reduce if r.item in order), key=lambda r: (order[r.item], getattr(r, "param", "")))],
            "loop_strategy": self.loop_strategy,
            "loop_strategies": list(self.loop_strategies),
            "blocked_loops": dict(self.blocked_loops),
            "state_classes": {st: {"class": c.kind, "why": c.why, "heads": c.heads}
                              for st, c in self.state_classes.items()},
            "forward_loop": dict(self.plan_lines(self.forward))["loop"],
            "backward": [{"section": name, "items": lines} for name, lines in self.plan_lines(self.backward)],
            "grad_classes": self.grad_aliases.classes(list(self.cell.graph)),
            "grad_assigned": [n for n in self.cell.graph if n in self.grad_aliases.assigned],
        }

    def __str__(self) -> str:
        cell, s = self.cell, self.summary()
        out = [f"schedule {cell.name}"]
        out.append(f"  pre (hoisted, once over all T·B rows): {len(self.pre)} kernels")
        out += [f"    {describe(it, cell)}" for it in self.pre]
        out.append(f"  loop (per frame, strategy {self.loop_strategy}): {len(self.loop)} stages")
        out += [f"    state {st}: {c.kind} ({c.why})" for st, c in self.state_classes.items()]
        out.append(f"    strategies this loop admits, best first: {', '.join(self.loop_strategies)}")
        out += [f"    not {name}: {why}" for name, why in self.blocked_loops.items()]
        for k, st in enumerate(self.loop):
            out += [f"    stage {k}: {describe(it, cell)}" for it in st]
        strategy = STRATEGIES[self.loop_strategy]
        out += [f"    runs {line}" for line in s["forward_loop"]       # what differs from the stages listed
                if strategy.describe or ": pair" in line or not line.startswith("stage")]
        note = strategy.note(self) if callable(strategy.note) else strategy.note
        out += [f"    {note}"] if note else []
        out.append(f"  post (once over all frames): {len(self.post)} kernels")
        out += [f"    {describe(it, cell)}" for it in self.post]
        out.append("  backward:")
        for name, lines in self.plan_lines(self.backward):
            title = strategy.title if name == "loop" else BACKWARD_TITLES[name]
            out.append(f"    {title}: {len(lines)} {'stage items' if name == 'loop' else 'kernels'}")
            out += [f"      {line}" for line in lines]
        if s["grad_classes"]:
            out.append("  gradients that are one another, one buffer where the backend shares them (cpu):")
            out += [f"    {' = '.join(c)}" for c in s["grad_classes"]]
        if s["grad_assigned"]:
            out.append(f"  gradients one write makes whole, stored, not added (cpu): {', '.join(s['grad_assigned'])}")
        k = s["kernels_per_frame"]
        out.append(f"  kernels per frame: forward {k['forward']['before_merge']} -> {k['forward']['after_merge']}, "
                   f"backward {k['backward']['before_merge']} -> {k['backward']['after_merge']}")
        return "\n".join(out)


BACKWARD_TITLES = {"post": "post reversed, over all frames",
                   "reduce": "parameter gradients of loop and post, reduced once over all frames",
                   "pre": "pre reversed, over all T·B rows", "shared": "weights shared by several ops"}


def _stage_label(k: int, stage) -> str:
    if any(isinstance(x, Pair) for x in stage.items):
        return f"stages {k}+{k + 1}"
    return f"stage {k}{' (overlap)' if stage.overlap else ''}"


def _stage_numbers(sched, loop_item) -> list:
    """The forward stage index each of a loop item's stages starts at (a pair spans two)."""
    nums, k = [], 0
    for st in loop_item.stages:
        nums.append(k)
        k += 2 if any(isinstance(x, Pair) for x in st.items) else 1
    return [k - 1 - n for n in nums] if loop_item.reverse else nums


def _section(where: str) -> str:
    return "loop" if where.startswith("stage") else where


def sections(cell: CellGraph) -> tuple[set, set, set]:
    """(pre, loop, post) node sets; parameters and inputs belong to none."""
    g = cell.graph
    delayed = {v for _, v, d in g.edges(data=True) if d["delay"] > 0}
    dep = set(delayed).union(*(nx.descendants(g, v) for v in delayed)) if delayed else set()
    core = {n for c in nx.strongly_connected_components(g) for n in c
            if len(c) > 1 or g.has_edge(n, n)}
    feeds_core = core.union(*(nx.ancestors(g, n) for n in core)) if core else set()
    compute = {n for n in g if cell.op(n).kind not in (OpKind.INPUT, OpKind.PARAM)}
    loop = dep & feeds_core & compute
    return compute - dep, loop, (dep & compute) - loop


SINKS = {OpKind.ADD, OpKind.SUB, OpKind.MUL}     # a frame and a parameter: a bias, a scale (sunk)


def sunk(cell: CellGraph, pre: set, loop: set) -> set:
    """The ops of pre that a loop whose frames run fused bodies computes in them instead (LoopStrategy.sinks): an
    add, sub or mul of one frame value (a hoisted GEMM's output, an input) and parameters, whose every reader is in
    the loop at delay 0 and which is no output. The loop then reads that frame value and the parameter, as many
    bytes a frame as it read the op's output, and the op's pass over all T·B rows (an LSTM's bias: a read and a
    write of [T·B, 4H], and its gradient's copy in the backward) is saved."""
    g, out = cell.graph, set(cell.outputs)

    def sinks(n):
        reads = [cell.op(u).kind for u, _ in cell.reads(n)]
        return (cell.op(n).kind in SINKS and n not in out and sum(k is not OpKind.PARAM for k in reads) == 1
                and all(v in loop and d["delay"] == 0 for _, v, d in g.out_edges(n, data=True)))
    return {n for n in pre if sinks(n)}


def _merge(cell: CellGraph, nodes: list) -> list:
    """Items for one section, in dependence order: merged GEMMs and fused elementwise groups."""
    order = topo_order(cell.graph, nodes)
    frame = same_frame(cell.graph).subgraph(nodes)
    group = {}      # node -> group key
    for v in order:
        op = cell.op(v)
        if op.kind in MATMUL:       # one GEMM per (operand, delay, heads)
            group[v] = ("gemm",) + cell.reads(v)[0] + (op.attrs[0] if op.kind is OpKind.HEAD_LINEAR else 1,)
        elif op.kind in FUSES:
            preds = [group[u] for u in frame.predecessors(v) if group[u][0] == "fused"
                     and cell.op(u).kind in FUSES and cell.op(u).size == op.size]
            group[v] = ("fused", v)
            _try_join(frame, group, [group[v]] + preds) or _try_join(frame, group, [group[v]] + preds[:1])
        else:
            group[v] = ("solo", v)
    # horizontal merge: independent fused groups of one size share a kernel where order allows
    keys = list(dict.fromkeys(group.values()))
    for a in keys:
        for b in keys:
            if a != b and a[0] == b[0] == "fused" and a in group.values() and b in group.values() \
                    and cell.op(a[1]).size == cell.op(b[1]).size:
                _try_join(frame, group, [a, b])
    members = {}
    for v in order:
        members.setdefault(group[v], []).append(v)
    items = []
    for key in nx.lexicographical_topological_sort(_quotient(frame, group), key=list(members).index):
        ns = tuple(members[key])
        if key[0] == "gemm":
            ws = tuple(cell.reads(n)[1][0] for n in ns)
            items.append(Gemm(ns, key[1], key[2], ws, tuple(cell.op(n).size for n in ns), key[3]))
        else:
            items.append(Fused(ns))
    return items


def _try_join(frame, group, keys) -> bool:
    """Relabels the groups `keys` as keys[0] if the item graph stays acyclic; says whether it did."""
    keys = list(dict.fromkeys(keys))
    if len(keys) < 2:
        return False
    trial = {n: (keys[0] if k in keys else k) for n, k in group.items()}
    if not nx.is_directed_acyclic_graph(_quotient(frame, trial)):
        return False
    group.update(trial)
    return True


def _quotient(frame, group) -> nx.DiGraph:
    q = nx.DiGraph()
    q.add_nodes_from(dict.fromkeys(group.values()))
    q.add_edges_from((group[u], group[v]) for u, v in frame.edges if u in group and v in group
                     and group[u] != group[v])
    return q


def build_schedule(cell: CellGraph, optimize: bool = True, loop: str = "auto", runs=None) -> Schedule:
    """The staged schedule (optimize=True), or the naive one: every op its own per-frame kernel; loop
    names the loop strategy ('auto': the best one the cell admits among `runs`, the strategies the
    backend runs; all of them when None)."""
    pre, core, post = sections(cell)
    classes, no = classify(cell, pre), blocked(cell, core)
    strategy = resolve_loop(loop, classes, cell.name, runs or STRATEGIES, optimize, no)
    if not optimize:
        stages = tuple((it,) for it in _singletons(cell, cell.frame_order()))
        return Schedule(cell, (), stages, (), hoist_param_grads=False, loop_strategy=strategy, state_classes=classes,
                        blocked_loops=no)
    if STRATEGIES[strategy].sinks:
        down = sunk(cell, pre, core)
        pre, core = pre - down, core | down
    items = _merge(cell, list(core))
    q = nx.DiGraph()
    q.add_nodes_from(range(len(items)))
    owner = {n: k for k, it in enumerate(items) for n in it.nodes}
    q.add_edges_from((owner[u], owner[v]) for u, v in same_frame(cell.graph).edges
                     if u in owner and v in owner and owner[u] != owner[v])
    stages = tuple(tuple(items[k] for k in sorted(gen)) for gen in nx.topological_generations(q))
    return Schedule(cell, tuple(_merge(cell, list(pre))), stages, tuple(_merge(cell, list(post))),
                    hoist_param_grads=True, loop_strategy=strategy, state_classes=classes, blocked_loops=no)


def _singletons(cell, nodes):
    for n in nodes:
        op = cell.op(n)
        if op.kind in MATMUL:
            (x, d), (w, _) = cell.reads(n)
            yield Gemm((n,), x, d, (w,), (op.size,), op.attrs[0] if op.kind is OpKind.HEAD_LINEAR else 1)
        elif cell.op(n).kind is not OpKind.INPUT:
            yield Fused((n,))


def schedule_flops(s: Schedule) -> dict:
    """FLOPs per row (one stream, one frame) of the forward and backward passes, each split into
    'hoisted' (pre, post and the parameter-gradient reductions) and 'per_frame' (the loop).

    Costs come from the op table's FLOPS rules; a gradient goes to its operand's section, except a
    parameter's (a matrix or vector parameter's slot is a reduction over all frames: hoisted)."""
    cell, where = s.cell, s.section_of()
    out = {d: {"hoisted": 0, "per_frame": 0} for d in ("forward", "backward")}
    for n, sec in where.items():
        part, op, reads = ("per_frame" if sec.startswith("stage") else "hoisted"), cell.op(n), cell.reads(n)
        forward, backward = FLOPS[op.kind](op.size, [cell.op(u).size for u, _ in reads])
        out["forward"][part] += forward
        for (u, _), f in zip(reads, backward):
            out["backward"]["hoisted" if cell.op(u).kind is OpKind.PARAM else part] += f
    return out
