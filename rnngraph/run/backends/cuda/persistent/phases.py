"""How loop strategy 'persistent' splits a loop over the blocks of one cooperative kernel: its phases and
their units, where a grid barrier must separate them (or tagged words replace it), and the shared memory
each block holds. Plain data and checks, no source text (that is kernels.py).

The loop's items become phases, each split over the G blocks by units, contiguous and balanced (block k
owns units [U·k/G, U·(k+1)/G)):
  gemm    a per-frame GEMM out = x · Wᵀ: units are its output columns (head-wise: each linear op's
          output columns, a unit's column in every merged block);
  pair    a GEMM and the fused group reading it: units are the group's features (each one's column
          in every merged block of the GEMM), then the group's body for them;
  dgemm   d operand += g · W: units are the operand's columns (the block holds W's columns);
  fused / dfused  a fused group's forward or backward body: units are its features.
Where every GEMM of the loop is head-wise and G divides their heads, each block owns whole heads of every
value (units split at head boundaries): it reads only what it wrote itself, so no phase needs a grid barrier,
and the kernel is an ordinary launch (per head); else the head-wise GEMM rows read their head's slice of x
staged whole, with the barriers of full matrices.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .....plan.items import Fused, FusedGrad, Gemm, GemmGrad, Pair
from .....plan.loops.persistent import blocks
from ..fused import fused_backward_kernel, fused_forward_kernel, stored_only
from ..source import math_type

THREADS = 512               # threads per block: 16 warps, one weight row each at a time
MAX_ROWS = 8                # the batch rows a persistent kernel takes on CUDA cores (its accumulators live in
                            # registers); half storage takes more on tensor cores (mma.MMA_ROWS)
EXCHANGE_WORDS = 1          # tagged words a thread spins on per GEMV, at most (else barriers): measured on an
                            # H200, LSTM H=512: B=1 (1 word) 2.1 against 3.0 µs a frame, B=8 (8 words) 6.3 against 5.4


@dataclass(frozen=True)
class Phase:
    """One loop item as the kernel runs it: split over the blocks by `units`."""
    kind: str           # gemm | pair | dgemm | fused | dfused
    item: object        # the Gemm (gemm, dgemm), the Pair, or the Fused group
    units: int
    m: int = 1          # weight rows per unit (a pair, a head-wise gemm: the GEMM's merged blocks)
    width: int = 0      # K of a GEMM phase: the length of its rows in shared memory (head-wise: one head's)
    heads: int = 1      # a head-wise GEMM phase's heads; 1 for full matrices

    @property
    def head_width(self) -> int:
        """The x columns a head-wise GEMM phase stages a head: K/k (a gemm's or pair's), J·F/k (a dgemm's, a row
        of F/k for each of its J merged linear ops)."""
        return self.width * (self.m if self.kind == "dgemm" else 1)

    @property
    def aligned(self) -> int | None:
        """The feature count F whose column f this phase's block alone writes at every unit f it owns,
        or None where its outputs are not columns of one F (a GEMM merging several blocks)."""
        if self.kind == "gemm":
            return self.units if len(self.item.nodes) == 1 or self.heads > 1 else None
        return self.units


def problem(cell, loop) -> str | None:
    """Why a persistent kernel cannot run this loop, whatever the sizes, or None (the plan does not pick
    'persistent' for a loop its strategy's `blocks` rules out; a schedule given by hand may still hold one)."""
    nodes, gemms = [], []
    for st in loop.stages:
        for it in st.items:
            if _nodes(it) is None:
                return f"its loop has a {type(it).__name__} item, which a persistent kernel does not run"
            nodes += _nodes(it)
            gemms += [g for g in (_gemm(it),) if g is not None]
    if len({g.heads > 1 for g in gemms}) > 1:
        return "its loop has head-wise and full GEMMs, and a persistent kernel runs one kind"
    unequal = next((g for g in gemms if g.heads > 1 and len(set(g.sizes)) > 1), None)
    if unequal:
        return (f"its head-wise GEMM {', '.join(unequal.nodes)} merges linear ops of sizes {list(unequal.sizes)}, "
                "and a persistent kernel runs those of one size")
    return blocks(cell, nodes)


def _gemm(it):
    """The Gemm a loop item runs (a Pair's, a GemmGrad's, itself), or None."""
    return it.gemm if isinstance(it, Pair) else it.item if isinstance(it, GemmGrad) else it if isinstance(it, Gemm) \
        else None


def _nodes(it):
    """The nodes of a loop item a persistent kernel runs, or None for other items."""
    if isinstance(it, Pair):
        return it.gemm.nodes + it.fused.nodes
    if isinstance(it, (Gemm, Fused)):
        return it.nodes
    if isinstance(it, (GemmGrad, FusedGrad)) and not getattr(it, "params", False):
        return it.item.nodes
    return None


def phases(cell, loop) -> list:
    """[[Phase]] per barrier group candidate: the loop's stages (a stage whose items may not overlap
    becomes one group per item), each a list of phases in run order."""
    groups = []
    for st in loop.stages:
        ps = [_phase(cell, it) for it in st.items]
        groups += [ps] if st.overlap or len(ps) == 1 else [[p] for p in ps]
    return groups


def _phase(cell, it) -> Phase:
    if isinstance(it, Pair):
        g = it.gemm
        return Phase("pair", it, cell.op(it.fused.nodes[0]).size, len(g.nodes), cell.op(g.operand).size // g.heads,
                     g.heads)
    if isinstance(it, Gemm) and it.heads > 1:
        return Phase("gemm", it, it.sizes[0], len(it.nodes), cell.op(it.operand).size // it.heads, it.heads)
    if isinstance(it, Gemm):
        return Phase("gemm", it, sum(it.sizes), 1, cell.op(it.operand).size)
    if isinstance(it, GemmGrad) and it.item.heads > 1:
        g = it.item
        return Phase("dgemm", g, cell.op(g.operand).size, len(g.nodes), g.sizes[0] // g.heads, g.heads)
    if isinstance(it, GemmGrad):
        return Phase("dgemm", it.item, cell.op(it.item.operand).size, 1, sum(it.item.sizes))
    if isinstance(it, FusedGrad):
        return Phase("dfused", it.item, cell.op(it.item.nodes[0]).size)
    return Phase("fused", it, cell.op(it.nodes[0]).size)


def loop_heads(groups) -> int:
    """The heads every GEMM phase keeps apart (the gcd of theirs): 1 where one has full matrices."""
    return math.gcd(*(p.heads for g in groups for p in g if p.kind in ("gemm", "pair", "dgemm")))


def per_head(groups, G: int) -> bool:
    """Whether each of G blocks owns whole heads of every value: the GEMMs head-wise and G dividing their heads."""
    k = loop_heads(groups)
    return k > 1 and k % G == 0


def block_counts(cell, loop, sms: int) -> list:
    """The block counts to try, best first: at most one block per SM and no more than the largest phase's
    units; per head (the largest divisor of the heads within that) first where the GEMMs are head-wise."""
    groups = phases(cell, loop)
    full = min(sms, max(p.units for g in groups for p in g))
    k = loop_heads(groups)
    if k == 1:
        return [full]
    heads = max(d for d in range(1, min(k, full) + 1) if k % d == 0)
    return [heads] + ([full] if full != heads else [])


def staged(p, G: int, heads_apart: bool) -> int:
    """The x columns a GEMM phase stages a row: its width, or for a head-wise one a head's (K/k; a dgemm's J·F/k)
    times the heads staged (the block's own where each block owns whole heads, else all)."""
    return p.width if p.heads == 1 else p.head_width * (p.heads // G if heads_apart else p.heads)


def barriers(groups) -> list:
    """Per group, whether a grid barrier must come before it in every frame: before any GEMM phase
    (it reads whole rows), and before a fused phase unless every phase since the last barrier wrote
    only the columns its block owns of the same F (then this block's own writes are all it reads)."""
    out, pending = [], []
    for _ in range(2):                  # twice round: frame s's first group follows frame s-1's last
        out = []
        for g in groups:
            F = {p.units for p in g}
            own = all(p.kind in ("fused", "dfused") for p in g) and len(F) == 1 and \
                all(q.aligned == next(iter(F)) for q in pending)
            out.append(not own)
            pending = g if not own else pending + g
    return out


def shared_layout(groups, B: int, G: int, stride=lambda p: p.width) -> tuple:
    """The shared memory: ({id(phase): weight offset}, weight elements) of each GEMM phase's weights for the
    largest share of units a block gets (in the arrays' element type; its rows stride(p) apart), then (after
    them) the xs, gs and gp offsets and total elements of the x rows, the sums and the partials (in the math type)."""
    offs, n, xs, gs = {}, 0, 0, 0
    apart = per_head(groups, G)
    for p in (p for g in groups for p in g if p.kind in ("gemm", "pair", "dgemm")):
        per = -(-p.units // G)
        offs[id(p)] = n
        n += per * p.m * stride(p)
        xs, gs = max(xs, B * staged(p, G, apart)), max(gs, per * p.m * B)
    gp = max(gs, THREADS // 32 * B)
    return offs, n, 0, xs, xs + gs, xs + gs + gp


def exchanges(cell, groups, written, ctype: str, B: int, G: int, half_words: bool = False) -> dict:
    """{group index: node}: where every forward group is one GEMM phase (a pair or a gemm) reading, one frame
    back or earlier in this one, a node computed in float32 (stored in float32 or half) that a pair's or fused group's body writes on every block
    (its F ≥ G), and a pair's body reads only what its own block wrote, the grid barriers go: the writer
    stores each value with its frame's tag in one 64-bit word (two frames' words, by parity) and the GEMM
    spins on the words it stages. A block cannot overwrite a word two frames old before every block has
    read it: it has itself read every block's words of the frame in between. Else {} (barriers), as
    also where a thread would spin on more than EXCHANGE_WORDS words.
    half_words (tensor cores, half storage): each value as stored in a 32-bit word above its frame's 16-bit tag,
    the staging loading four words at once (the node's F a multiple of 4), at any B; a frame two back or more
    (before it, a barrier): a word then holds that frame's value or the one two frames older (a 16-bit tag tells
    them apart), never a value from an earlier launch."""
    out = {}
    for gi, g in enumerate(groups):
        (p, *rest) = g
        it = p.item.gemm if p.kind == "pair" else p.item
        _, w = written.get(getattr(it, "operand", None), (None, None))
        body = w.item.fused.nodes if w is not None and w.kind == "pair" else getattr(getattr(w, "item", None), "nodes", ())
        if math_type(ctype) != "float" or rest or p.kind not in ("pair", "gemm") or p.heads > 1 \
                or w is None \
                or w.kind not in ("pair", "fused") \
                or it.operand not in body or it.delay > 1 or w.units != p.width or w.units < G \
                or (p.width % 4 if half_words else B > MAX_ROWS or B * p.width > EXCHANGE_WORDS * THREADS):
            return {}
        if p.kind == "pair":
            spec, where = sources(cell, p.item.fused.nodes, "fwd")
            if not all(own(written.get(n), p, lag, gi) for nm, (_, n, lag) in where.items()
                       if nm in spec.in_names and n not in it.nodes):
                return {}
        out[gi] = it.operand
    return out


def block_units(units: int) -> str:
    """The C declaration of block blk's units [u0, u0 + nu) of `units` split over the G blocks; nu a constant where
    G divides them (the compiler then folds the loops over a block's rows)."""
    return (f"const int u0 = ({units} * blk) / G, nu = {units} % G == 0 ? {units} / G : "
            f"({units} * (blk + 1)) / G - u0;")


def nodes_of(p) -> tuple:
    """The nodes phase p computes (or whose gradients it computes)."""
    return _nodes(p.item)


def own(writer, p, lag: int, gi: int) -> bool:
    """Whether a forward value read at `lag` in phase p (group gi) is ready before the group's barrier: never
    written in the loop, or written by this block itself (an aligned phase of p's units) in an earlier frame
    or an earlier group of this one."""
    if writer is None:
        return True
    wg, w = writer
    return w.aligned == p.units and (lag >= 1 or wg < gi)


def sources(cell, nodes, direction: str) -> tuple:
    """(the group's KernelSpec, {argument name: (kind, node, lag)}) for its forward or backward body, storing only
    what the rest of the step reads (fused.stored_only)."""
    spec = stored_only(cell, nodes, direction, fused_forward_kernel(cell, nodes) if direction == "fwd" else
                       fused_backward_kernel(cell, nodes, set(cell.params)))
    src = {"ext": lambda k: ("val", k[0], k[1]), "val": lambda n: ("val", n, 0), "out": lambda n: ("val", n, 0),
           "grad": lambda n: ("grad", n, 0), "gext": lambda k: ("grad", k[0], k[1])}
    return spec, {nm: src[kind](key) for nm, (kind, key) in zip(spec.in_names + spec.out_names,
                                                                  spec.inputs + spec.outputs)}
