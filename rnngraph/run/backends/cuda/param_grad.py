"""The gradient of a vector parameter (a bias, a diagonal weight) reduced over all rows in one kernel,
without atomics: bit for bit the same every run."""
from __future__ import annotations

from ....ir.ops import KERNEL
from .source import kernel_name, math_type, op_expr

PARAM_GRAD_SOURCE = r"""
extern "C" __global__ void {name}({args}int N, int F) {{
    // gradient of a vector parameter: out[f] += sum over rows n of the op's backward expression, with no
    // atomics (bit for bit the same every run): a block of 32 features x 32 row lanes, lane y summing rows
    // y, y + 32, ... in order, then the 32 lanes' sums added in order
    __shared__ {T} part[32][33];
    int f = blockIdx.x * 32 + threadIdx.x;
    {T} acc = 0;
    for (int n = threadIdx.y; f < F && n < N; n += 32) {{
{loads}
        acc += {expr};
    }}
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && f < F) {{
        {T} total = 0;
        for (int y = 0; y < 32; ++y) total += part[y][threadIdx.x];
        out[f] = out[f] + total;
    }}
}}
"""


def param_grad_kernel(cell, n: str, slot: int, ctype: str) -> tuple[str, str]:
    """(name, CUDA source) reducing the gradient of node n's parameter operand `slot` over all rows.
    Arguments: g, each operand, y (each a pointer and a row stride; a vector parameter has stride 0)."""
    op = cell.op(n)
    names = ["G"] + [f"A{k}" for k in range(len(cell.reads(n)))] + ["Y"]
    args = "".join(f"const {ctype}* p{v}, long long ld{v}, " for v in names) + f"{ctype}* out, "
    loads = "\n".join(f"        {math_type(ctype)} {v} = p{v}[n * ld{v} + f];" for v in names)
    expr = op_expr(KERNEL[op.kind][1][slot], cell, n, names[1:-1], g="G", y="Y")
    text = PARAM_GRAD_SOURCE.format(name="{name}", args=args, T=math_type(ctype), loads=loads, expr=expr)
    name = kernel_name("pgrad", text)
    return name, text.replace("{name}", name)
