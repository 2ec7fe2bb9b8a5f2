"""Plan items, each one future kernel (or a loop of them): what the planner emits and the executor interprets."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import fmt_read
from ..ir.ops import REDUCE


# -- forward ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gemm:
    """Linear ops reading one operand, run as one GEMM: out[:, blocks] = operand · [W_1; W_2; …]ᵀ. With
    heads = k > 1 they are head-wise linear ops of k heads each, run as one batched GEMM a node: per head h,
    out[:, block j's head h] = operand[:, head h] · W_j[h]ᵀ; the packed weights [ΣF, K/k] then hold W_j
    [k, F_j/k, K/k] as rows, node after node."""
    nodes: tuple        # linear ops; their outputs are column blocks of the merged output, in order
    operand: str
    delay: int
    weights: tuple      # one matrix parameter per node, concatenated along rows
    sizes: tuple        # output features per node
    heads: int = 1      # k: the head-wise linear ops' heads; 1 for full matrices


@dataclass(frozen=True)
class Fused:
    """Connected elementwise ops of one feature size (or a lone concat), run as one kernel."""
    nodes: tuple        # evaluation order


@dataclass(frozen=True)
class Pair:
    """A per-frame GEMM feeding a fused group element by element: one kernel (GEMV inside the fused
    group) where the backend can, else the GEMM and then the group."""
    gemm: Gemm
    fused: Fused


# -- backward --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmGrad:
    """d operand += d out · W (and, with params, dW += d outᵀ · operand at the same frames)."""
    item: Gemm
    params: bool = False


@dataclass(frozen=True)
class FusedGrad:
    """A fused group's vector-Jacobian products, into its own nodes and what it reads (and, with
    params, its parameters); over all frames, one_kernel is False where one frame's gradient needs
    another's (op by op instead), atomic where two frames add into one row (plan/backward.py)."""
    item: Fused
    params: bool = False
    one_kernel: bool = True
    atomic: bool = False


@dataclass(frozen=True)
class WeightGrad:
    """dW_cat += Σ over all frames d outᵀ · operand: one GEMM for a merged GEMM's weights together."""
    item: Gemm


@dataclass(frozen=True)
class ParamSum:
    """d param += Σ over all rows of the backward rule of each (node, slot) of `item` reading it."""
    item: Fused
    param: str
    terms: tuple        # (node, slot) pairs, in evaluation order


@dataclass(frozen=True)
class SharedWeight:
    """d weight += rows [start, stop) of a merged GEMM's weight gradient (a weight read by several ops)."""
    item: Gemm
    weight: str
    start: int
    stop: int


# -- loops and sections ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """Items run in order at one frame; overlap: they are independent and a backend may run them at once."""
    items: tuple
    overlap: bool


@dataclass(frozen=True)
class Section:
    """A named run of items; a per-frame section holds one loop item (its strategy's)."""
    name: str
    items: tuple
    per_frame: bool = False


def describe(it, cell) -> str:
    """One line for a plan item, as `rnngraph schedule` prints it."""
    return TEXT[type(it)](it, cell)


def _gemm(it, cell):
    heads = f" per head ({it.heads} heads)" if it.heads > 1 else ""
    return (f"gemm   {', '.join(it.nodes)} = {fmt_read(it.operand, it.delay)} · "
            f"[{'; '.join(it.weights)}]ᵀ{heads}   -> [{sum(it.sizes)}]")


def _fused(it, cell):
    ops = ", ".join(f"{n}={cell.op(n).kind.value}" for n in it.nodes)
    rows = "   (a block per row: row reductions)" if any(cell.op(n).kind in REDUCE for n in it.nodes) else ""
    return f"fused  {{{ops}}}   [{cell.op(it.nodes[-1]).size}]{rows}"


def _pair(it, cell):
    return f"pair   {', '.join(it.gemm.nodes)} -> {{{', '.join(it.fused.nodes)}}}   (one kernel where the backend can)"


def _gemm_grad(it, cell):
    g = it.item
    own = f"; d[{'; '.join(g.weights)}] per frame" if it.params else ""
    return f"dgemm  d{fmt_read(g.operand, g.delay)} += d[{', '.join(g.nodes)}] · [{'; '.join(g.weights)}]{own}"


def _fused_grad(it, cell):
    how = ("   (atomic adds: reads a node at several delays)" if it.atomic else "" if it.one_kernel
           else "   (op by op: reads a member at a delay)")
    own = " with parameters" if it.params else ""
    return f"dfused {{{', '.join(reversed(it.item.nodes))}}}{own}{how}"


def _weight_grad(it, cell):
    return f"{'; '.join('d' + w for w in it.item.weights)} <- gemm over T"


def _param_sum(it, cell):
    return f"d{it.param} <- sum over T"


def _shared(it, cell):
    return f"d{it.weight} += rows {it.start}:{it.stop} of d[{'; '.join(it.item.weights)}]"


def head_wise(it) -> bool:
    """Whether a plan or loop item holds a head-wise GEMM (a Gemm with heads > 1), or its gradient."""
    inner = [getattr(it, k) for k in ("item", "gemm") if hasattr(it, k)]
    inner += [x for st in getattr(it, "stages", ()) for x in st.items]
    return getattr(it, "heads", 1) > 1 or any(head_wise(x) for x in inner)


TEXT = {Gemm: _gemm, Fused: _fused, Pair: _pair, GemmGrad: _gemm_grad, FusedGrad: _fused_grad,
        WeightGrad: _weight_grad, ParamSum: _param_sum, SharedWeight: _shared}
