"""What every backend shares, written once against its array module `xp`.

Half precision (bfloat16, float16 storage): every function here computes in float32 and rounds each
value when it is stored, as a GPU kernel that loads half values, works in float32 registers and
stores half values would: a fused group's members read one another unrounded; a GEMM or a reduction
accumulates in float32 (out += rounds once); gradients added into stored buffers round at each add."""
from __future__ import annotations

import functools

from ...arrays import is_half
from ...ir.ops import ALL, FORWARD, VJP, OpKind, accumulate


class ArrayBackend:
    """The backend contract, generic over the array module `xp`: a GEMM with accumulate, compiling a
    plan item into something launchable (or not: the executor then runs the reference below),
    recording/replaying, overlapping independent items and synchronising. Backends override what they
    run faster; capture is an option chosen once, by get_backend."""
    name = "base"
    xp = None
    records = None      # what the backend records as CUDA graphs: None, "all" (whole bodies) or "loops"
    loops = frozenset({"stages"})   # the loop strategies it runs
    chunk_frames = 0    # executors run longer calls in chunks of this many frames (run/chunks.py); 0: never

    @property
    def auto_loops(self) -> frozenset:
        """The loop strategies 'auto' may pick: those it runs, unless a backend runs one no faster."""
        return self.loops

    # -- array conveniences (layers, workspaces) ----------------------------------------------------
    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def to_numpy(self, a):
        return a

    def copy(self, dst, src):
        """dst[...] = src (dst a view of a workspace or result buffer); a backend may do it faster."""
        dst[...] = src

    # -- what the executor calls ---------------------------------------------------------------------
    def pack(self, out, parts, transpose: bool = False):
        """out [ΣF, K] = the matrices parts[k] [F_k, K] stacked along rows (plain copies: capturable).
        transpose: the backend may also keep outᵀ for per-frame kernels that read W by columns."""
        off = 0
        for p in parts:
            out[off:off + p.shape[0]] = p
            off += p.shape[0]

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

    def compile(self, cell, item, views, per_frame: bool):
        """A launchable running plan item `item` on `views` (the arrays the executor hands it) as
        kernels, or None (here: always), meaning the executor runs the reference functions below."""
        return None

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

    def persistent_problem(self, cell, loop, B: int, dtype) -> str | None:
        """Why a persistent loop (plan.items.PersistentLoop) runs frame by frame here, or None."""
        return f"the {self.name} backend runs it frame by frame (a persistent kernel needs the GPU)"

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


def run_param_grad(xp, cell, n, slot, g, ins, y, out):
    """out [F] += node n's backward rule for its vector-parameter operand `slot`, summed over rows;
    g, y: [N, F]; ins: its operands (rows, or the parameter itself)."""
    op = cell.op(n)
    g, ins, y = (_up(xp, a) for a in (g, ins, y)) if is_half(out) else (g, ins, y)
    VJP[op.kind][slot](xp, lambda v, cols=ALL: accumulate(out[cols], v), g, *ins, y, op.attrs)


def run_fused_forward(xp, cell, it, env):
    """A fused group on any array module: its ops in order, through the forward rule table."""
    if is_half(env[it.nodes[0]]):
        env32 = _up(xp, env)
        env32.update({(n, 0): env32[n] for n in it.nodes})        # members read one another unrounded
        run_fused_forward(xp, cell, it, env32)
        for n in it.nodes:
            env[n][...] = env32[n]
        return
    for n in it.nodes:
        op = cell.op(n)
        FORWARD[op.kind](xp, env[n], *[env[r] for r in cell.reads(n)], op.attrs)


def run_fused_backward(xp, cell, it, env, genv, add, params: bool):
    """A fused group's vector-Jacobian products, in reverse order, through the backward rule table;
    each rule hands its operand's gradient to add(u, d, v, cols)."""
    if is_half(genv[it.nodes[0]]):      # members' gradients summed unrounded, stored once at the end
        g32 = _up(xp, genv)

        def add32(u, d, v, cols=ALL):
            if d == 0 and u in g32:
                g32[u][..., cols] += v
            else:
                add(u, d, v, cols)
        run_fused_backward(xp, cell, it, _up(xp, env), g32, add32, params)
        for n in it.nodes:
            genv[n][...] = g32[n]
        return
    for n in reversed(it.nodes):
        op, reads = cell.op(n), cell.reads(n)
        ins = [env[r] for r in reads]
        for slot, (u, d) in enumerate(reads):
            if cell.op(u).kind is OpKind.PARAM and not params:
                continue
            VJP[op.kind][slot](xp, functools.partial(add, u, d), genv[n], *ins, env[n], op.attrs)


def _up(xp, a):
    """float32 copies of an array, or of a dict's or a list's arrays (None stays None)."""
    if isinstance(a, dict):
        return {k: _up(xp, v) for k, v in a.items()}
    if isinstance(a, (list, tuple)):
        return [_up(xp, v) for v in a]
    return None if a is None else a.astype(xp.float32)


def _in_float32(xp, fn, args: list, written: tuple):
    """fn(xp, *args) on float32 copies of args, then the copies of the args at positions `written`
    stored back (rounded once)."""
    ups = _up(xp, args)
    fn(xp, *ups)
    for k in written:
        args[k][...] = ups[k]


def scan_forward(xp, a, b, s, m):
    """s [d+T, B, F]: its first d rows the frames before the call, its last T rows written with
    s_t = a_t ⊙ s_{t-d} + b_t by d interleaved log-depth scans; m [T, B, F] = a_t ⊙ s_{t-d} is written
    too; a, b: [T, B, F], or a vector [F]."""
    if is_half(s):
        return _in_float32(xp, scan_forward, [a, b, s, m], (2, 3))
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
        return _in_float32(xp, scan_backward, args, tuple(k for k in range(2, 6) if args[k] is not None))
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
