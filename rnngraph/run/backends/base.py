"""What every backend shares, written once against its array module `xp`."""
from __future__ import annotations

import functools

from ...ir.ops import ALL, FORWARD, VJP, OpKind, accumulate


class ArrayBackend:
    """The backend interface with array-module-generic implementations; backends override the hot paths."""
    name = "base"
    xp = None

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def copy(self, dst, src):
        dst[...] = self.xp.asarray(src)

    def pack(self, out, parts, transpose: bool = False):
        """out [ΣF, K] = the matrices parts[k] [F_k, K] stacked along rows (plain copies: capturable).
        transpose: the backend may also keep outᵀ for per-frame kernels that read W by columns."""
        off = 0
        for p in parts:
            out[off:off + p.shape[0]] = p
            off += p.shape[0]

    def gemm(self, x, w, out):
        """out [N, M] = x [N, K] · w [M, K]ᵀ."""
        self.xp.matmul(x, w.T, out=out)

    def gemm_nn(self, g, w, out):
        """out [N, K] += g [N, M] · w [M, K]."""
        out += g @ w

    def gemm_tn(self, g, x, out):
        """out [M, K] += g [N, M]ᵀ · x [N, K]."""
        out += g.T @ x

    def prepare_forward(self, cell, item, env):
        """Whatever a backend wants to build once per (fused group, frame) and reuse; None here."""
        return None

    def prepare_backward(self, cell, item, env, genv, targets):
        """Likewise for the backward; targets: (u, d) -> the gradient view a read's gradient adds into."""
        return None

    def prepare_pair(self, cell, gemm, fused, gemm_args, env):
        """One kernel for a frame's merged GEMM and the fused group reading it, or None (here: never)."""
        return None

    def fused_forward(self, cell, item, env, prepared=None):
        run_fused_forward(self.xp, cell, item, env)

    def fused_backward(self, cell, item, env, genv, add, params):
        """Gradients of a fused group: into genv (its own nodes) and, through add(u, d, v, cols),
        into what it reads (parameters too when params=True)."""
        run_fused_backward(self.xp, cell, item, env, genv, add, params)

    def launch(self, prepared):
        """Runs a kernel prepared by one of the prepare_* methods."""
        raise NotImplementedError("this backend prepares no kernels")

    def param_grad(self, cell, n, slot, g, ins, y, out):
        """out [F] += node n's backward rule for its vector-parameter operand `slot`, summed over
        rows; g, y: [N, F]; ins: its operands (rows, or the parameter itself)."""
        op = cell.op(n)
        VJP[op.kind][slot](self.xp, lambda v, cols=ALL: accumulate(out[cols], v), g, *ins, y, op.attrs)

    def run_stage(self, fns):
        """Runs the independent items of one stage (callables); a backend may overlap them."""
        for fn in fns:
            fn()

    capture_scope = None   # what a capturing backend records: "all" (whole bodies) or "loops"

    def loop(self, key, fn):
        """Runs fn (a time loop or a whole body); a capturing backend records it once and replays it."""
        fn()

    def synchronize(self):
        pass

    def to_numpy(self, a):
        return a


def run_fused_forward(xp, cell, it, env):
    """A fused group on any array module: its ops in order, through the forward rule table."""
    for n in it.nodes:
        op = cell.op(n)
        FORWARD[op.kind](xp, env[n], *[env[r] for r in cell.reads(n)], op.attrs)


def run_fused_backward(xp, cell, it, env, genv, add, params: bool):
    """A fused group's vector-Jacobian products, in reverse order, through the backward rule table;
    each rule hands its operand's gradient to add(u, d, v, cols)."""
    for n in reversed(it.nodes):
        op, reads = cell.op(n), cell.reads(n)
        ins = [env[r] for r in reads]
        for slot, (u, d) in enumerate(reads):
            if cell.op(u).kind is OpKind.PARAM and not params:
                continue
            VJP[op.kind][slot](xp, functools.partial(add, u, d), genv[n], *ins, env[n], op.attrs)
