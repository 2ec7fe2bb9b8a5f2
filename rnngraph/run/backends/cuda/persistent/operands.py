"""A persistent kernel's GEMM operands in the generated source: where a phase's weight elements and x lie in
memory (full matrices, or head-wise as heads.py packs them), the copy of a block's weight rows into shared memory
before frame 0, and the GEMV of full matrices on CUDA cores (x staged, from its tagged words where it travels in
them, then gemv.row_sums); kernels.py assembles them into phases."""
from __future__ import annotations

from .elements import ld_arg
from .gemv import row_sums
from .heads import head_gemv, head_weight
from .phases import block_units

GEMV = r"""
        for (int e = tid; e < NB * {K}; e += NT) {{
            const int b = e / {K}, k = e - b * {K};
            {stage}
        }}
        __syncthreads();"""


def phase_head_gemv(p, woff: int, arg, xw: int, apart: bool) -> str:
    """A head-wise phase's GEMV (heads.py) on its x."""
    x = head_x(p, arg)
    return head_gemv(p, woff, x, ld_arg(x), xw, apart)


def head_w(p, arg) -> str:
    """Element (q, k) of head-wise phase p's packed weights in memory (heads.head_weight)."""
    return head_weight(p, arg("w", p.item.gemm if p.kind == "pair" else p.item))


def head_x(p, arg) -> str:
    """The x of head-wise phase p: the operand's values, or a dgemm's output gradient."""
    it = p.item.gemm if p.kind == "pair" else p.item
    return arg("dcat", p.item) if p.kind == "dgemm" else arg("val", it.operand)


def operand(p, arg) -> tuple:
    """(the global element of full-matrix phase p's weight row q (j, u: its merged block and unit) at column k,
    the argument of its x, x's lag)."""
    it = p.item.gemm if p.kind == "pair" else p.item
    w, K = arg("w", it), p.width
    if p.kind == "dgemm":           # W [M, K_op]: the block's columns, each a row of M here
        return f"{w}[(long long)k * {p.units} + u0 + q]", arg("dcat", p.item), 0
    src = f"{w}[(long long)({p.units} * j + u0 + u) * {K} + k]" if p.kind == "pair" else \
        f"{w}[(long long)(u0 + q) * {K} + k]"      # W [M, K]: row (j·F + u0 + u) for a pair, (u0 + q) for a gemm
    return src, arg("val", it.operand), it.delay


def load_weights(p, off: int, arg, stride: int | None = None) -> str:
    """Copies the block's weight rows of phase p into shared memory (row q = j·nu + u: block j's unit u), `stride`
    elements apart (None: the width, packed)."""
    K = p.width
    if p.heads > 1:                 # head-wise: rows of one head's width (heads.py)
        src = head_w(p, arg)
    else:
        src = operand(p, arg)[0]
    return (f"    {{   {block_units(p.units)}\n"
            f"        for (int e = tid; e < nu * {p.m * K}; e += NT) {{\n"
            f"            const int q = e / {K}, k = e - q * {K}, j = q / nu, u = q - j * nu;\n"
            f"            (void)j; (void)u;\n"
            f"            sw[{off} + {'e' if stride in (None, K) else f'q * {stride} + k'}] = {src};\n        }}\n    }}")


def full_gemv(p, off: int, arg, xb) -> str:
    """p's GEMV: x staged (from its tagged words where xb names their buffer), the block's rows summed."""
    if p.kind == "dgemm":
        x, lag = arg("dcat", p.item), 0
    else:
        it = p.item.gemm if p.kind == "pair" else p.item
        x, lag = arg("val", it.operand), it.delay
    stage = f"xs[e] = AT({x}, {ld_arg(x)}, {lag}, k);"
    if xb:
        stage = (f"xs[e] = t - {lag} < 0 ? AT({x}, {ld_arg(x)}, {lag}, k) : "
                 f"exchanged({xb} + (((t - {lag}) & 1) * NB + b) * {p.width} + k, tags + t - {lag});")
    return GEMV.format(K=p.width, stage=stage) + row_sums(p.m, off, p.width, p.width)
