"""One handler per plan item kind (the executor's HANDLERS, run/executor.py): each asks the backend to compile
its item on the views it reads, once (memoised in the workspace: Executor._prepared), and launches that, or runs
the reference (run/backends/base.py) where the backend compiled nothing. A per-frame product whose sum its
reader at the next frame adds (plan.backward.next_frame_readers) may run in parts (gemm_grad, fused_grad)."""
from __future__ import annotations

from ..ir.ops import OpKind, accumulate
from .backends.base import head_parts, run_fused_backward, run_fused_forward, run_param_grad
from .workspace import ALL, LOOP_SUMS


def _heads(ex, it, key, ws, merged, packed, operand) -> list:
    """base.head_parts of head-wise Gemm `it` on these views, built once per key (a step and frame)."""
    if (key, "heads") not in ws.memo:
        ws.memo[key, "heads"] = head_parts(it, merged, packed, operand)
    return ws.memo[key, "heads"]


def _product(be, t):
    """The backend's product for frame t: over all frames (ALL) gemm_frames, which never runs in lanes, else gemm."""
    return be.gemm_frames if t is ALL else be.gemm


def gemm(ex, it, ws, t):
    (x, w, out), launch = ex._prepared(it, ws, t, lambda: _views(it, ws, t))
    if launch:
        ex.backend.launch(launch)
    elif it.heads > 1:              # per linear op, per head h: out_j[h] = x[h] · W_j[h]ᵀ
        for o, wj, xh in _heads(ex, it, (it, t), ws, out, w, x):
            ex.backend.head_gemm(xh, wj, o, tb=True)
    else:
        _product(ex.backend, t)(x, w, out, tb=True)


def fused(ex, it, ws, t):
    env, launch = ex._prepared(it, ws, t, lambda: _env(ex, it, ws, t))
    if launch:
        ex.backend.launch(launch)
    else:
        run_fused_forward(ex.backend.xp, ex.cell, it, env)


def pair(ex, it, ws, t):
    """A per-frame GEMM and the fused group after it as one kernel, or the two apart."""
    _, launch = ex._prepared(it, ws, t, lambda: (_views(it.gemm, ws, t), _env(ex, it.fused, ws, t)))
    if launch:
        ex.backend.launch(launch)
    else:
        gemm(ex, it.gemm, ws, t)
        fused(ex, it.fused, ws, t)


def _views(it, ws, t):
    """x [B, K] (or [T·B, K]), the packed weights w [ΣF, K] and the merged output's rows [B, ΣF]."""
    return ws.read(it.operand, it.delay, t), ws.wcat[it][0], ws.at(ws.cat[it][0], t)


def _env(ex, it, ws, t):
    env = {}
    for n in it.nodes:
        env[n] = ws.read(n, 0, t)
        for u, d in ex.cell.reads(n):
            env.setdefault((u, d), ws.read(u, d, t))
    return env


def gemm_grad(ex, step, ws, t):
    """d operand += g · W (=, its one write: plan/aliases.py); with params also dW += gᵀ · operand."""
    it, be = step.item, ex.backend
    add = it.operand not in ws.aliases.assigned
    (g, w, x, gx, gw), launch = ex._prepared(step, ws, t, lambda: (
        ws.at(ws.cat[it][1], t), ws.wcat[it][0], ws.read(it.operand, it.delay, t),
        ws.read(it.operand, it.delay, t, grads=True), ws.wcat[it][1]))
    parts = add and _parts(ex, step, ws, t, g, w)
    if parts or launch:
        be.launch(parts or launch)
    elif it.heads > 1:              # per linear op j, per head h: dx[h] += g_j[h] · W_j[h]
        for gj, wj, gxh in _heads(ex, it, (step, t), ws, g, w, gx):
            be.head_gemm(gj, wj, gxh, accumulate=add)
    elif t is ALL and step.params:      # both over all frames: a backend may share work between them
        be.gemm_grads_frames(g, w, x, gx, gw, accumulate=add)
        return
    else:
        _product(be, t)(g, w, gx, accumulate=add)
    if step.params and it.heads > 1:
        for gj, gwj, xh in _heads(ex, it, (step, t, "w"), ws, g, gw, x):
            be.head_gemm(gj, xh, gwj, ta=True, accumulate=True)
    elif step.params:
        _product(be, t)(g, x, gw, ta=True, accumulate=True)


