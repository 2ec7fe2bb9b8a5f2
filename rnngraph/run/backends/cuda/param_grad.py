"""The gradient of a vector parameter (a bias, a diagonal weight) reduced over all rows, in one kernel where the rows
are few, else in chunks over more blocks and a second kernel adding the chunks in order; without atomics: bit for bit
the same every run."""
from __future__ import annotations

from ....ir.ops import KERNEL
from .source import CTYPES, kernel_name, math_type, op_expr

PARAM_GRAD_SOURCE = r"""
extern "C" __global__ void {name}({args}int N, int F, int L, {T}* part) {{
    // gradient of a vector parameter: the sum over rows n of the op's backward expression, with no atomics (bit
    // for bit the same every run): a block of 32 features x {Y} row lanes over rows [c·L, c·L + L) (c = blockIdx.y),
    // lane y summing rows y, y + {Y}, ... of them in order, then the {Y} lanes' sums added in order; into out[f] +=
    // where the rows are one chunk (part null), else into part[c, f] (SUM_SOURCE adds the chunks in order)
    __shared__ {T} lanes[{Y}][33];
    int f = blockIdx.x * 32 + threadIdx.x, n1 = min(N, (blockIdx.y + 1) * L);
    {T} acc = 0;
    for (int n0 = blockIdx.y * L + threadIdx.y; f < F && n0 < n1; n0 += {Y} * {U}) {{
        // {U} rows' terms loaded at once (their loads in flight together), then added in row order
        {T} term[{U}];
        #pragma unroll
        for (int u = 0; u < {U}; ++u) {{
            const int n = n0 + {Y} * u;
            if (n < n1) {{
{loads}
                term[u] = {expr};
            }}
        }}
        #pragma unroll
        for (int u = 0; u < {U}; ++u)
            if (n0 + {Y} * u < n1) acc += term[u];
    }}
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && f < F) {{
        {T} total = 0;
        for (int y = 0; y < {Y}; ++y) total += lanes[y][threadIdx.x];
        if (part) part[(long long)blockIdx.y * F + f] = total;
        else out[f] = out[f] + total;
    }}
}}
"""

SUM_SOURCE = r"""
extern "C" __global__ void rg_pgrad_sum_{S}(const {T}* part, int R, int F, {S}* out) {{
    // out[f] += the chunks' sums part[0, f] + part[1, f] + ... in order
    int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= F) return;
    {T} total = 0;
    for (int r = 0; r < R; ++r) total += part[(long long)r * F + f];
    out[f] = out[f] + total;
}}
"""

LANES = 16              # row lanes a block (of 32 features each), and the rows each loads at once: measured on an
IN_FLIGHT = 8           # H200 (a bias of an LSTM's gate gradients, 20 sums replayed in a CUDA graph, µs a sum with
                        # its chunks' sum, 32 lanes x 1 row / 16 x 8): bfloat16 N = 6400 F = 1024 8.9 / 9.0, N = 16384
                        # F = 768 14.6 / 13.7; float32 N = 4096 F = 512 4.7 / 4.3, N = 65536 F = 512 59.1 / 36.2
CHUNK_ROWS = 256        # rows a block sums at least (16 a lane) ...
BLOCKS = 528            # ... over about this many blocks (4 per SM of an H200): a single chunk of 6400 rows and
                        # 512 features took 82 µs in 16 blocks (bfloat16 LSTM, B = 64, T = 100)


def chunks(N: int, F: int) -> tuple[int, int]:
    """(R, L): N rows of F features summed in R chunks of L rows, one block each per 32 features."""
    R = max(1, min(-(-N // CHUNK_ROWS), BLOCKS // -(-F // 32)))
    L = max(1, -(-N // R))
    return max(1, -(-N // L)), L


def sum_source(ctype: str) -> str:
    return SUM_SOURCE.format(S=ctype, T=math_type(ctype))


def param_grad_kernel(cell, n: str, slot: int, ctype: str) -> tuple[str, str]:
    """(name, CUDA source) reducing the gradient of node n's parameter operand `slot` over all rows.
    Arguments: g, each operand, y (each a pointer and a row stride; a vector parameter has stride 0)."""
    op = cell.op(n)
    names = ["G"] + [f"A{k}" for k in range(len(cell.reads(n)))] + ["Y"]
    args = "".join(f"const {ctype}* p{v}, long long ld{v}, " for v in names) + f"{ctype}* out, "
    loads = "\n".join(f"                {math_type(ctype)} {v} = p{v}[n * ld{v} + f];" for v in names)
    expr = op_expr(KERNEL[op.kind][1][slot], cell, n, names[1:-1], g="G", y="Y")
    text = PARAM_GRAD_SOURCE.format(name="{name}", args=args, T=math_type(ctype), loads=loads, expr=expr,
                                    U=IN_FLIGHT, Y=LANES)
    name = kernel_name("pgrad", text)
    return name, text.replace("{name}", name)


def param_grad_launches(be, cell, n, slot, g, ins, y, out) -> tuple:
    """The launches summing one term over g's N rows into out [F]: one kernel, or over many rows the chunks'
    kernel into a buffer of partial sums [R, F] made here, then the kernel adding them in order."""
    ctype = CTYPES[str(out.dtype)]
    kernel = be.raw(*param_grad_kernel(cell, n, slot, ctype))
    cp, N, F = be.xp, g.shape[0], out.shape[0]
    R, L = chunks(N, F)
    part = cp.empty((R, F), cp.float64 if ctype == "double" else cp.float32) if R > 1 else None
    head = (*be.row_args([g, *ins, y]), out, cp.int32(N), cp.int32(F), cp.int32(L))
    first = (kernel, ((F + 31) // 32, R), (32, LANES), (*head, cp.uint64(0) if part is None else part))
    if part is None:
        return (first,)
    total = be.raw(f"rg_pgrad_sum_{ctype}", sum_source(ctype))
    return first, (total, ((F + 255) // 256,), (256,), (part, cp.int32(R), cp.int32(F), out))
