"""Loop strategy 'scan': s_t = a_t ⊙ s_{t-d} + b_t with a and b free of states (minGRU, minLSTM, QRNN): a
parallel prefix scan over all frames, its backward the reverse scan; the rest of the loop runs after it.
The reference scan here is what numpy runs and what the GPU's scan kernels follow."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...arrays import in_float32, is_half
from ...ir.graph import fmt_read
from ..items import Fused
from .elementwise import elementwise_plan
from .stages import stages_plan, staged_only
from .strategy import LoopStrategy


@dataclass(frozen=True)
class ScanLoop:
    """Each state s = a ⊙ s@t-d + b over all frames at once, a log-depth prefix scan (backward: the
    reverse scan, then the gradients of a, b and the history over all frames)."""
    chains: tuple       # (producer p, its product m = a ⊙ p@t-d, a, b, d) per state
    reverse: bool


def scan_plan(sched) -> tuple:
    """(forward, backward) loop items: one chain (p, m, a, b, d) per linear-diagonal state, where p = m + b
    and m = a ⊙ p@t-d, scanned over all frames; the rest of the loop (the other states, which may read the
    scanned ones) runs after it, per feature where every other state is elementwise, else frame by frame;
    its backward runs before the reverse scan."""
    staged_only(sched, "scan")
    scanned = {s: c for s, c in sched.state_classes.items() if c.kind == "linear_diagonal"}
    chains = tuple((sched.cell.states[s][0], c.m, c.a, c.b, c.delay) for s, c in scanned.items())
    done = {n for p, m, *_ in chains for n in (p, m)}
    stages = (tuple(filter(None, (_without(it, done) for it in stage))) for stage in sched.loop)
    rest = tuple(filter(None, stages))          # the loop's stages without the scanned nodes, none left empty
    forward, backward = (ScanLoop(chains, False),), (ScanLoop(chains, True),)
    if not rest:
        return forward, backward
    others = {c.kind for s, c in sched.state_classes.items() if s not in scanned}
    f, b = (elementwise_plan if others <= {"elementwise"} else stages_plan)(sched, rest)
    return forward + f, b + backward


def _without(it, nodes: set):
    """A loop item without the given nodes (a fused group loses them; None when nothing is left)."""
    if not isinstance(it, Fused):
        return it
    keep = tuple(n for n in it.nodes if n not in nodes)
    return Fused(keep) if keep else None


def sole_gradient(cell, n, reader) -> bool:
    """Whether n's gradient comes from `reader` alone, which reads it once at delay 0 (n no output or state): a
    scan's backward then writes the gradient of its a (reader m) or b (reader p) instead of adding to it."""
    states = {p for p, _ in cell.states.values()}
    return n not in cell.outputs and n not in states and set(cell.graph.successors(n)) == {reader} and \
        [d for u, d in cell.reads(reader) if u == n] == [0]


class ChainViews(NamedTuple):
    """What a scan runs on: per chain, the workspace views (chain_views), and a chunk's cursor (as
    stages.FrameViews.running: a kernel may stop after the running chunk's n frames)."""
    chains: list
    running: tuple | None


def chain_views(ws, loop) -> ChainViews:
    """Per chain, the workspace views the scan runs on: a, b ([T, B, F], or a parameter [F]), s [d+T, B, F]
    (the state with its d frames of history), m [T, B, F], their gradients gs, gm, and ga, gb ([T, B, F],
    or None for a parameter, which the reduce section sums)."""
    out = []
    for p, m, a, b, d in loop.chains:
        ab = [ws.vals[n] if ws.vals[n].ndim == 1 else ws.frames(ws.vals[n]) for n in (a, b)]
        g = [None if ws.grads[n].ndim == 1 else ws.frames(ws.grads[n]) for n in (a, b)]
        out.append((*ab, ws.vals[p][ws.P - d:], ws.frames(ws.vals[m]), ws.grads[p][ws.P - d:],
                    ws.frames(ws.grads[m]), *g))
    return ChainViews(out, ws.running)


def reference(run, loop, ws, views):
    """The forward scan over all frames, or the reverse scan writing the gradients of p (history rows
    included), of its product m, and of a and b where they are not parameters."""
    xp = run.backend.xp
    for a, b, s, m, gs, gm, ga, gb in views.chains:
        if loop.reverse:
            scan_backward(xp, a, s, gs, gm, ga, gb)
        else:
            scan_forward(xp, a, b, s, m)


