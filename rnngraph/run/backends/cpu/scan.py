"""Loop strategy 'scan' on the CPU: s_t = a_t ⊙ s_{t-d} + b_t walked in time, one pass over all frames (a
CPU core gains nothing from the log-depth scan the GPU runs: it does log T times the work), and its reverse
for the backward; plan/loops/scan.py's reference defines both. Half storage runs that reference (it carries
the state unrounded between frames, as this walk would have to in float32 copies)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .prelude import JIT, NoAlias
from .source import storage_of, window


@njit(pipeline_class=NoAlias, **JIT)
def scan_forward(T, d, B, F, a, la, b, lb, s, ls, m, lm):
    """s [d+T, B, F] (rows), its first d frames given: s_t = a_t ⊙ s_{t-d} + b_t, m_t = a_t ⊙ s_{t-d}; a, b
    rows [T·B, F] or vectors (l = 0)."""
    for r in range(T * B):
        wa, wb = a[r * la:r * la + F], b[r * lb:r * lb + F]
        prev, ws, wm = s[r * ls:r * ls + F], s[(r + d * B) * ls:(r + d * B) * ls + F], m[r * lm:r * lm + F]
        for f in range(F):
            p = wa[f] * prev[f]
            wm[f] = p
            ws[f] = p + wb[f]


@njit(pipeline_class=NoAlias, **JIT)
def scan_backward(T, d, B, F, a, la, s, ls, gs, lgs, gm, lgm, ga, lga, gb, lgb, has_ga, has_gb):
    """The reverse walk of scan_forward: gs [d+T, B, F] (∂L/∂s from every other reader) becomes the totals
    g_t = gs_t + a_{t+d} ⊙ (gm_{t+d} + g_{t+d}) and gm_t += g_t (so gm_{t+d} already holds the sum the next
    earlier frame needs); then the history's rows, and ga += gm ⊙ s_{t-d}, gb += g where they are given."""
    for t in range(T - 1, -1, -1):
        for bb in range(B):
            r, n = t * B + bb, (t + d) * B + bb
            g, wgm = gs[(r + d * B) * lgs:(r + d * B) * lgs + F], gm[r * lgm:r * lgm + F]
            if t + d < T:
                an, gn = a[n * la:n * la + F], gm[n * lgm:n * lgm + F]
                for f in range(F):
                    g[f] += an[f] * gn[f]
            for f in range(F):
                wgm[f] += g[f]
    for r in range(min(d, T) * B):
        g, wa, wgm = gs[r * lgs:r * lgs + F], a[r * la:r * la + F], gm[r * lgm:r * lgm + F]
        for f in range(F):
            g[f] += wa[f] * wgm[f]
    for r in range(T * B):
        wgm, prev, total = gm[r * lgm:r * lgm + F], s[r * ls:r * ls + F], gs[(r + d * B) * lgs:(r + d * B) * lgs + F]
        if has_ga:
            wga = ga[r * lga:r * lga + F]
            for f in range(F):
                wga[f] += wgm[f] * prev[f]
        if has_gb:
            wgb = gb[r * lgb:r * lgb + F]
            for f in range(F):
                wgb[f] += total[f]


def compile(be, cell, loop, views):
    """Each chain's walk as one call, or None for half storage, the naive mode or an unusual layout."""
    calls = []
    for a, b, s, m, gs, gm, ga, gb in views.chains:
        if storage_of(s) not in ("float32", "float64") or be.mode == "naive" or \
                (ga is not None and gb is not None and np.may_share_memory(ga, gb)):    # a is b: one gradient
            return None
        T, B, F = m.shape
        d = s.shape[0] - T
        wins = [window(x if x is not None else m) for x in (a, b, s, m, gs, gm, ga, gb)]    # m: unused stand-in
        if any(w is None for w in wins):
            return None
        (wa, la), (wb, lb), (ws, ls), (wm, lm), (wgs, lgs), (wgm, lgm), (wga, lga), (wgb, lgb) = wins
        if loop.reverse:
            calls.append((scan_backward, (T, d, B, F, wa, la, ws, ls, wgs, lgs, wgm, lgm, wga, lga, wgb, lgb,
                                          ga is not None, gb is not None)))
        else:
            calls.append((scan_forward, (T, d, B, F, wa, la, wb, lb, ws, ls, wm, lm)))
    return tuple(calls)
