"""A layer's parameter gradients in PyTorch's layout: each backward, one fresh flat buffer in parameters()
order, filled per (layer, direction) from its executor's gradient arena (Executor.grad_source), where every
cell parameter's gradient sits at offsets fixed for the arena, and handed out as views of that buffer (grad_views),
or whole (rnngraph.torch splits it itself)."""
from __future__ import annotations

import numpy as np

from ..arrays import element_offsets


class GradGather:
    """The gather of a layer (layout [l][d]: its PyTorch-layout parameters, each as row blocks of cell
    parameters; see recurrent._param_layout), its plans kept for the last few gradient sources (whole calls,
    chunked calls)."""

    def __init__(self, backend, layout: list, dtype):
        self.backend, self.layout, self.dtype = backend, layout, dtype
        self.plans: dict = {}           # the gradient sources' keys -> per (layer, direction): (indices, runs)

    def __call__(self, grads, sources: list):
        """flat [Σ sizes], fresh: grads[l][d] (cell param -> its gradient, a view of the arena) from sources
        [(key, arena [N])], one per (layer, direction), in PyTorch's layout and parameters() order."""
        key = tuple(k for k, _ in sources)
        plan = self.plans.get(key) or self._plan(grads, [buf for _, buf in sources])
        if next(reversed(self.plans), None) != key:         # the last four sources' plans, the newest last
            self.plans = {**{k: v for k, v in list(self.plans.items())[-3:] if k != key}, key: plan}
        flat = self.backend.xp.empty(sum(g.size for g in plan), self.dtype)
        off = 0
        for (_, buf), g in zip(sources, plan):      # one source fills flat itself (a view costs cupy µs)
            self.backend.gather(buf, g, flat if len(plan) == 1 else flat[off:off + g.size])
            off += g.size
        return flat

    def _plan(self, grads, arenas: list) -> list:
        """Per (layer, direction), in parameters() order: the backend's plan (gather_plan) to gather its
        PyTorch-layout parameters from its arena [N], row blocks stacked: every element's offset there, and the
        same as runs of consecutive elements, [(arena offset, output offset, length)]."""
        plan, arenas = [], iter(arenas)
        for per_l, g_l in zip(self.layout, grads):
            for per_d, g in zip(per_l, g_l):
                arena = next(arenas)
                idx = np.concatenate([element_offsets(g[p], arena) for _, _, parts in per_d for p, _, _ in parts])
                plan.append(self.backend.gather_plan(idx, runs(idx)))
        return plan


def grad_views(flat, params: dict) -> dict:
    """name -> the view of flat [Σ sizes] (GradGather's) shaped like params[name], in their order."""
    out, off = {}, 0
    for name, p in params.items():
        out[name] = flat[off:off + p.size].reshape(p.shape)
        off += p.size
    return out


def runs(idx) -> list:
    """idx [n] (ints) as runs of consecutive values: [(first value, its position in idx, length)]."""
    starts = np.concatenate([[0], np.flatnonzero(np.diff(idx) != 1) + 1]).astype(int)
    return [(int(idx[s]), int(s), int(e - s)) for s, e in zip(starts, [*starts[1:], len(idx)])]
