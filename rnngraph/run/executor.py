"""Runs a Schedule forward and backward through time on a backend, over a preallocated Workspace.

`naive` and `staged` differ only in the schedule they run; `graph` runs the staged schedule with
its forward and backward bodies (or, where those need temporaries, its time loops) recorded once
as CUDA graphs and replayed.
"""
from __future__ import annotations

from collections import OrderedDict

from ..arrays import array_module
from ..errors import RnnGraphError
from ..ir.ops import OpKind
from ..plan.schedule import Gemm, Schedule, build_schedule
from .workspace import ALL, SERIAL, Workspace

MODES = ("naive", "staged", "graph")


class Executor:
    """Forward and BPTT of one cell on one backend in one mode: 'naive' (node by node, frame by
    frame), 'staged' (the schedule) or 'graph' (the schedule, recorded once as CUDA graphs and
    replayed). Example::

        ex = Executor(rnngraph.load_cell("lstm", 8, 16), get_backend("numpy"))
        outputs, finals = ex.forward(params, {"x": x}, {})          # x [T, B, 8]
        grad_inputs, grad_init, grad_params = ex.backward({"h": grad_y})
    """

    max_workspaces = 4

    def __init__(self, cell, backend, mode: str = "staged", schedule: Schedule | None = None):
        if mode not in MODES:
            raise RnnGraphError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if (mode == "graph") != bool(getattr(backend, "capture", False)):
            raise RnnGraphError("mode 'graph' runs on the cupy backend created with capture=True, and "
                                "only there; use 'staged' for eager execution")
        self.cell, self.backend, self.mode = cell, backend, mode
        self.sched = schedule or build_schedule(cell, optimize=(mode != "naive"))   # a variant, for experiments
        self._ws: OrderedDict = OrderedDict()
        self._pairs = self._gemm_fused_pairs()
        self._loop_items = {it for st in self.sched.loop for it in st}
        self.ws: Workspace | None = None
        self.serial = next(SERIAL)

    def _gemm_fused_pairs(self) -> set:
        """Loop stages k whose lone GEMM feeds the lone fused group of stage k+1 element by element
        (every linear op of the GEMM has the group's size and is read unshifted, unsliced)."""
        out, loop = set(), self.sched.loop
        for k in range(len(loop) - 1):
            (g, *rest), (f, *more) = loop[k], loop[k + 1]
            if rest or more or not isinstance(g, Gemm) or isinstance(f, Gemm):
                continue
            size = self.cell.op(f.nodes[0]).size
            reads = [(u, d, self.cell.op(n).kind) for n in f.nodes for u, d in self.cell.reads(n) if u in g.nodes]
            if set(g.sizes) == {size} and reads and all(d == 0 and kind is not OpKind.SLICE for _, d, kind in reads):
                out.add(k)
        return out

    def workspace(self, T: int, B: int, dtype) -> Workspace:
        key = (T, B, str(dtype))
        if key not in self._ws:
            self._ws[key] = Workspace(self.sched, self.backend, T, B, dtype)
            while len(self._ws) > self.max_workspaces:
                self._ws.popitem(last=False)
        self._ws.move_to_end(key)
        return self._ws[key]

    # -- forward ------------------------------------------------------------------------------
    def forward(self, params: dict, inputs: dict, init: dict, lengths=None):
        """params: name -> array; inputs: name -> [T, B, F]; init: state -> [B, F] (every earlier
        frame holds it), [D, B, F] (the D frames before this call, oldest first; D = cell.depths[s])
        or None (zeros). Returns (outputs: name -> [T, B, F], finals: state -> its last D frames,
        [B, F] where D is 1 and [D, B, F] otherwise), views into the workspace that the next call
        overwrites; finals end at each sequence's own last frame when lengths [B] is given.
        Parameters are used in place, not copied."""
        cell, be = self.cell, self.backend
        x0 = inputs[next(iter(cell.inputs))]
        ws = self.ws = self.workspace(x0.shape[0], x0.shape[1], x0.dtype)
        ws.bind_params({n: params[n] for n in cell.params})
        for n, x in inputs.items():
            be.copy(ws.frames(ws.vals[n]), x)
        for s, (p, _) in cell.states.items():
            h, a = ws.vals[p][:ws.P], init.get(s)
            h[...] = 0 if a is None else a[0] if a.ndim == 3 else a     # frames older than D: the oldest
            if a is not None and a.ndim == 3:
                h[ws.P - len(a):] = a
        self.lengths = lengths
        self._run_body("fwd", ws, self._forward_body)
        outputs = {o: ws.frames(ws.vals[o]) for o in cell.outputs}
        finals = {s: ws.vals[p][self._last_rows(cell.depths[s])] for s, (p, _) in cell.states.items()}
        return outputs, finals

    def _run_body(self, kind: str, ws, body):
        """Runs body(ws, run_loop) through the backend: the whole body recorded once and replayed, or,
        where it cannot be, only its time loop (run_loop); eager backends just run it."""
        key, be = (kind, self.serial, ws.serial, ws.version), self.backend
        if self.whole_capture:
            be.loop(key, lambda: body(ws, _call))
        else:
            body(ws, lambda fn: be.loop(key, fn))

    def _forward_body(self, ws, run_loop):
        """Everything after the inputs are staged: packing, pre, the time loop, post."""
        for it, (w, _) in ws.wcat.items():
            self.backend.pack(w, [ws.vals[p] for p in it.weights], transpose=it in self._loop_items)
        for it in self.sched.pre:
            self._forward_item(it, ws, ALL)
        run_loop(lambda: self._forward_loop(ws))
        for it in self.sched.post:
            self._forward_item(it, ws, ALL)

    @property
    def whole_capture(self) -> bool:
        """Whether the backend records whole forward/backward bodies (else only the time loops)."""
        return self.backend.capture_scope == "all" and self.capture_problem() is None

    def capture_problem(self) -> str | None:
        """Why a whole body cannot be recorded (a post-loop op whose gradient needs temporaries), or None."""
        for it in self.sched.post:
            reads = [(it.operand, it.delay)] if isinstance(it, Gemm) else \
                [r for n in it.nodes for r in self.cell.reads(n) if self.cell.op(r[0]).kind is not OpKind.PARAM]
            reads = set(reads)
            if len({u for u, _ in reads}) < len(reads):
                return f"post-loop op {it.nodes[0]} reads a value at several delays"
        return None

    def _last_rows(self, D: int):
        """The index of a state's last D frames in its [P+T, B, F] buffer: [B, F] rows for D = 1,
        [D, B, F] otherwise; each sequence's own last frames when lengths are given."""
        ws, end = self.ws, self.ws.P + self.ws.T     # one past the last frame's row
        if self.lengths is None:
            return end - 1 if D == 1 else slice(end - D, end)
        xp = array_module(self.lengths)
        last = self.lengths + ws.P - 1                                    # [B]
        rows_ = last if D == 1 else last[None, :] + xp.arange(1 - D, 1)[:, None]   # [D, B]
        return rows_, xp.arange(ws.B)

    def _forward_loop(self, ws):
        stages = self.sched.loop
        for t in range(ws.T):
            k = 0
            while k < len(stages):
                if k in self._pairs and self._forward_pair(stages[k][0], stages[k + 1][0], ws, t):
                    k += 2
                    continue
                if len(stages[k]) == 1:
                    self._forward_item(stages[k][0], ws, t)
                else:
                    self.backend.run_stage([lambda it=it: self._forward_item(it, ws, t) for it in stages[k]])
                k += 1

    def _forward_pair(self, gemm, fused, ws, t) -> bool:
        """Runs a merged GEMM and the fused group after it as one kernel where the backend can."""
        key = ("p", gemm, t)
        if key not in ws.memo:
            gemm_args = self._forward_args(gemm, ws, t)
            ws.memo[key] = self.backend.prepare_pair(self.cell, gemm, fused, gemm_args, self._env(fused, ws, t))
        if ws.memo[key] is None:
            return False
        self.backend.launch(ws.memo[key])
        return True

    def _forward_item(self, it, ws, t):
        key = ("f", it, t)
        if key not in ws.memo:
            ws.memo[key] = self._forward_args(it, ws, t)
        args = ws.memo[key]
        if isinstance(it, Gemm):
            self.backend.gemm(*args)
        else:
            self.backend.fused_forward(self.cell, it, *args)

    def _forward_args(self, it, ws, t):
        """The views one item reads and writes at frame t (memoised: the buffers are static)."""
        if isinstance(it, Gemm):
            out = ws.cat[it][0]
            return ws.read(it.operand, it.delay, t), ws.wcat[it][0], ws.read_cat(out, t)
        env = self._env(it, ws, t)
        return env, self.backend.prepare_forward(self.cell, it, env)

    def _env(self, it, ws, t):
        env = {}
        for n in it.nodes:
            env[n] = ws.read(n, 0, t)
            for u, d in self.cell.reads(n):
                env.setdefault((u, d), ws.read(u, d, t))
        return env

    # -- backward -----------------------------------------------------------------------------
    def backward(self, grad_outputs: dict, grad_finals: dict | None = None):
        """grad_outputs: name -> [T, B, F] (or None); grad_finals: state -> [B, F] (the last frame),
        [D, B, F] (shaped like finals) or None. Returns (grad_inputs: name -> [T, B, F], grad_init:
        state -> [B, F] or [D, B, F] like finals, grad_params: name -> array), views into the
        workspace that the next call overwrites."""
        cell, ws = self.cell, self.ws
        if ws is None:
            raise RnnGraphError("backward() called before forward()")
        ws.grad_arena[...] = 0
        for o, g in (grad_outputs or {}).items():
            if g is not None:
                ws.frames(ws.grads[o])[...] += g
        for s, g in (grad_finals or {}).items():
            if g is not None:       # [B, F]: the last frame's; [D, B, F]: each of the last D frames'
                ws.grads[cell.states[s][0]][self._last_rows(cell.depths[s] if g.ndim == 3 else 1)] += g
        self._run_body("bwd", ws, self._backward_body)
        init = {s: ws.grads[p][ws.P - 1] if cell.depths[s] == 1 else ws.grads[p][ws.P - cell.depths[s]:ws.P]
                for s, (p, _) in cell.states.items()}
        return {n: ws.frames(ws.grads[n]) for n in cell.inputs}, init, {n: ws.grads[n] for n in cell.params}

    def _backward_body(self, ws, run_loop):
        """Everything after the output gradients are staged: post, the reverse loop, hoisted
        parameter reductions, pre (input and pre-parameter gradients)."""
        hoist = self.sched.hoist_param_grads
        for it in reversed(self.sched.post):
            self._backward_item(it, ws, ALL, not hoist)
        run_loop(lambda: self._backward_loop(ws))
        for it in [it for st in self.sched.loop for it in st] + list(self.sched.post):
            self._param_grads(it, ws)
        for it in reversed(self.sched.pre):
            self._backward_item(it, ws, ALL, not hoist)
        for it in self.sched.pre:
            self._param_grads(it, ws)
        for it, (_, gw) in ws.wcat.items():   # weights shared by several linear ops
            off = 0
            for w, f in zip(it.weights, it.sizes):
                if w in ws.shared_weights:
                    ws.grads[w] += gw[off:off + f]
                off += f

    def _backward_loop(self, ws):
        params = not self.sched.hoist_param_grads
        for t in reversed(range(ws.T)):
            for stage in reversed(self.sched.loop):
                if len(stage) == 1 or not self._disjoint_grads(stage):
                    for it in reversed(stage):
                        self._backward_item(it, ws, t, params)
                else:
                    self.backend.run_stage([lambda it=it: self._backward_item(it, ws, t, params)
                                            for it in reversed(stage)])

    def _disjoint_grads(self, stage) -> bool:
        """Whether the items of a stage add their gradients into different nodes (may overlap)."""
        seen = set()
        for it in stage:
            reads = {it.operand} if isinstance(it, Gemm) else {u for n in it.nodes for u, _ in self.cell.reads(n)}
            if reads & seen:
                return False
            seen |= reads
        return True

    def _backward_item(self, it, ws, t, params: bool):
        be, key = self.backend, ("b", it, t)
        if key not in ws.memo:
            ws.memo[key] = self._backward_args(it, ws, t)
        args = ws.memo[key]
        if isinstance(it, Gemm):
            g, w, x, gx = args
            be.gemm_nn(g, w, gx)
            if params:
                be.gemm_tn(g, x, ws.wcat[it][1])
            return
        env, genv, prep = args
        if params or prep is None:
            be.fused_backward(self.cell, it, env, genv,
                              lambda u, d, v, cols=slice(None): ws.add(u, d, t, v, cols), params)
        else:
            be.launch(prep)

    def _backward_args(self, it, ws, t):
        if isinstance(it, Gemm):
            return (ws.read_cat(ws.cat[it][1], t), ws.wcat[it][0], ws.read(it.operand, it.delay, t),
                    ws.read(it.operand, it.delay, t, grads=True))
        env, genv = self._env(it, ws, t), {n: ws.read(n, 0, t, grads=True) for n in it.nodes}
        targets = self._targets(it, ws, t)
        return env, genv, None if targets is None else self.backend.prepare_backward(self.cell, it, env, genv,
                                                                                     targets)

    def _targets(self, it, ws, t):
        """(u, d) -> the gradient view each non-parameter read of a fused group adds into, or None
        where one kernel over all frames would add into one node at two delays (overlapping views)."""
        targets = {(u, d): ws.read(u, d, t, grads=True)
                   for n in it.nodes for u, d in self.cell.reads(n) if self.cell.op(u).kind is not OpKind.PARAM}
        if t is ALL and len({u for u, _ in targets}) < len(targets):
            return None
        return targets

    def _param_grads(self, it, ws):
        """An item's parameter gradients, reduced once over all frames (one GEMM or one sum each)."""
        if not self.sched.hoist_param_grads:
            return
        if isinstance(it, Gemm):
            g = ws.read_cat(ws.cat[it][1], ALL)
            self.backend.gemm_tn(g, ws.read(it.operand, it.delay, ALL), ws.wcat[it][1])
            return
        for n in it.nodes:
            reads = self.cell.reads(n)
            for slot, (u, d) in enumerate(reads):
                if self.cell.op(u).kind is OpKind.PARAM:
                    self.backend.param_grad(self.cell, n, slot, ws.read(n, 0, ALL, grads=True),
                                            [ws.read(v, e, ALL) for v, e in reads], ws.read(n, 0, ALL),
                                            ws.grads[u])


def _call(fn):
    fn()
