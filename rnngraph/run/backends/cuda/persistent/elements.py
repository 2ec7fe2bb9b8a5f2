"""The per-element part of a persistent kernel's phase, each thread its elements (b, f) of the block's units: the
loads issued ahead of the phase's GEMM into registers (prefetch), then a GEMM's stores, or a fused group's body
(its loads, the generated statements, its stores) after its GEMM's sums (epilogue). kernels.py puts the lines in
place; `arg(kind, key)` names a kernel argument, and AT(p, ld, lag, col) addresses frame t - lag's row b."""
from __future__ import annotations

from ..source import rounded
from .phases import MAX_ROWS, THREADS, block_units, sources

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
    if p.kind == "dgemm":
        wanted = [("old", ("grad", p.item.operand, p.item.delay))]
    else:
        nodes, given = (p.item.fused.nodes, set(p.item.gemm.nodes)) if p.kind == "pair" else (p.item.nodes, set())
        spec, where = sources(cell, nodes, "bwd" if p.kind == "dfused" else "fwd")
        wanted = [(nm, where[nm]) for nm in spec.read_inputs() if where[nm][1] not in given or where[nm][2]]
        wanted += [(nm, where[nm]) for nm in spec.arrivals()]
        wanted += [(f"{nm}_old", where[nm]) for nm, _, op in spec.stores if op == "+="]
    early = {nm: (prefix + nm, src) for nm, src in wanted if ok(*src)}
    if not early:
        return [], {}, 1
    if per == 1:
        lines = [f"        ST {', '.join(f'{r} = {{}}' for r, _ in early.values())};",
                 f"        {{  {block_units(p.units)}",
                 "            if (tid < nu * NB) {", "                const int b = tid / nu, f = u0 + tid - b * nu;"]
        lines += [f"                {r} = {_at(arg, src)};" for r, src in early.values()]
        return lines + ["            }", "        }"], {nm: r for nm, (r, _) in early.items()}, 1
    lines = [f"        ST {', '.join(f'{r}[{per}] = {{}}' for r, _ in early.values())};",
             f"        {{  {block_units(p.units)}",
             "            #pragma unroll",
             f"            for (int i = 0; i < {per}; ++i) {{",
             "                const int e = tid + i * NT;",
             "                if (e >= nu * NB) break;",
             "                const int b = e / nu, f = u0 + e - b * nu;"]
    lines += [f"                {r}[i] = {_at(arg, src)};" for r, src in early.values()]
    return lines + ["            }", "        }"], {nm: f"{r}[i]" for nm, (r, _) in early.items()}, per


def _at(arg, source) -> str:
    kind, n, lag = source
    a = arg(kind, n)
    return f"AT({a}, {ld_arg(a)}, {lag}, f)"


def epilogue(cell, p, arg, early: dict, tagged: dict, st: str, per: int = 1, xs=None) -> list:
    """The per-(b, f) part of a phase: a GEMM's stores, a pair's stores and fused body (reading the GEMM's
    sums as stored in element type st), a group's body; per > 1: a thread's elements e = tid + i·NT, i < per,
    unrolled, so that the registers prefetch loaded them into are indexed by constants; xs: the line by which a
    pair's body also writes its GEMM's operand into the staged rows of x (heads.handed_on)."""
    walk = ["        for (int e = tid; e < nu * NB; e += NT) {"] if per == 1 else \
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
        lines += [f"            AT({c}, {ld_arg(c)}, 0, {p.units * j} + f) = g{j};" for j in range(len(gemm.nodes))]
        given = {n: f"g{j}" for j, n in enumerate(gemm.nodes)}
        kept = ["            " + xs] if xs else []
        return head + lines + _body(cell, fused.nodes, "fwd", arg, given, early, tagged, st) + kept + ["        }"]
    return head + _body(cell, p.item.nodes, "fwd" if p.kind == "fused" else "bwd", arg, {}, early, tagged, st) + \
        ["        }"]


def _body(cell, nodes, direction: str, arg, given: dict, early: dict, tagged: dict, st: str) -> list:
    """A fused group's body at element (b, f) of frame t: loads, the generated statements, stores.
    given: external nodes (read at delay 0) whose values are already in locals (a pair's GEMM sums);
    early: inputs already loaded into registers (prefetch); tagged: members also written as tagged words."""
    spec, where = sources(cell, nodes, direction)
    lines, read = [], set(spec.read_inputs())
    for nm, (kind, key) in zip(spec.in_names, spec.inputs):
        if nm not in read:
            continue
        local = given.get(key[0]) if kind == "ext" and key[1] == 0 else None
        lines.append(f"CT {nm} = {local or early.get(nm) or _at(arg, where[nm])};")
    at = lambda nm: _at(arg, where[nm])
    lines += [f"CT {nm} = {early.get(nm) or at(nm)};" for nm in spec.arrivals()]
    lines += spec.olds(at, "CT", early)
    lines += [ln.replace("T ", "CT ", 1) if ln.startswith("T ") else ln for ln in spec.body] + spec.writes(at)
    F = cell.op(nodes[0]).size
    lines += [f"exchange({tagged[n]} + ((t & 1) * NB + b) * {F} + f, tags + t, {rounded(f'v{k}', st)});"   # as stored
              for k, n in enumerate(nodes) if n in tagged and direction == "fwd"]
    return ["            " + ln for ln in lines]
