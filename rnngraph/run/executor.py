"""Interprets a Schedule's forward and backward plans on a backend, over a preallocated Workspace.

Every plan item runs through one table, HANDLERS, keyed by its kind (each kind's handler in handlers.py); every
loop item through one handler and its strategy's record (plan/loops). Each asks the backend to compile the item
on its views once (memoised in the workspace) and launches that, or runs the reference (run/backends/base.py, or
the loop strategy's own) where the backend compiled nothing. The backend's mode decides the schedule: 'naive'
runs the naive one, 'staged' and 'graph' the staged one ('graph' on a backend that records).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import numpy

from ..arrays import array_module
from ..errors import RnnGraphError
from ..plan.items import Fused, FusedGrad, Gemm, GemmGrad, Pair, ParamSum, SharedWeight, WeightGrad, head_wise
from ..plan.backward import next_frame_readers
from ..plan.loops import STRATEGIES, strategy_of
from ..plan.schedule import Schedule, build_schedule
from . import handlers
from .chunk_plan import LADDER_TOP, within
from .chunks import Chunked
from .settings import store_limit
from .workspace import ALL, LOOP_SUMS, SERIAL, Arenas, Workspace, rows, shared_grads, stored_bytes, write_history


# memo keys: a whole call's views of its states' rows before frame 0, their gradients, and their last frames
HISTORY, GRAD_INIT, FINALS = ("history", "views"), ("grad init", "views"), ("finals", "views")


class Executor:
    """Forward and BPTT of one cell on one backend, in the backend's mode: 'naive' (node by node, frame by
    frame), 'staged' (the schedule) or 'graph' (the schedule on a backend that records CUDA graphs);
    loop names the loop strategy ('auto' or one of plan.loops.STRATEGIES; the backend must run it;
    `loop_runs` says what the last forward ran, `loop_note` why a loop ran as another strategy). Example::

        ex = Executor(rnngraph.load_cell("lstm", 8, 16), get_backend("numpy"))
        outputs, finals = ex.forward(params, {"x": x}, {})          # x [T, B, 8]
        grad_inputs, grad_init, grad_params = ex.backward({"h": grad_y})
    """

    max_workspaces = 1024    # views into the shared arenas: cheap; the backend bounds the recorded graphs

    def __init__(self, cell, backend, schedule: Schedule | None = None, loop: str = "auto", chunk: int | None = None,
                 recompute: bool | None = None):
        self.cell, self.backend, self.loop_asked = cell, backend, loop
        if schedule is None:
            schedule = build_schedule(cell, optimize=backend.mode != "naive", loop=loop, runs=backend.auto_loops)
        elif loop != "auto":
            schedule = replace(schedule, loop_strategy=loop)
        self.sched = schedule      # a variant may be given, for experiments
        if schedule.loop_strategy not in backend.loops:
            raise RnnGraphError(f"backend '{backend.name}' does not run loop strategy {schedule.loop_strategy!r}; "
                                f"it runs {', '.join(s for s in STRATEGIES if s in backend.loops)}")
        kinds = {type(it) for sec in schedule.forward + schedule.backward for it in sec.items}
        if kinds - HANDLERS.keys():
            raise RnnGraphError(f"loop strategy {schedule.loop_strategy!r} has no runner in this executor")
        self._ws: OrderedDict = OrderedDict()
        self.arenas = Arenas(backend)
        self._loop_gemms = {it for st in schedule.loop for it in st if isinstance(it, Gemm)}
        self._readers = next_frame_readers(schedule)    # per-frame products that may leave their sums to a reader
        self.backward_sections = joined(schedule.backward)
        self.ws: Workspace | None = None
        self.serial = next(SERIAL)
        self.loop_runs, self.loop_note = schedule.loop_strategy, None
        self.chunk = chunk          # frames per chunk of a longer call; None: chunk_frames; 0: never
        self.recompute = recompute  # recompute chunks in the backward: True, False, or None (where storing
        self.recomputed = False     # every value would exceed store_limit); whether the last forward did
        self.chunks, self.chunked = None, False
        self._costs: dict = {}      # (B, dtype) -> _store_cost; ("walks", B, dtype) -> _walks

    def workspace(self, T: int, B: int, dtype, chunk: bool = False) -> Workspace:
        """The workspace for (T, B, dtype) of whole calls, or of chunks (chunk: its recordings read the call's
        cursor), carved from this executor's arenas (made on first use, or again after the arenas grew). Sharing
        is safe: every call writes every frame it reads, and the history rows before frame 0, read only for
        states, are written from the initial state by each forward."""
        key = (T, B, numpy.dtype(dtype), chunk)
        ws = self._ws.get(key)
        if ws is None or ws.generation != self.arenas.generation:
            ws = Workspace(self.sched, self.backend, T, B, dtype, self.arenas)
            dead = [self._ws.pop(k) for k in [k for k, w in self._ws.items() if w.generation != ws.generation]]
            self._ws[key] = ws
            while len(self._ws) > self.max_workspaces:
                dead.append(self._ws.popitem(last=False)[1])
            self.backend.forget({w.serial for w in dead})
        self._ws.move_to_end(key)
        return ws

    @property
    def grad_source(self) -> tuple:
        """(a key that changes whenever the buffer or the gradients' places in it do, the flat buffer [N] the
        last backward's parameter gradients are views of): the gradient arena (they lead it, at the same
        offsets for every T and B), or the chunks' own buffer."""
        if self.chunked:
            return ("chunks", self.serial, self.arenas.generation), self.chunks.grad_flat
        return ("whole", self.serial, self.arenas.generation), self.ws.grad_arena

    def _store_cost(self, B: int, dtype) -> tuple:
        """(bytes, bytes a frame) a workspace of B rows of dtype stores for the backward (stored_bytes is
        linear in T), computed once per (B, dtype)."""
        key = (B, numpy.dtype(dtype))
        if key not in self._costs:
            shared = shared_grads(self.sched, self.backend)
            fixed = stored_bytes(self.sched, 0, B, dtype, shared)
            self._costs[key] = fixed, stored_bytes(self.sched, 1, B, dtype, shared) - fixed
        return self._costs[key]

    def _walks(self, B: int, dtype) -> bool:
        """Whether the loop's kernel walks only a chunk's n frames at B rows of dtype, so that a ladder pads a
        chunk at little cost (chunk_plan.spans): the backend's kernel for the strategy does (walking_loops) and runs
        here, not the reference. Only the cost depends on it: padded frames are masked either way."""
        key = ("walks", B, numpy.dtype(dtype))
        if key not in self._costs:
            walking = strategy_of(self._time_loop).name in self.backend.walking_loops
            self._costs[key] = walking and self._kernel(B, dtype)
        return self._costs[key]

    def batch_rows(self, B: int, dtype) -> int:
        """The rows a call of B sequences of dtype runs as: B, or more where the backend's kernel for the loop
        runs B rows slowly and more rows fast (Backend.batch_rows); the caller adds sequences of length 0."""
        key = ("rows", B, numpy.dtype(dtype))
        if key not in self._costs:
            self._costs[key] = self.backend.batch_rows(self.cell, self._time_loop, B, dtype) if self._kernel(B, dtype) \
                else B
        return self._costs[key]

    @property
    def _time_loop(self):
        """The loop item of the forward's time loop."""
        return self.sched.forward[1].items[0]

    def _kernel(self, B: int, dtype) -> bool:
        """Whether the backend's kernel for the loop's strategy runs it at B rows of dtype, not the reference."""
        be, loop = self.backend, self._time_loop
        return not (be.loop_problem(self.cell, loop, B, dtype) or
                    self.loop_asked == "auto" and be.auto_problem(self.cell, loop, B, dtype))

    @property
    def chunk_frames(self) -> int:
        """Frames per chunk of a longer call (0: whole calls): the executor's chunk, else the backend's, else
        (graph mode) the loop strategy's, as measured for it."""
        K = self.backend.chunk_frames if self.chunk is None else self.chunk
        return STRATEGIES[self.sched.loop_strategy].chunk_frames if K is None else K

    @property
    def whole_capture(self) -> bool:
        """Whether the backend records whole forward/backward bodies (else only the time loops)."""
        return self.backend.records == "all" and self.sched.capture_problem is None

    # -- forward and backward -----------------------------------------------------------------
    def forward(self, params: dict, inputs: dict, init: dict, lengths=None, into: dict | None = None,
                ladder: bool = False):
        """params: name -> array; inputs: name -> [T, B, F]; init: state -> [B, F] (every earlier
        frame holds it), [D, B, F] (the D frames before this call, oldest first; D = cell.depths[s])
        or None (zeros). Returns (outputs: name -> [T, B, F], finals: state -> its last D frames,
        [B, F] where D is 1 and [D, B, F] otherwise), views that the next call overwrites; finals end
        at each sequence's own last frame when lengths [B] is given. Parameters are used in place, not
        copied. T longer than the executor's chunk runs in chunks of that many frames (chunks.py); where
        the values of a call would not fit in store_limit (or recompute=True), in chunks that the
        backward runs again instead of storing their values (the inputs are then referenced until it).
        into: output name -> [T, B, F], where a call in chunks writes that output (and returns it) instead of
        a buffer of its own; a whole call returns its workspace's views, for the caller to copy. ladder: calls
        come in many lengths: run any T in chunks from the ladder (chunk_plan.spans), so that nothing new is
        recorded once each step of it is."""
        x0 = inputs[next(iter(self.cell.inputs))]
        (T, B), K = x0.shape[:2], self.chunk_frames
        limit, (fixed, per_frame) = store_limit(self.backend), self._store_cost(B, x0.dtype)
        recompute = self.recompute
        if recompute is None:
            recompute = fixed + T * per_frame > limit
        if recompute and not K:      # a chunk's values within a quarter of the limit
            K = max(1, limit // (4 * per_frame))
        elif K and self.chunk is None and self.backend.chunk_frames is None:
            K = min(K, within(limit - fixed, per_frame))      # the strategy's K: a chunk within the limit
        if ladder and not K:
            K = LADDER_TOP
        self.chunked = bool(K) and (T > K or ladder)
        self.recomputed = self.chunked and recompute
        if self.chunked:
            self.chunks = self.chunks or Chunked(self)
            return self.chunks.forward(params, inputs, init, lengths, K, ladder, ladder and self._walks(B, x0.dtype),
                                       self.recomputed, into)
        return self._forward(params, inputs, init, lengths)

    def backward(self, grad_outputs: dict, grad_finals: dict | None = None, into: dict | None = None):
        """grad_outputs: name -> [T, B, F] (or None); grad_finals: state -> [B, F] (the last frame),
        [D, B, F] (shaped like finals) or None. Returns (grad_inputs: name -> [T, B, F], grad_init:
        state -> [B, F] or [D, B, F] like finals, grad_params: name -> array), views that the next
        call overwrites; into (input name -> [T, B, F]) as forward's, for the input gradients."""
        if self.ws is None:
            raise RnnGraphError("backward() called before forward()")
        if self.chunked:
            return self.chunks.backward(grad_outputs, grad_finals, into)
        return self._backward(grad_outputs, grad_finals)

    def _forward(self, params: dict, inputs: dict, init: dict, lengths=None):
        """forward() in one workspace: outputs and finals are views into it."""
        cell, xp = self.cell, self.backend.xp
        x0 = inputs[next(iter(cell.inputs))]
        ws = self.ws = self.workspace(x0.shape[0], x0.shape[1], x0.dtype)
        be = self.backend
        for n, x in inputs.items():         # first: the device starts on the copies while the host goes on
            be.copy(ws.framed(n), xp.asarray(x))
        ws.bind_params({n: params[n] for n in cell.params})
        if HISTORY not in ws.memo:
            ws.memo[HISTORY] = {s: ws.vals[p][:ws.P] for s, (p, _) in cell.states.items()}
        for s, h in ws.memo[HISTORY].items():
            write_history(be, h, init.get(s))
        self.lengths = lengths
        self._run_body("fwd", ws, self._forward_body)
        outputs = {o: ws.framed(o) for o in cell.outputs}
        if lengths is not None:
            return outputs, self._finals()
        if FINALS not in ws.memo:       # the same rows every call: views made once
            ws.memo[FINALS] = self._finals()
        return outputs, dict(ws.memo[FINALS])

    def _finals(self) -> dict:
        """state -> its last frames' rows (_last_rows) in the last forward's workspace."""
        return {s: self.ws.vals[p][self._last_rows(self.cell.depths[s])] for s, (p, _) in self.cell.states.items()}

    def _backward(self, grad_outputs: dict, grad_finals: dict | None = None):
        """backward() of the last _forward, in its workspace: the results are views into it."""
        cell, ws = self.cell, self.ws
        given = {o: g for o, g in (grad_outputs or {}).items() if g is not None}
        ws.zero_grads(self.backend, frozenset(given))      # but the frames the copies below fill
        for o, g in given.items():      # the rest of the arena is zero: a copy is the sum
            self.backend.copy(ws.framed(o, grads=True), g)
        for s, g in (grad_finals or {}).items():
            if g is not None:       # [B, F]: the last frame's; [D, B, F]: each of the last D frames'
                ws.grads[cell.states[s][0]][self._last_rows(cell.depths[s] if g.ndim == 3 else 1)] += g
        self._run_body("bwd", ws, lambda ws, run_loop: self._run_sections(self.backward_sections, ws, run_loop))
        if GRAD_INIT not in ws.memo:        # the rows before frame 0: views made once
            ws.memo[GRAD_INIT] = {s: ws.grads[p][ws.P - 1] if cell.depths[s] == 1 else
                                  ws.grads[p][ws.P - cell.depths[s]:ws.P] for s, (p, _) in cell.states.items()}
        ws.note_untouched(self.sched, self.backend)
        return ({n: ws.framed(n, grads=True) for n in cell.inputs}, dict(ws.memo[GRAD_INIT]),
                {n: ws.grads[n] for n in cell.params})

    def _run_body(self, kind: str, ws, body):
        """Runs body(ws, run_loop) through the backend: the whole body recorded once and replayed, or,
        where it cannot be, only its per-frame sections (run_loop(name, fn), each its own recording);
        eager backends just run it."""
        key, be = (kind, self.serial, ws.serial, ws.version), self.backend
        if self.whole_capture:
            be.record(key, lambda: body(ws, _call))
        else:
            body(ws, lambda name, fn: be.record(key + (name,), fn))

    def _forward_body(self, ws, run_loop):
        """Everything after the inputs are staged: packing the merged weights, then the forward plan."""
        for it, (w, _) in ws.wcat.items():     # a head-wise weight [k, F/k, K/k] packs as its rows [F, K/k]
            self.backend.pack(w, [rows(ws.vals[p]) for p in it.weights], transpose=it in self._loop_gemms)
        self._run_sections(self.sched.forward, ws, run_loop)

    def _run_sections(self, sections, ws, run_loop):
        for sec in sections:
            if sec.per_frame:
                run_loop(sec.name, lambda sec=sec: self._run(sec.items, ws, ALL))
            else:
                self._run(sec.items, ws, ALL)

    def _run(self, items, ws, t):
        for it in items:
            HANDLERS[type(it)](self, it, ws, t)

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

    # -- plan items: each kind's handler (handlers.py), the loop's here ---------------------------
    def _prepared(self, it, ws, t, views, compile: bool = True):
        """(views, launchable or None) of an item at frame t (or ALL), built once: the buffers are static. A
        head-wise item is offered to compile only where the backend says it compiles those (compiles_heads)."""
        key = (it, t)
        if key not in ws.memo:
            v = views()
            compile = compile and (self.backend.compiles_heads or not head_wise(it))
            ws.memo[key] = (v, self.backend.compile(self.cell, it, v, t is not ALL) if compile else None)
        return ws.memo[key]

    def _loop(self, loop, ws, _):
        """A loop item, by its strategy's record: the backend's kernels for it where it compiles them on the
        strategy's views, else the strategy's reference. The forward of the schedule's own strategy says
        what ran (loop_runs) and, where the reference is another strategy, why (loop_note); a compiled backward
        loop notes the parameters whose gradients its kernels sum (backend.loop_sums), whose ParamSums then skip."""
        strategy = strategy_of(loop)
        if (loop, "auto") not in ws.memo:       # 'auto' may run the reference where the kernel measured slower
            ws.memo[loop, "auto"] = self.loop_asked == "auto" and \
                self.backend.auto_problem(self.cell, loop, ws.B, ws.dtype)
        views, launch = self._prepared(loop, ws, ALL, lambda: strategy.views(ws, loop), not ws.memo[loop, "auto"])
        if not loop.reverse and strategy.name == self.sched.loop_strategy and strategy.runs_as:
            if (loop, "why") not in ws.memo:
                ws.memo[loop, "why"] = None if launch else \
                    ws.memo[loop, "auto"] or self.backend.loop_problem(self.cell, loop, ws.B, ws.dtype)
            self.loop_runs, self.loop_note = strategy.name if launch else strategy.runs_as, ws.memo[loop, "why"]
        if loop.reverse and (loop, "sums") not in ws.memo:     # the parameter gradients its kernel sums itself
            ws.memo[loop, "sums"] = self.backend.loop_sums(self.cell, loop, ws.B, ws.dtype) if launch else frozenset()
            ws.memo[LOOP_SUMS] = ws.memo.get(LOOP_SUMS, frozenset()) | ws.memo[loop, "sums"]
        if launch:
            self.backend.launch(launch)
        else:
            strategy.reference(self, loop, ws, views)

    def walk(self, loop, ws, overlap: bool):
        """Every frame (in reverse time for a backward loop), the loop's stages in order; a stage's items
        overlapped where `overlap` and the stage allow."""
        for t in (reversed(range(ws.T)) if loop.reverse else range(ws.T)):
            for st in loop.stages:
                if overlap and st.overlap:
                    self.backend.overlap([lambda it=it: HANDLERS[type(it)](self, it, ws, t) for it in st.items])
                else:
                    self._run(st.items, ws, t)


def joined(sections) -> tuple:
    """The backward plan's sections as the executor runs them: a product's operand gradient (GemmGrad) and, right
    after it, its weight gradient over all frames (WeightGrad) run as one step, the GemmGrad with params, so that
    the backend may share work between the two (gemm_grads_frames: x3 splits their output gradient once)."""
    out = []
    for sec in sections:
        items = []
        for it in sec.items:
            if isinstance(it, WeightGrad) and not sec.per_frame and items and items[-1] == GemmGrad(it.item):
                items[-1] = GemmGrad(it.item, params=True)
            else:
                items.append(it)
        out.append(replace(sec, items=tuple(items)))
    return tuple(out)


HANDLERS = {Gemm: handlers.gemm, Fused: handlers.fused, Pair: handlers.pair, GemmGrad: handlers.gemm_grad,
            FusedGrad: handlers.fused_grad, WeightGrad: handlers.weight_grad, ParamSum: handlers.param_sum,
            SharedWeight: handlers.shared, **{s.item: Executor._loop for s in STRATEGIES.values()}}


def _call(name, fn):
    fn()
