"""What every backend shares, written once against its array module `xp`."""
from __future__ import annotations

from ..executor import run_fused_backward, run_fused_forward


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

    def pack(self, out, parts):
        """out [ΣF, K] = the matrices parts[k] [F_k, K] stacked along rows."""
        self.xp.concatenate(parts, axis=0, out=out)

    def gemm(self, x, w, out):
        """out [N, M] = x [N, K] · w [M, K]ᵀ."""
        self.xp.matmul(x, w.T, out=out)

    def gemm_nn(self, g, w, out):
        """out [N, K] += g [N, M] · w [M, K]."""
        out += g @ w

    def gemm_tn(self, g, x, out):
        """out [M, K] += g [N, M]ᵀ · x [N, K]."""
        out += g.T @ x

    def fused_forward(self, cell, item, env):
        run_fused_forward(self.xp, cell, item, env)

    def fused_backward(self, cell, item, env, genv, add, params, targets=None):
        """Gradients of a fused group: into genv (its own nodes) and, through add(u, d, v, cols),
        into what it reads; `targets` ((u, d) -> gradient view) lets a backend write them directly."""
        run_fused_backward(self.xp, cell, item, env, genv, add, params)

    def loop(self, key, fn):
        """Runs one time loop; a capturing backend may record it once and replay it."""
        fn()

    def synchronize(self):
        pass

    def to_numpy(self, a):
        return a