def describe(it, cell) -> str:
    if it.reverse:
        return "dscan  " + "; ".join(f"d{p} += {a}@t+{d} ⊙ d{p}@t+{d}, reverse scan; d{a}, d{b}, d{fmt_read(p, d)}"
                                     for p, m, a, b, d in it.chains)
    return "scan   " + "; ".join(f"{p} = {a} ⊙ {fmt_read(p, d)} + {b} ({m} too), over all frames"
                                 for p, m, a, b, d in it.chains)


def scan_forward(xp, a, b, s, m):
    """s [d+T, B, F]: its first d rows the frames before the call, its last T rows written with
    s_t = a_t ⊙ s_{t-d} + b_t by d interleaved log-depth scans; m [T, B, F] = a_t ⊙ s_{t-d} is written
    too; a, b: [T, B, F], or a vector [F]."""
    if is_half(s):
        return in_float32(xp, scan_forward, [a, b, s, m], (2, 3))
    T, d = m.shape[0], s.shape[0] - m.shape[0]
    A, C = _chains(xp, a, m, d, 1), _chains(xp, b, m, d, 0)
    C[0] += A[0] * s[:d]                    # the history enters as each chain's first b
    _scan(A, C)
    s[d:] = C.reshape(-1, *m.shape[1:])[:T]
    xp.multiply(a, s[:T], out=m)


def scan_backward(xp, a, s, gs, gm, ga, gb):
    """The gradients of scan_forward: gs [d+T, B, F] holds ∂L/∂s from every other reader; its last T
    rows become the totals g_t = gs_t + a_{t+d} ⊙ (gm_{t+d} + g_{t+d}) (a reverse scan) and its first d
    rows, the history's, get theirs added; gm [T, B, F] (∂L/∂m) += g; ga, gb ([T, B, F], or None for
    a parameter, which the reduce section sums from gm and gs) += gm ⊙ s_{t-d} and g; s as scan_forward's."""
    if is_half(gs):
        args = [a, s, gs, gm, ga, gb]
        return in_float32(xp, scan_backward, args, tuple(k for k in range(2, 6) if args[k] is not None))
    T, d = gm.shape[0], gs.shape[0] - gm.shape[0]
    A = xp.broadcast_to(a, gm.shape)
    k = max(T - d, 0)
    c, nxt = gs[d:].copy(), xp.zeros(gm.shape, gm.dtype)      # [T, B, F]: g_t = c_t + nxt_t ⊙ g_{t+d}
    c[:k] += A[d:] * gm[d:]
    nxt[:k] = A[d:]
    N, C = _chains(xp, nxt, gm, d, 0), _chains(xp, c, gm, d, 0)
    _scan(N[::-1], C[::-1])
    gs[d:] = C.reshape(-1, *gm.shape[1:])[:T]
    gm += gs[d:]
    j = min(d, T)
    gs[:j] += A[:j] * gm[:j]
    if ga is not None:
        ga += gm * s[:T]
    if gb is not None:
        gb += gs[d:]


def _chains(xp, x, like, d: int, fill):
    """x ([T, B, F] or [F]) as d interleaved chains [n, d, B, F], n = ⌈T/d⌉, frame t at [t // d, t % d];
    a fresh array, the frames past T filled with `fill` (1 or 0: the combine's identity)."""
    T, rest = like.shape[0], like.shape[1:]
    n = -(-T // d)
    out = xp.full((n * d, *rest), fill, dtype=like.dtype)
    out[:T] = x
    return out.reshape(n, d, *rest)


def _scan(A, C):
    """In place, along axis 0: (A_i, C_i) := (A_0, C_0) ∘ … ∘ (A_i, C_i) with (a1, c1) ∘ (a2, c2) =
    (a1·a2, a2·c1 + c2), by Hillis–Steele doubling: ⌈log2 n⌉ vectorised steps of O(n) work each."""
    n, k = len(A), 1
    while k < n:
        C[k:] = A[k:] * C[:-k] + C[k:]      # the right side is evaluated before anything is stored
        if 2 * k < n:
            A[k:] = A[k:] * A[:-k]
        k *= 2


STRATEGY = LoopStrategy(
    name="scan", item=ScanLoop, needs="a linear_diagonal state", admits=lambda kinds: "linear_diagonal" in kinds,
    plan=scan_plan, title="loop: the rest in reverse time (if any), then one reverse scan over all frames",
    views=chain_views, reference=reference, describe=describe,
    sinks=False,        # the scan reads a and b as hoisted arrays over all frames
    chunk_frames=0)     # each chunk a replay and copies that cost more than the scan: minGRU, T = 4096, B = 1,
                        # 1.79x whole calls in chunks of 1024
