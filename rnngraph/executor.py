"""Runs a Schedule forward and backward through time on a backend, over a preallocated Workspace.

Layout: every node's value lives in a buffer [T+1, B, F]; frame t is row t+1 and row 0 holds the
initial state (zeros for nodes that are not states). A read with delay d at frame t is row
max(t+1-d, 0). Gradients mirror values. `naive` and `staged` differ only in the schedule they run.
"""
from __future__ import annotations

from .errors import RnnGraphError
from .ops import FORWARD, VJP, OpKind, accumulate, concat_vjp, slice_vjp
from .schedule import Gemm, Schedule, build_schedule

ALL = None  # the frame selector meaning "all T frames at once"
MODES = ("naive", "staged", "graph")


class Workspace:
    """Static buffers for one (schedule, T, B, dtype): values, gradients, packed weights, params."""

    def __init__(self, sched: Schedule, backend, T: int, B: int, dtype):
        cell, be = sched.cell, backend
        self.T, self.B, self.dtype = T, B, dtype
        self.vals, self.grads, self.cat, self.wcat = {}, {}, {}, {}
        for it in sched.items:
            if isinstance(it, Gemm):   # merged output [T+1, B, ΣF]; each linear node is a column block
                buf, gbuf = (be.zeros((T + 1, B, sum(it.sizes)), dtype) for _ in range(2))
                off = 0
                for n, f in zip(it.nodes, it.sizes):
                    self.vals[n], self.grads[n] = buf[..., off:off + f], gbuf[..., off:off + f]
                    off += f
                self.cat[it] = (buf, gbuf)
                k = cell.op(it.operand).size
                self.wcat[it] = (be.zeros((sum(it.sizes), k), dtype), be.zeros((sum(it.sizes), k), dtype))
        for n in cell.graph:
            op = cell.op(n)
            if op.kind is OpKind.PARAM:
                self.vals[n], self.grads[n] = be.zeros(op.attrs, dtype), be.zeros(op.attrs, dtype)
            elif n not in self.vals:
                self.vals[n], self.grads[n] = be.zeros((T + 1, B, op.size), dtype), be.zeros((T + 1, B, op.size), dtype)

    # -- frame selection: arrays handed to the rules are rows [N, F] -------------------------------
    def read(self, n: str, d: int, t, grads: bool = False):
        """Node n read with delay d at frame t ([B, F]) or at all frames (ALL, [T·B, F]); params as is."""
        buf = (self.grads if grads else self.vals)[n]
        if buf.ndim != 3:
            return buf
        if t is not ALL:
            return buf[max(t + 1 - d, 0)]
        if d <= 1:
            return _rows(buf[1 - d:self.T + 1 - d])
        xp = _xp(buf)   # d ≥ 2: frames before d-1 all read the initial state
        idx = xp.maximum(xp.arange(self.T) + 1 - d, 0)
        return _rows(buf[idx])

    def add(self, n: str, d: int, t, v, cols=slice(None)):
        """Adds gradient v (rows of the read) into n's gradient at the rows a delay-d read came from."""
        g = self.grads[n]
        if g.ndim != 3:
            accumulate(g, v)
        elif t is not ALL:
            g[max(t + 1 - d, 0)][:, cols] += v
        else:
            T, B = self.T, self.B
            v = v.reshape(T, B, v.shape[-1])
            if d <= 1:
                g[1 - d:T + 1 - d, :, cols] += v
            else:
                g[0:max(T + 1 - d, 0), :, cols] += v[d - 1:]
                g[0, :, cols] += v[:d - 1].sum(axis=0)


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _xp(a):
    import numpy
    return numpy if isinstance(a, numpy.ndarray) else __import__("cupy")


