"""What every backend shares, written once against its array module `xp`.

Half precision (bfloat16, float16 storage): every function here computes in float32 and rounds each
value when it is stored, as a GPU kernel that loads half values, works in float32 registers and
stores half values would: a fused group's members read one another unrounded; a GEMM or a reduction
accumulates in float32 (out += rounds once); gradients added into stored buffers round at each add."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass

import numpy

from ...arrays import address, float32_copies, is_half
from ...errors import RnnGraphError
from ...ir.ops import ALL, FORWARD, VJP, OpKind, accumulate, split_heads
from ...plan.aliases import GradAliases
from ...plan.backward import arriving
from ...plan.items import GemmGrad
from ...plan.loops import STRATEGIES, strategy_of


@dataclass(frozen=True)
class GatherPlan:
    """A backend's way to gather `size` elements (ArrayBackend.gather_plan): their runs [(src offset, out offset,
    length)] and what the backend made of them on its device (its table), if anything."""
    size: int
    runs: list
    table: object = None


def small_ints(idx):
    """int32 where every value of idx fits, else int64."""
    return numpy.int32 if len(idx) == 0 or int(idx.max()) < 2 ** 31 else numpy.int64


class ArrayBackend:
    """The backend contract, generic over the array module `xp`: a GEMM with accumulate, compiling a
    plan item into something launchable (or not: the executor then runs the reference below),
    recording/replaying, overlapping independent items and synchronising. Backends override what they
    run faster. The mode ('naive', 'staged' or 'graph') is fixed when the backend is made (get_backend)."""
    name = "base"
    xp = None
    modes = ("naive", "staged")     # the modes it runs
    records = None      # what the backend records as CUDA graphs: None, "all" (whole bodies) or "loops"
    loops = frozenset(STRATEGIES)   # the loop strategies it runs: every one, by its reference at least
    kernel_loops = frozenset()      # those it has kernels for
    walking_loops = frozenset()     # those whose kernels walk only a chunk's n frames (Workspace.running)
    chunk_frames = 0    # executors run longer calls in chunks of this many frames (run/chunks.py); 0: never;
                        # None: as many as the loop strategy's record says
    compiles_heads = False  # whether compile() knows head-wise GEMMs (plan.items.head_wise); else the executor
                            # runs them by head_gemm and never offers them to compile

    keeps_transposes = False    # pack keeps the transpose of per-frame weights (transposed() returns it)
    alias_grads = False     # one buffer for each class of equal gradients (plan/aliases.py): every kernel it
                            # compiles then skips the hand-ons inside a class and stores a class once
    twin_sums = False   # where it does not: a vector parameter's sum equal to an earlier one's (twins) is a copy

    def __init__(self, mode: str = "staged"):
        if mode not in self.modes:
            raise RnnGraphError(f"the {self.name} backend runs mode {' or '.join(map(repr, self.modes))}, not {mode!r}")
        self.mode = mode
        self._transposed: dict = {}       # id(packed per-frame W [M, K]) -> (W, its transpose [K, M])

    @property
    def auto_loops(self) -> frozenset:
        """The loop strategies 'auto' may pick: those it has kernels for, and those whose reference is as
        good as the strategy (a persistent loop's reference is 'stages')."""
        return frozenset(s for s in self.loops if s in self.kernel_loops or STRATEGIES[s].auto_by_reference)

    # -- array conveniences (layers, workspaces) ----------------------------------------------------
    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def to_numpy(self, a):
        return a

    def gather_plan(self, idx, runs) -> GatherPlan:
        """How gather() fills out [n] with src's elements at idx [n] (host ints), given also as runs [(src offset,
        out offset, length)]: on the host a copy a run (a layer's gradients are a few long runs; numpy's take of
        every element took half of a B = 1 LSTM step's backward), one take where the runs are many."""
        many = len(runs) > 64
        return GatherPlan(len(idx), runs, self.asarray(idx.astype(small_ints(idx))) if many else None)

    def gather(self, src, plan: GatherPlan, out):
        """out [plan.size] = src [N] at the plan's elements."""
        if plan.table is not None:
            self.xp.take(src, plan.table, out=out)
            return
        for s, d, n in plan.runs:
            out[d:d + n] = src[s:s + n]

    def copy(self, dst, src):
        """dst[...] = src (dst a view of a workspace or result buffer, shaped like src or [1, ...] of it); a backend
        may do it faster."""
        dst[...] = src

    def unstored(self, sched) -> frozenset:
        """The nodes whose values this backend's forward keeps inside a fused pass, never storing them: none."""
        return frozenset()

    def untouched_grads(self, cell, steps, aliases=None, stored=frozenset(), partial=frozenset()) -> frozenset:
        """Nodes whose gradient buffers these compiled backward steps ((step, the loop it runs in or None)) never
        need zeroed: the members of fused groups outside their kernel's arguments (its spec, backward_spec: the
        plan has it store the gradients other items read, kept_grads, and read those they add to, arriving),
        those it stores whole ('=') where none arrives from outside it, the gradients one write makes whole
        (aliases.assigned: a group's '=', any GEMM's beta 0 here) and those a compiled loop writes whole
        (stored: loop_stores). A step in a loop of `partial` (one that walks only a chunk's frames) stores only
        those frames: what it stores still needs zeroing. Where gradients share a buffer, a class's members with
        it, if one of them is so stored or none is touched."""
        aliases, untouched, assigned = aliases or GradAliases(), set(), set(stored)
        for step, loop in steps:
            if isinstance(step, GemmGrad):
                assigned |= {step.item.operand} & aliases.assigned
                continue
            spec = self.backward_spec(cell, step, loop, aliases)
            if spec is None:
                continue
            touched = {key if kind == "grad" else key[0] for kind, key in spec.inputs + spec.outputs
                       if kind in ("grad", "gext")}
            untouched |= set(step.item.nodes) - touched
            if loop is not None and loop in partial:
                continue
            ops, come = {nm: op for nm, _, op in spec.stores}, arriving(cell, step.item.nodes)
            assigned |= {key if kind == "grad" else key[0] for (kind, key), nm in zip(spec.outputs, spec.out_names)
                         if ops[nm] == "=" and (kind == "gext" or key not in come)}
        near = untouched | {m for n in assigned for m in aliases.members(n)}
        return frozenset(n for n in near if any(m in assigned for m in aliases.members(n)) or
                         all(m in untouched for m in aliases.members(n)))

    def backward_spec(self, cell, step, loop, aliases):
        """The KernelSpec (run/backends/cuda/fused.py) whose reads and stores a compiled FusedGrad step's kernel
        keeps, hoisted (loop None) or inside a compiled loop; None where no kernel keeps one (the default)."""
        return None

    def zero(self, a):
        """a [n] (a contiguous arena, every gradient of a workspace) = 0; a backend may do it faster."""
        a.fill(0)

    def zero_plan(self, a, runs):
        """What zero_runs takes for the runs [(start, end, row)] of a [n]: the runs; a backend may prepare them."""
        return runs

    def zero_runs(self, a, plan, k: int = 0):
        """a[start + k·row:end] = 0 for each run of a [n] in plan (zero_plan's), each run by zero(): row 0 zeroes
        the run whole, a row's elements its rows from row k on."""
        for start, end, row in plan:
            if start + k * row < end:
                self.zero(a[start + k * row:end])

    def upload(self, dst, host):
        """dst [n] (a backend array) = host [n] (a numpy array)."""
        dst[...] = host

    # -- what the executor calls ---------------------------------------------------------------------
    def pack(self, out, parts, transpose: bool = False):
        """out [ΣF, K] = the matrices parts[k] [F_k, K] stacked along rows (plain copies: capturable).
        transpose: a backend that keeps_transposes also refreshes outᵀ [K, ΣF] (transposed), for per-frame
        kernels that read W by columns."""
        off = 0
        for p in parts:
            out[off:off + p.shape[0]] = p
            off += p.shape[0]
        if transpose and self.keeps_transposes:
            kept = self._transposed.get(id(out))
            if kept is None or kept[0] is not out:
                self._transposed[id(out)] = (out, self.xp.empty(out.shape[::-1], out.dtype))
            self.transpose_into(self._transposed[id(out)][1], out)

    def transpose_into(self, dst, src):
        """dst [K, M] = srcᵀ, src [M, K]; a backend may do it faster."""
        dst[...] = src.T

    def transposed(self, w):
        """The transpose [K, M] that pack keeps of per-frame weights w [M, K], or None."""
        kept = self._transposed.get(id(w))
        return kept[1] if kept is not None and kept[0] is w else None

    def gemm(self, a, b, out, *, ta: bool = False, tb: bool = False, accumulate: bool = False):
        """out (+)= op(a) · op(b), op transposing a (ta) or b (tb): out [N, M] = x [N, K] · w [M, K]ᵀ
        forward, out [N, K] += g [N, M] · w [M, K] and out [M, K] += g [N, M]ᵀ · x [N, K] backward."""
        a, b = (a.T if ta else a), (b.T if tb else b)
        if is_half(out):                    # float32 products and sums, rounded once when stored
            f32 = self.xp.float32
            out[...] = a.astype(f32) @ b.astype(f32) + (out.astype(f32) if accumulate else 0)
        elif accumulate:
            out += a @ b
        else:
            self.xp.matmul(a, b, out=out)

    def gemm_frames(self, a, b, out, *, ta: bool = False, tb: bool = False, accumulate: bool = False):
        """gemm over all T·B rows of a call (a hoisted product or a weight gradient): never run beside another
        product (in lanes), so a backend may give it buffers of its own; the same as gemm here."""
        self.gemm(a, b, out, ta=ta, tb=tb, accumulate=accumulate)

    def gemm_grads_frames(self, g, w, x, gx, gw, *, accumulate: bool = False):
        """Both gradients of a product over all frames, out [N, M] = x [N, K] · w [M, K]ᵀ, from g [N, M]: gx [N, K]
        (+)= g · w and gw [M, K] += gᵀ · x (gemm_frames'); a backend may share work between the two."""
        self.gemm_frames(g, w, gx, accumulate=accumulate)
        self.gemm_frames(g, x, gw, ta=True, accumulate=True)

    def head_gemm(self, a, b, out, *, ta: bool = False, tb: bool = False, accumulate: bool = False):
        """gemm batched over heads: out[h] (+)= op(a[h]) · op(b[h]) for each head h of the leading axis, views
        [k, ...] of rows split into heads (head_parts): out [k, N, o] = x [k, N, i] · w [k, o, i]ᵀ forward,
        out [k, N, i] += g [k, N, o] · w [k, o, i] and out [k, o, i] += g [k, N, o]ᵀ · x [k, N, i] backward."""
        xp = self.xp
        a, b = (a.transpose(0, 2, 1) if ta else a), (b.transpose(0, 2, 1) if tb else b)
        if is_half(out):                    # float32 products and sums, rounded once when stored
            f32 = xp.float32
            out[...] = xp.matmul(a.astype(f32), b.astype(f32)) + (out.astype(f32) if accumulate else 0)
        elif accumulate:
            out += xp.matmul(a, b)
        else:
            xp.matmul(a, b, out=out)

    COMPILE: dict = {}      # plan item kind -> the backend's method compiling it (cell, item, views, per_frame)
    RUNNERS: dict = {}      # loop item kind -> the backend room's module for its strategy (strategy_runners)

    def compile(self, cell, item, views, per_frame: bool):
        """A launchable running plan item `item` on `views` (the arrays the executor hands it) as kernels
        (COMPILE, by its kind; a loop item: its strategy's runner), or None, meaning the executor runs the
        reference functions below (or the strategy's)."""
        make = self.COMPILE.get(type(item))
        if make is not None:
            return make(self, cell, item, views, per_frame)
        runner = self.RUNNERS.get(type(item))
        return None if runner is None else runner.compile(self, cell, item, views)

    def compile_chunk(self, op: str, cursor, args):
        """A launchable running chunk boundary operation `op` (run/chunks.py OPS) on args, reading the call's
        cursor on the device, or None: the executor runs its reference."""
        return None

    def product_parts(self, g, w, cell, reader, node, parts=None):
        """(launchable, parts [S, B, K]) running a per-frame d-operand product g [B, M] · w [M, K] as S float32
        parts over slices of M, which the executor hands to the product's reader at the next frame (FusedGrad step
        `reader`, the group holding the operand `node`) to add in order (cuda/split.py), or None: the product adds
        itself into its output. parts: the buffer an earlier frame's product made, to write into again."""
        return None

    def add_parts(self, out, parts):
        """out [B, K] += parts [S, B, K], in order, rounded once: for a reader compiled without them."""
        total = out.astype(parts.dtype)
        for p in parts:
            total += p
        out[...] = total

    def launch(self, launchable):
        """Runs what compile returned: (kernel, grid, block, arguments) launches, in order."""
        for kernel, grid, block, args in launchable:
            kernel(grid, block, args)

    def overlap(self, fns):
        """Runs independent callables (the items of one stage); a backend may overlap them."""
        for fn in fns:
            fn()

    def half_problem(self, dtype) -> str | None:
        """Why this backend cannot store arrays in half-precision `dtype`, or None (numpy: ml_dtypes)."""
        return None

    def loop_problem(self, cell, loop, B: int, dtype) -> str | None:
        """Why a loop item whose strategy's reference is another strategy (runs_as) runs as that here, or None:
        its runner's why_not where it has one."""
        runner = self.RUNNERS.get(type(loop))
        if runner is None:
            s = strategy_of(loop)
            return f"the {self.name} backend has no kernel for loop strategy '{s.name}' and runs it as {s.runs_as}"
        return getattr(runner, "why_not", lambda *args: None)(self, cell, loop, B, dtype)

    def auto_problem(self, cell, loop, B: int, dtype) -> str | None:
        """Why 'auto' runs a loop item by its strategy's reference although this backend's kernel would run
        (the kernel measured slower there; its runner's auto_problem), or None."""
        runner = self.RUNNERS.get(type(loop))
        return getattr(runner, "auto_problem", lambda *args: None)(self, cell, loop, B, dtype)

    def loop_sums(self, cell, loop, B: int, dtype) -> frozenset:
        """The (fused group, parameter) pairs whose gradient sums the compiled backward `loop` takes itself (its
        runner's loop_sums), at B rows of dtype: those ParamSums are not run. None where its runner takes none."""
        runner = self.RUNNERS.get(type(loop))
        return getattr(runner, "loop_sums", lambda *args: frozenset())(self, cell, loop, B, dtype)

    def loop_stores(self, cell, loop) -> frozenset:
        """The nodes whose gradients the compiled backward `loop` writes whole (its runner's loop_stores): no other
        item adds to them first, so their buffers need no zeroing. None where its runner says none."""
        runner = self.RUNNERS.get(type(loop))
        return getattr(runner, "loop_stores", lambda *args: frozenset())(cell, loop)

    def batch_rows(self, cell, loop, B: int, dtype) -> int:
        """The rows a call of B sequences runs faster as, the added sequences of length 0 (rnngraph.nn pads them):
        its runner's batch_rows where it has one, else B."""
        runner = self.RUNNERS.get(type(loop))
        return getattr(runner, "batch_rows", lambda *args: B)(self, cell, loop, B, dtype)

    def forget(self, serials: set):
        """Drops what was recorded for the workspaces with these serials (they are gone); nothing here."""

    def cache_info(self) -> dict:
        """What the backend keeps between calls: recorded graphs and their bytes (none here)."""
        return {"graphs": 0, "graph_bytes": 0}

    def record(self, key, fn):
        """Runs fn (a time loop or a whole body); a backend that records does so once per key and replays."""
        fn()

    def synchronize(self):
        pass

    @functools.cached_property
    def memory_bytes(self) -> int:
        """The memory of the device the arrays live on: the machine's RAM here."""
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")



def strategy_runners(package: str) -> dict:
    """loop item kind -> the module of a backend's room (`package`) named as the strategy (plan/loops), where
    there is one: compile(backend, cell, loop, views) -> launches or None, and optionally why_not and
    auto_problem(backend, cell, loop, B, dtype) -> why its kernel does not (or should not) run, or None,
    unstored(cell, loop) -> the nodes whose values its kernels never store, loop_sums(backend, cell, loop, B, dtype) ->
    the (fused group, parameter) pairs whose gradient sums its backward kernel takes itself, and loop_stores(cell,
    loop) -> the nodes whose gradients its backward kernels write whole."""
    return {s.item: importlib.import_module(f"{package}.{s.name}") for s in STRATEGIES.values()
            if importlib.util.find_spec(f"{package}.{s.name}")}


def run_param_grad(xp, cell, n, slot, g, ins, y, out):
    """out [F] += node n's backward rule for its vector-parameter operand `slot`, summed over rows;
    g, y: [N, F]; ins: its operands (rows, or the parameter itself)."""
    op = cell.op(n)
    g, ins, y = (float32_copies(xp, a) for a in (g, ins, y)) if is_half(out) else (g, ins, y)
    VJP[op.kind][slot](xp, lambda v, cols=ALL: accumulate(out[cols], v), g, *ins, y, op.attrs)


def run_fused_forward(xp, cell, it, env):
    """A fused group on any array module: its ops in order, through the forward rule table."""
    if is_half(env[it.nodes[0]]):
        env32 = float32_copies(xp, env)
        env32.update({(n, 0): env32[n] for n in it.nodes})        # members read one another unrounded
        run_fused_forward(xp, cell, it, env32)
        for n in it.nodes:
            env[n][...] = env32[n]
        return
    for n in it.nodes:
        op = cell.op(n)
        FORWARD[op.kind](xp, env[n], *[env[r] for r in cell.reads(n)], op.attrs)


def run_fused_backward(xp, cell, it, env, genv, add, params: bool, skips=frozenset()):
    """A fused group's vector-Jacobian products, in reverse order, through the backward rule table;
    each rule hands its operand's gradient to add(u, d, v, cols), but for the (node, slot) hand-ons `skips` names
    (the operand's gradient is the node's own buffer: plan/aliases.py)."""
    if is_half(genv[it.nodes[0]]):      # members' gradients summed unrounded, stored once at the end
        g32, made = {}, {}
        for n, g in genv.items():       # one copy a buffer: members of one gradient class share theirs
            key = (address(g), g.shape)
            g32[n] = made[key] = made[key] if key in made else float32_copies(xp, g)

        def add32(u, d, v, cols=ALL):
            if d == 0 and u in g32:
                g32[u][..., cols] += v
            else:
                add(u, d, v, cols)
        run_fused_backward(xp, cell, it, float32_copies(xp, env), g32, add32, params, skips)
        for n in it.nodes:
            genv[n][...] = g32[n]
        return
    for n in reversed(it.nodes):
        op, reads = cell.op(n), cell.reads(n)
        ins = [env[r] for r in reads]
        for slot, (u, d) in enumerate(reads):
            if cell.op(u).kind is OpKind.PARAM and not params or (n, slot) in skips:
                continue
            VJP[op.kind][slot](xp, functools.partial(add, u, d), genv[n], *ins, env[n], op.attrs)


def head_parts(it, merged, packed, operand) -> list:
    """Per linear op j of a head-wise Gemm `it` (k heads): (merged [N, ΣF] cut to j's columns as heads [k, N, F_j/k],
    packed [ΣF, K/k] cut to j's rows as its weights [k, F_j/k, K/k], operand [N, K] as heads [k, N, K/k]), views:
    the merged output or its gradient, the packed weights or their gradient, the operand or its gradient."""
    k, out, off = it.heads, [], 0
    for f in it.sizes:
        out.append((split_heads(merged[:, off:off + f], k), packed[off:off + f].reshape(k, f // k, -1),
                    split_heads(operand, k)))
        off += f
    return out