def _parts(ex, step, ws, t, g, w):
    """The launchable of frame t's product in parts (backend.product_parts), whose sum its reader at frame t - 1
    adds (plan.backward.next_frame_readers; fused_grad), or None: the product adds itself. Decided once; one
    buffer of parts serves every frame (its reader has read frame t + 1's before frame t's are written)."""
    if (("parts", step), t) not in ws.memo:
        reader = ex._readers.get(step) if t is not ALL and t >= 1 else None
        made = reader and ex.backend.product_parts(g, w, ex.cell, reader, step.item.operand,
                                                     ws.memo.get((("parts", step), ALL)))
        ws.memo[("parts", step), t] = made and made[0]
        if made:
            ws.memo[("parts", step), ALL] = made[1]
            ws.memo[("parts", reader), t - 1] = {step.item.operand: made[1]}
    return ws.memo[("parts", step), t]


def fused_grad(ex, step, ws, t):
    it = step.item
    kernel = step.one_kernel and not step.params
    parts = ws.memo.get((("parts", step), t), {})     # node -> [S, B, F]: products' parts left to this reader
    (env, genv, targets, aliases, _), launch = ex._prepared(step, ws, t, lambda: (
        _env(ex, it, ws, t), {n: ws.read(n, 0, t, grads=True) for n in it.nodes},
        {(u, d): ws.read(u, d, t, grads=True) for n in it.nodes for u, d in ex.cell.reads(n)
         if ex.cell.op(u).kind is not OpKind.PARAM}, ws.aliases, parts), kernel)
    if launch:
        ex.backend.launch(launch)
    else:
        for n, p in parts.items():      # a reader compiled without them: added first
            ex.backend.add_parts(genv[n], p)
        run_fused_backward(ex.backend.xp, ex.cell, it, env, genv,
                           lambda u, d, v, cols=slice(None): ws.add(u, d, t, v, cols), step.params, aliases.skips)


def weight_grad(ex, step, ws, t):
    """dW_cat += Σ_frames gᵀ · operand: one GEMM over all T·B rows (head-wise: a batched GEMM a linear op)."""
    it = step.item
    g, x, gw = ws.at(ws.cat[it][1], ALL), ws.read(it.operand, it.delay, ALL), ws.wcat[it][1]
    if it.heads == 1:
        ex.backend.gemm_frames(g, x, gw, ta=True, accumulate=True)
        return
    for gj, gwj, xh in _heads(ex, it, (step, ALL), ws, g, gw, x):
        ex.backend.head_gemm(gj, xh, gwj, ta=True, accumulate=True)


def param_sum(ex, step, ws, t):
    cell, twin = ex.cell, ws.aliases.twins.get(step)
    if (step.item, step.param) in ws.memo.get(LOOP_SUMS, ()):   # the backward loop's kernel sums it (Executor._loop)
        return
    if twin is not None:        # the same sum, already made (plan/aliases.py)
        accumulate(ws.grads[step.param], ws.grads[twin.param])
        return

    def views():
        terms = []
        for n, slot in step.terms:
            reads = cell.reads(n)
            terms.append((n, slot, ws.read(n, 0, ALL, grads=True), [ws.read(v, e, ALL) for v, e in reads],
                          ws.read(n, 0, ALL)))
        return terms, ws.grads[step.param]
    (terms, out), launch = ex._prepared(step, ws, ALL, views)
    if launch:
        ex.backend.launch(launch)
        return
    for n, slot, g, ins, y in terms:
        run_param_grad(ex.backend.xp, cell, n, slot, g, ins, y, out)


def shared(ex, step, ws, t):
    g = ws.grads[step.weight]
    g += ws.wcat[step.item][1][step.start:step.stop].reshape(g.shape)     # head-wise: [k, F/k, K/k]