class Executor:
    """Forward and BPTT of one cell on one backend in one mode: 'naive' (node by node, frame by
    frame), 'staged' (the schedule) or 'graph' (the schedule, its loops replayed as CUDA graphs)."""

    def __init__(self, cell, backend, mode: str = "staged"):
        if mode not in MODES:
            raise RnnGraphError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if (mode == "graph") != bool(getattr(backend, "capture", False)):
            raise RnnGraphError("mode 'graph' runs on the cupy backend created with capture=True, and "
                                "only there; use 'staged' for eager execution")
        self.cell, self.backend, self.mode = cell, backend, mode
        self.sched = build_schedule(cell, optimize=(mode != "naive"))
        self._ws: dict = {}
        self.ws: Workspace | None = None

    def workspace(self, T: int, B: int, dtype) -> Workspace:
        key = (T, B, str(dtype))
        if key not in self._ws:
            self._ws[key] = Workspace(self.sched, self.backend, T, B, dtype)
        return self._ws[key]

    # -- forward ------------------------------------------------------------------------------
    def forward(self, params: dict, inputs: dict, init: dict, lengths=None):
        """params: name -> array; inputs: name -> [T, B, F]; init: state -> [B, F] (or None).
        Returns (outputs: name -> [T, B, F], finals: state -> [B, F]); finals are read at each
        sequence's own last frame when lengths [B] is given."""
        cell, be = self.cell, self.backend
        x0 = inputs[next(iter(cell.inputs))]
        T, B = x0.shape[0], x0.shape[1]
        ws = self.ws = self.workspace(T, B, x0.dtype)
        for n in cell.params:
            be.copy(ws.vals[n], params[n])
        for it, (w, _) in ws.wcat.items():
            be.pack(w, [ws.vals[p] for p in it.weights])
        for n, x in inputs.items():
            be.copy(ws.vals[n][1:], x)
        for s, (p, _) in cell.states.items():
            ws.vals[p][0] = 0 if init.get(s) is None else init[s]
        self._run_section(self.sched.pre, ws)
        be.loop(("fwd", id(self), id(ws)), lambda: self._forward_loop(ws))
        self._run_section(self.sched.post, ws)
        self.lengths = lengths
        outputs = {o: ws.vals[o][1:] for o in cell.outputs}
        finals = {s: self._final(ws.vals[p], lengths) for s, (p, _) in cell.states.items()}
        return outputs, finals

    def _final(self, buf, lengths):
        if lengths is None:
            return buf[self.ws.T]
        return buf[lengths, _xp(buf).arange(self.ws.B)]

    def _run_section(self, items, ws):
        for it in items:
            self._forward_item(it, ws, ALL)

    def _forward_loop(self, ws):
        for t in range(ws.T):
            for stage in self.sched.loop:
                for it in stage:
                    self._forward_item(it, ws, t)

    def _forward_item(self, it, ws, t):
        cell, be = self.cell, self.backend
        if isinstance(it, Gemm):
            out = ws.cat[it][0]
            out = out[t + 1] if t is not ALL else _rows(out[1:])
            be.gemm(ws.read(it.operand, it.delay, t), ws.wcat[it][0], out)
            return
        env = {}
        for n in it.nodes:
            env[n] = ws.read(n, 0, t)
            for u, d in cell.reads(n):
                env.setdefault((u, d), ws.read(u, d, t))
        be.fused_forward(cell, it, env)

    # -- backward -----------------------------------------------------------------------------
    def backward(self, grad_outputs: dict, grad_finals: dict | None = None):
        """grad_outputs: name -> [T, B, F] (or None); grad_finals: state -> [B, F] (or None).
        Returns (grad_inputs: name -> [T, B, F], grad_init: state -> [B, F], grad_params: name -> array)."""
        cell, be, ws = self.cell, self.backend, self.ws
        if ws is None:
            raise RnnGraphError("backward() called before forward()")
        for g in ws.grads.values():
            g[...] = 0
        for _, (_, gw) in ws.wcat.items():
            gw[...] = 0
        for o, g in (grad_outputs or {}).items():
            if g is not None:
                ws.grads[o][1:] += g
        for s, g in (grad_finals or {}).items():
            if g is not None:
                p = cell.states[s][0]
                if self.lengths is None:
                    ws.grads[p][ws.T] += g
                else:   # each sequence's final state is its value at its own last frame
                    ws.grads[p][self.lengths, _xp(g).arange(ws.B)] += g
        for it in reversed(self.sched.post):
            self._backward_item(it, ws, ALL, True)
        be.loop(("bwd", id(self), id(ws)), lambda: self._backward_loop(ws))
        for it, ps in self.sched.loop_param_reductions():
            self._param_grad(it, ps, ws)
        for it in reversed(self.sched.pre):
            self._backward_item(it, ws, ALL, True)
        grads = {n: ws.grads[n].copy() for n in cell.params}
        for it, (_, gw) in ws.wcat.items():
            off = 0
            for n, f in zip(it.nodes, it.sizes):
                grads[cell.reads(n)[1][0]] += gw[off:off + f]
                off += f
        return ({n: ws.grads[n][1:] for n in cell.inputs},
                {s: ws.grads[p][0] for s, (p, _) in cell.states.items()}, grads)

    def _backward_loop(self, ws):
        params = not self.sched.hoist_param_grads
        for t in reversed(range(ws.T)):
            for stage in reversed(self.sched.loop):
                for it in reversed(stage):
                    self._backward_item(it, ws, t, params)

    def _backward_item(self, it, ws, t, params: bool):
        cell, be = self.cell, self.backend
        if isinstance(it, Gemm):
            g = ws.cat[it][1]
            g = g[t + 1] if t is not ALL else _rows(g[1:])
            w, gw = ws.wcat[it]
            if it.delay <= 1 or t is not ALL:
                be.gemm_nn(g, w, ws.read(it.operand, it.delay, t, grads=True))
            else:
                ws.add(it.operand, it.delay, t, VJP[OpKind.LINEAR][0](be.xp, g, None, w, None, ()))
            if params:
                be.gemm_tn(g, ws.read(it.operand, it.delay, t), gw)
            return
        genv, env, targets = {}, {}, {}
        for n in it.nodes:
            env[n], genv[n] = ws.read(n, 0, t), ws.read(n, 0, t, grads=True)
            for u, d in cell.reads(n):
                env.setdefault((u, d), ws.read(u, d, t))
                if cell.op(u).kind is not OpKind.PARAM:   # where this read's gradient is added
                    targets[(u, d)] = ws.read(u, d, t, grads=True) if t is not ALL or d <= 1 else None
        viewable = all(v is not None for v in targets.values())
        be.fused_backward(cell, it, env, genv, lambda u, d, v, cols=slice(None): ws.add(u, d, t, v, cols),
                          params, targets if viewable else None)

    def _param_grad(self, it, ps, ws):
        """A loop op's parameter gradient, reduced over all frames at once (one GEMM or one sum)."""
        if isinstance(it, Gemm):
            g = _rows(ws.cat[it][1][1:])
            self.backend.gemm_tn(g, ws.read(it.operand, it.delay, ALL), ws.wcat[it][1])
            return
        for n in it.nodes:
            reads = self.cell.reads(n)
            for slot, (u, d) in enumerate(reads):
                if u in ps:
                    op = self.cell.op(n)
                    ins = [ws.read(v, e, ALL) for v, e in reads]
                    v = VJP[op.kind][slot](self.backend.xp, ws.read(n, 0, ALL, grads=True), *ins,
                                           ws.read(n, 0, ALL), op.attrs)
                    accumulate(ws.grads[u], v)


def run_fused_forward(xp, cell, it, env):
    """A fused group on any array module: its ops in order, through the forward rule table."""
    for n in it.nodes:
        op = cell.op(n)
        FORWARD[op.kind](xp, env[n], *[env[r] for r in cell.reads(n)], op.attrs)


def run_fused_backward(xp, cell, it, env, genv, add, params: bool):
    """A fused group's vector-Jacobian products, in reverse order, through the backward rule table."""
    for n in reversed(it.nodes):
        op, g = cell.op(n), genv[n]
        reads = cell.reads(n)
        for slot, (u, d) in enumerate(reads):
            if cell.op(u).kind is OpKind.PARAM and not params:
                continue
            if op.kind is OpKind.SLICE:
                add(u, d, g, slice(*op.attrs))
            elif op.kind is OpKind.CONCAT:
                add(u, d, concat_vjp(g, [cell.op(v).size for v, _ in reads], slot))
            else:
                ins = [env[r] for r in reads]
                add(u, d, VJP[op.kind][slot](xp, g, *ins, env[n], op.attrs))
