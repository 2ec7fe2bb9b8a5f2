"""A per-frame GEMM with few rows and the fused group it feeds, as one kernel: one block per feature
computes that feature's GEMV outputs (over its head's columns where the GEMM is head-wise), then runs the
group's body on them (plan item Pair)."""
from __future__ import annotations

from .fused import KernelSpec
from .source import kernel_name, math_type, rounded

GEMV_FUSED_ROWS = 8   # a per-frame GEMM with at most this many rows can run inside its fused kernel
PAIR_MAX_BYTES = 8 << 20   # ... and does when rows × its weight bytes are at most this (measured on an H200)

GEMV_FUSED_SOURCE = r"""
extern "C" __global__ void {name}(const {S}* __restrict__ gA, long long glda, const {S}* __restrict__ gW,
        int gK, {S}* gC, long long gldc, {args}long long rows, int F) {{
    // one block of 128 threads per feature f: the GEMM outputs of f for every merged linear op and
    // row (each thread a quarter-warp slice of K, then warp and block reductions), then threads
    // r < rows run the fused group's body for element (r, f)
    __shared__ {T} part[4][{m}][8];
    int f = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;{head}
    long long r = threadIdx.x < rows ? threadIdx.x : 0;
{prefetch}
{decl}
    for (int k = threadIdx.x; k < gK; k += 128) {{
{wload}
        #pragma unroll
        for (int b = 0; b < 8; ++b) if (b < rows) {{
            {T} a = gA[b * glda + {ha}k];
{fma}
        }}
    }}
    #pragma unroll
    for (int b = 0; b < 8; ++b) if (b < rows) {{
        for (int o = 16; o > 0; o >>= 1) {{
{shfl}
        }}
        if (lane == 0) {{
{share}
        }}
    }}
    __syncthreads();
    if (threadIdx.x >= rows) return;
{pick}
{body}
}}
"""


def pair_kernel(spec: KernelSpec, gemm, ctype: str):
    """gemv_fused_kernel of a Pair's GEMM item `gemm` (its merged linear ops, their offsets, their heads) and the
    fused group's spec."""
    offsets = [sum(gemm.sizes[:j]) for j in range(len(gemm.nodes))]
    head = gemm.sizes[0] // gemm.heads if gemm.heads > 1 else 0
    return gemv_fused_kernel(spec, list(gemm.nodes), offsets, ctype, head)


def gemv_fused_kernel(spec: KernelSpec, gemm_nodes, offsets, ctype: str, head: int = 0):
    """(name, source) of one frame's merged GEMM (rows ≤ 8) and the fused group that reads it, as one
    kernel. gemm_nodes/offsets: the merged linear ops and their column offsets in the GEMM output. head: the
    features of a head where the linear ops are head-wise (each row of W then has gK = K/k entries, and
    feature f reads A's columns of its head f / head), 0 for full matrices."""
    m = len(gemm_nodes)
    from_gemm = {f"x{k}": gemm_nodes.index(key[1][0]) for k, key in enumerate(spec.inputs)
                 if key[0] == "ext" and key[1][0] in gemm_nodes and key[1][1] == 0 and key[1][2] is None}
    at = lambda nm: f"p_{nm}[r * s_{nm} + f]"
    args = spec.args(ctype)
    # the group's other operands are loaded first, so their latency overlaps the GEMV's
    mt = math_type(ctype)
    prefetch = [f"    {mt} {nm} = {at(nm)};" for nm in spec.in_names if nm not in from_gemm]
    lines = [f"{mt} {nm} = {rounded(f'g{from_gemm[nm]}', ctype)};" for nm in spec.in_names if nm in from_gemm]
    lines += spec.olds(at, mt) + [ln.replace("T ", f"{mt} ") for ln in spec.body] + spec.writes(at)
    text = GEMV_FUSED_SOURCE.format(
        name="{name}", S=ctype, T=mt, args=args, m=m, prefetch="\n".join(prefetch), ha="ha + " if head else "",
        head=f"\n    const int ha = (f / {head}) * gK;   // f's head: its columns of A" if head else "",
        decl="\n".join(f"    {mt} acc{j}[8] = {{0, 0, 0, 0, 0, 0, 0, 0}};" for j in range(m)),
        wload="\n".join(f"        {mt} w{j} = gW[(long long)({offsets[j]} + f) * gK + k];" for j in range(m)),
        fma="\n".join(f"            acc{j}[b] += a * w{j};" for j in range(m)),
        shfl="\n".join(f"            acc{j}[b] += __shfl_xor_sync(0xffffffff, acc{j}[b], o);" for j in range(m)),
        share="\n".join(f"            part[warp][{j}][b] = acc{j}[b];" for j in range(m)),
        pick="\n".join([f"    {mt} g{j} = part[0][{j}][r] + part[1][{j}][r] + part[2][{j}][r] + part[3][{j}][r];"
                        for j in range(m)] + [f"    gC[r * gldc + {offsets[j]} + f] = g{j};" for j in range(m)]),
        body="\n".join("    " + ln for ln in lines))
    name = kernel_name("gemvfused", text)
    return name, text.replace("{name}", name)
