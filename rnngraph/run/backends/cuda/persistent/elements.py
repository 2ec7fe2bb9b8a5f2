"""The per-element part of a persistent kernel's phase, each thread its elements (b, f) of the block's units: the
loads issued ahead of the phase's GEMM into registers (prefetch), then a GEMM's stores, or a fused group's body
(its loads, the generated statements, its stores) after its GEMM's sums (epilogue). kernels.py puts the lines in
place; `arg(kind, key)` names a kernel argument, and AT(p, ld, lag, col) addresses frame t - lag's row b."""
from __future__ import annotations

from .....plan.backward import kept_values
from ..source import rounded
from .phases import MAX_ROWS, THREADS, block_units, phases, problem, sources

MAX_PREFETCH = 8            # elements a thread loads into registers ahead of its phase's GEMM (prefetch), at most


def ld_arg(pointer: str) -> str:
    """The row-stride argument of a frame array's pointer argument (pp<k> -> ld<k>)."""
    return "ld" + pointer[2:]


def prefetch(cell, p, prefix: str, arg, ok, G: int, B: int) -> tuple:
    """(lines, {name: register}, elements a thread holds) loading what phase p's per-element part reads (its body's
    inputs, a backward body's gradients and the old values its '+=' stores add to, a dgemm's old value) into
    registers where ok(kind, node, lag) holds: each thread its one element (b, f), or where a thread has several
    (a block owning a head of 64 units and 16 rows: two), its elements e = tid + i·NT in register arrays [per],
    which the phase's loop walks unrolled (epilogue); none beyond MAX_PREFETCH elements a thread. The registers hold
    the values as stored (ST), converted where the body reads them: a conversion at the load would wait for it there,
    before the GEMM (half precision: the frame's whole trip to memory on its critical path)."""
    upb = -(-p.units // G)
    per = 1 if upb * max(B, MAX_ROWS) <= THREADS else -(-upb * B // THREADS)
    if p.kind == "gemm" or per > MAX_PREFETCH:
        return [], {}, 1
    early = {nm: (prefix + nm, src) for nm, src in read_ahead(cell, p) if ok(*src)}
    if not early:
        return [], {}, 1
    if per == 1:
        lines = [f"        ST {', '.join(f'{r} = {{}}' for r, _ in early.values())};",
                 f"        {{  {block_units(p.units)}",
                 "            if (tid < nu * NB) {", "                const int b = tid / nu, f = u0 + tid - b * nu;"]
        lines += [f"                {r} = {element_at(arg, src)};" for r, src in early.values()]
        return lines + ["            }", "        }"], {nm: r for nm, (r, _) in early.items()}, 1
    lines = [f"        ST {', '.join(f'{r}[{per}] = {{}}' for r, _ in early.values())};",
             f"        {{  {block_units(p.units)}",
             "            #pragma unroll",
             f"            for (int i = 0; i < {per}; ++i) {{",
             "                const int e = tid + i * NT;",
             "                if (e >= nu * NB) break;",
             "                const int b = e / nu, f = u0 + e - b * nu;"]
    lines += [f"                {r}[i] = {element_at(arg, src)};" for r, src in early.values()]
    return lines + ["            }", "        }"], {nm: f"{r}[i]" for nm, (r, _) in early.items()}, per


def read_ahead(cell, p) -> list:
    """[(name, (kind, node, lag))]: what the per-element part of phase p (not a lone gemm) reads from memory, each
    where it lies: a fused body's inputs (not its pair's own GEMM sums), a backward body's gradients and the old
    values its '+=' stores add to, a dgemm's old value."""
    if p.kind == "dgemm":
        return [("old", ("grad", p.item.operand, p.item.delay))]
    nodes, given = (p.item.fused.nodes, set(p.item.gemm.nodes)) if p.kind == "pair" else (p.item.nodes, set())
    spec, where = sources(cell, nodes, "bwd" if p.kind == "dfused" else "fwd")
    wanted = [(nm, where[nm]) for nm in spec.read_inputs() if where[nm][1] not in given or where[nm][2]]
    wanted += [(nm, where[nm]) for nm in spec.arrivals()]
    return wanted + [(f"{nm}_old", where[nm]) for nm, _, op in spec.stores if op == "+="]


def stored_sums(cell, p) -> set:
    """The GEMM nodes of pair phase p whose sums its epilogue stores: those something reads after its fused body
    (plan.backward.kept_values of both; an LSTM's or sLSTM's four products only its adds read, so none)."""
    return kept_values(cell, (*p.item.fused.nodes, *p.item.gemm.nodes)) & set(p.item.gemm.nodes)


def unstored(cell, loop) -> set:
    """The GEMM nodes whose sums the kernels running `loop` (a PersistentLoop) never store: its pairs' but
    stored_sums, where a kernel runs it (phases.problem None)."""
    return set() if problem(cell, loop) else {n for g in phases(cell, loop) for p in g if p.kind == "pair"
                                              for n in set(p.item.gemm.nodes) - stored_sums(cell, p)}


def element_at(arg, source) -> str:
    """AT(...) of a (kind, node, lag) source at column f: frame t - lag's row b."""
    kind, n, lag = source
    a = arg(kind, n)
    return f"AT({a}, {ld_arg(a)}, {lag}, f)"


def epilogue(cell, p, arg, early: dict, tagged: dict, st: str, per: int = 1, xs=None, arrive=None,
             last=()) -> list:
    """The per-(b, f) part of a phase: a GEMM's stores, a pair's stores (of stored_sums) and fused body (reading
    the GEMM's sums as stored in element type st), a group's body; per > 1: a thread's elements e = tid + i·NT,
    i < per, unrolled, so that the registers prefetch loaded them into are indexed by constants; xs: the line by
    which a pair's body also writes its GEMM's operand into the staged rows of x (heads.handed_on); arrive: lines
    run right after it (roles.py: each thread exactly one element, no loop over them, so that the registers handed
    on from frame to frame are renamed, not copied), the pair's stores after them, then the lines `last`; a group's
    body is followed by the lines `last` too (a dfused phase's parameter sums, sums.py)."""
    walk = ["        {   const int e = tid;      // warp roles: a thread exactly one element"] if arrive else \
        ["        for (int e = tid; e < nu * NB; e += NT) {"] if per == 1 else \
        ["        #pragma unroll", f"        for (int i = 0; i < {per}; ++i) {{",
         "            const int e = tid + i * NT;", "            if (e >= nu * NB) break;"]
    head = walk + ["            const int b = e / nu, u = e - b * nu, f = u0 + u;", "            (void)f;"]
    if p.kind == "gemm" and p.m > 1:    # head-wise: unit f's column in each merged block
        c = arg("cat", p.item)
        return head + [f"            AT({c}, {ld_arg(c)}, 0, {p.units * j} + f) = gs[({j} * nu + u) * NB + b];"
                       for j in range(p.m)] + ["        }"]
    if p.kind == "gemm":
        c = arg("cat", p.item)
        return head + [f"            AT({c}, {ld_arg(c)}, 0, f) = gs[u * NB + b];", "        }"]
    if p.kind == "dgemm" and p.m > 1:   # head-wise: each linear op's sum added in turn, stored rounded each time
        gx = arg("grad", p.item.operand)
        at = f"AT({gx}, {ld_arg(gx)}, {p.item.delay}, f)"
        adds = [f"            v = {rounded(f'v + gs[({j} * nu + u) * NB + b]', st)};" for j in range(p.m)]
        return head + [f"            CT v = {early.get('old', at)};", *adds, f"            {at} = v;", "        }"]
    if p.kind == "dgemm":
        gx = arg("grad", p.item.operand)
        at = f"AT({gx}, {ld_arg(gx)}, {p.item.delay}, f)"
        return head + [f"            {at} = {early.get('old', at)} + gs[u * NB + b];", "        }"]
    if p.kind == "pair":
        gemm, fused = p.item.gemm, p.item.fused
        c = arg("cat", gemm)
        lines = [f"            const CT g{j} = {rounded(f'gs[({j} * nu + u) * NB + b]', st)};"    # as stored
                 for j in range(len(gemm.nodes))]
        read = stored_sums(cell, p)
        lines += [f"            AT({c}, {ld_arg(c)}, 0, {p.units * j} + f) = g{j};"
                  for j, n in enumerate(gemm.nodes) if n in read]
        given = {n: f"g{j}" for j, n in enumerate(gemm.nodes)}
        kept = ["            " + xs] if xs else []
        if arrive:          # the sums and the body first, then the operand and the arrival, the stores last
            body, writes = _body(cell, fused.nodes, "fwd", arg, given, early, tagged, st, apart=True)
            pad = lambda lns: ["            " + ln for ln in lns]
            return (head + lines[:len(gemm.nodes)] + body + kept + pad(arrive) + lines[len(gemm.nodes):] + writes +
                    pad(last) + ["        }"])
        return head + lines + _body(cell, fused.nodes, "fwd", arg, given, early, tagged, st) + kept + ["        }"]
    return head + _body(cell, p.item.nodes, "fwd" if p.kind == "fused" else "bwd", arg, {}, early, tagged, st) + \
        list(last) + ["        }"]


def _body(cell, nodes, direction: str, arg, given: dict, early: dict, tagged: dict, st: str, apart: bool = False):
    """A fused group's body at element (b, f) of frame t: loads, the generated statements, stores.
    given: external nodes (read at delay 0) whose values are already in locals (a pair's GEMM sums);
    early: inputs already loaded into registers (prefetch); tagged: members also written as tagged words
    ({node: (buffer argument, whether half words)}, _exchange);
    apart: (the loads and statements, the stores) as two lists."""
    spec, where = sources(cell, nodes, direction)
    lines, read = [], set(spec.read_inputs())
    for nm, (kind, key) in zip(spec.in_names, spec.inputs):
        if nm not in read:
            continue
        local = given.get(key[0]) if kind == "ext" and key[1] == 0 else None
        lines.append(f"CT {nm} = {local or early.get(nm) or element_at(arg, where[nm])};")
    at = lambda nm: element_at(arg, where[nm])
    lines += [f"CT {nm} = {early.get(nm) or at(nm)};" for nm in spec.arrivals()]
    lines += spec.olds(at, "CT", early)
    lines += [ln.replace("T ", "CT ", 1) if ln.startswith("T ") else ln for ln in spec.body]
    writes = [_exchange(*tagged[n], cell.op(n).size, f"v{k}", st)       # first: what other blocks wait for
              for k, n in enumerate(nodes) if n in tagged and direction == "fwd"] + spec.writes(at)
    pad = lambda lns: ["            " + ln for ln in lns]
    return (pad(lines), pad(writes)) if apart else pad(lines + writes)


def _exchange(xb: str, half: bool, F: int, v: str, st: str) -> str:
    """The line writing value v of element (b, f) of a node of F features, as stored, into tagged buffer xb: a
    32-bit word above frame t's 16-bit tag where `half` (kernels.py), else a 64-bit word above its 32-bit tag."""
    if half:
        return f"exchange_half<ST>(&XAT({xb}, t & 1, f, {F}), t, {v});"
    return f"exchange({xb} + ((t & 1) * NB + b) * {F} + f, tags + t, {rounded(v, st)});"
