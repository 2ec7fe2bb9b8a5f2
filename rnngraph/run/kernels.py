"""CUDA source generation: one kernel per fused group (forward and backward), built from the op
table's kernel rules, plus capturable GEMV/GEMM and parameter-gradient reductions. Pure strings:
this module runs without a GPU.

A fused kernel runs one thread per element (row r, feature f) of the group's [N, F] values. Every
argument is a pointer with a row stride (0 for a vector parameter [F], which broadcasts). Names:
  x<k>  external operand values        v<k>  member values (inputs of the backward kernel)
  y<k>  member values written (fwd)    gm<k> member gradients, read, then overwritten with the total
  gx<k> gradients of external operands, accumulated (+=, or atomicAdd where frames meet)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..ir.ops import KERNEL, OpKind

# a dtype's element type in memory; half types compute in float registers (math_type) and round once when
# stored, as the numpy reference does (run/backends/base.py)
CTYPES = {"float32": "float", "float64": "double", "bfloat16": "rg_bf16", "float16": "rg_f16"}
HALF_TYPES = ("rg_bf16", "rg_f16")

HALF_PRELUDE = r"""
// half storage: loads convert to float, a float stored is rounded to nearest even (NaN stays NaN)
struct rg_bf16 {
    unsigned short u;
    __device__ __forceinline__ operator float() const { return __uint_as_float((unsigned int)u << 16); }
    __device__ __forceinline__ rg_bf16& operator=(float f) {
        unsigned int x = __float_as_uint(f);
        u = (unsigned short)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : (x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
        return *this;
    }
};
struct rg_f16 {
    unsigned short u;
    __device__ __forceinline__ operator float() const { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(u)); return f; }
    __device__ __forceinline__ rg_f16& operator=(float f) { asm("cvt.rn.f16.f32 %0, %1;" : "=h"(u) : "f"(f)); return *this; }
};
template <typename H> static __device__ __forceinline__ void rg_atomic_add(H* p, float v) {
    // p += v, rounded once: a compare-and-swap on the aligned 32-bit word holding the 16-bit value
    unsigned int* w = (unsigned int*)((unsigned long long)p & ~3ull);
    const unsigned int sh = ((unsigned long long)p & 2ull) ? 16u : 0u;
    unsigned int old = *w, seen;
    do {
        seen = old;
        H h;
        h.u = (unsigned short)(seen >> sh);
        h = (float)h + v;
        old = atomicCAS(w, seen, (seen & ~(0xffffu << sh)) | ((unsigned int)h.u << sh));
    } while (old != seen);
}
template <typename H> static __device__ __forceinline__ float rg_rounded(float v) { H h; h = v; return (float)h; }
static __device__ __forceinline__ void atomicAdd(rg_bf16* p, float v) { rg_atomic_add(p, v); }
static __device__ __forceinline__ void atomicAdd(rg_f16* p, float v) { rg_atomic_add(p, v); }
"""


def math_type(ctype: str) -> str:
    """The register type computing on elements of type ctype: float for the half types, else ctype."""
    return "float" if ctype in HALF_TYPES else ctype


def rounded(expr: str, ctype: str) -> str:
    """C expression: the value of expr as a load would see it once stored (rounded to ctype's precision)."""
    return f"rg_rounded<{ctype}>({expr})" if ctype in HALF_TYPES else expr


def complete(source: str) -> str:
    """A generated source ready to compile: the half types' definitions first where it uses them."""
    return HALF_PRELUDE + source if any(h in source for h in HALF_TYPES) else source

FUSED_SOURCE = r"""
extern "C" __global__ void {name}({args}long long rows, int F) {{
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * F) return;
    long long r = e / F;
    int f = (int)(e - r * F);
{body}
}}
"""


@dataclass(frozen=True)
class KernelSpec:
    """A generated fused kernel: argument names and the arrays that feed them, body and stores."""
    inputs: tuple      # keys: ("val", node) member value, or ("ext", (u, d, cols)) external value
    outputs: tuple     # keys: ("out", node) / ("grad", node) / ("gext", (u, d, cols))
    in_names: tuple
    out_names: tuple
    body: tuple        # C statements over locals
    stores: tuple      # (output name, local, "=" or "+=")

    def olds(self, at, ctype: str, loaded: dict | None = None) -> list:
        """Loads of what the '+=' stores add to, issued with the other loads: after each other's stores
        (which the compiler keeps in order: the pointers may alias) they would wait a load latency each.
        loaded: '<name>_old' -> a register already holding one."""
        return [f"{ctype} {nm}_old = {(loaded or {}).get(nm + '_old') or at(nm)};"
                for nm, _, op in self.stores if op == "+="]

    def writes(self, at) -> list:
        """The stores: '=', '+=' (onto the value olds() loaded) or an atomic add."""
        return [f"atomicAdd(&{at(nm)}, {v});" if op == "atomic" else f"{at(nm)} = {nm}_old + {v};" if op == "+="
                else f"{at(nm)} = {v};" for nm, v, op in self.stores]

    def launch_shape(self, rows: int, F: int) -> tuple:
        """(grid, block): a thread per element."""
        return ((rows * F + 127) // 128,), (128,)

    def args(self, ctype: str) -> str:
        """The kernel's parameters: a pointer to element type ctype and a row stride per name, inputs read-only."""
        return ("".join(f"const {ctype}* __restrict__ p_{nm}, long long s_{nm}, " for nm in self.in_names)
                + "".join(f"{ctype}* p_{nm}, long long s_{nm}, " for nm in self.out_names))

    def source(self, ctype: str) -> tuple[str, str]:
        """(kernel name, CUDA source) for element type ctype (CTYPES' values)."""
        at, mt, args = (lambda nm: f"p_{nm}[r * s_{nm} + f]"), math_type(ctype), self.args(ctype)
        lines = [f"{mt} {nm} = {at(nm)};" for nm in self.in_names]
        lines += [f"{mt} {nm} = {at(nm)};" for nm in self.out_names if nm.startswith("gm")]
        lines += self.olds(at, mt) + [ln.replace("T ", f"{mt} ") for ln in self.body] + self.writes(at)
        text = FUSED_SOURCE.format(name="{name}", args=args, body="\n".join("    " + ln for ln in lines))
        name = kernel_name("fused", text)
        return name, text.replace("{name}", name)


def _externals(cell, nodes):
    """Ordered external reads (u, delay, cols) of a group; cols is the (start, stop) of a slice read."""
    members, out = set(nodes), []
    for n in nodes:
        op = cell.op(n)
        for u, d in cell.reads(n):
            if u in members and d == 0:
                continue
            key = (u, d, op.attrs if op.kind is OpKind.SLICE else None)
            if key not in out:
                out.append(key)
    return out


def _operands(cell, n, idx, ext):
    """C names of node n's operands: member values v<k> or external values x<k>."""
    op, names = cell.op(n), []
    for u, d in cell.reads(n):
        if u in idx and d == 0:
            names.append(f"v{idx[u]}")
        else:
            names.append(f"x{ext.index((u, d, op.attrs if op.kind is OpKind.SLICE else None))}")
    return names


def op_expr(template: str, cell, n, operands, **extra) -> str:
    op = cell.op(n)
    attrs = {f"a{k}": repr(v) for k, v in enumerate(op.attrs)}
    return template.format(*operands, **attrs, **extra)


def kernel_name(kind: str, text: str) -> str:
    return f"rg_{kind}_{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def fusable(cell, nodes) -> bool:
    """Whether a group becomes one generated kernel (every op has an expression rule)."""
    return all(cell.op(n).kind in KERNEL for n in nodes)


def fused_forward_kernel(cell, nodes) -> KernelSpec:
    idx = {n: k for k, n in enumerate(nodes)}
    ext = _externals(cell, nodes)
    body = tuple(f"T v{idx[n]} = {op_expr(KERNEL[cell.op(n).kind][0], cell, n, _operands(cell, n, idx, ext))};"
                 for n in nodes)
    return KernelSpec(tuple(("ext", e) for e in ext), tuple(("out", n) for n in nodes),
                      tuple(f"x{k}" for k in range(len(ext))), tuple(f"y{k}" for k in range(len(nodes))),
                      body, tuple((f"y{k}", f"v{k}", "=") for k in range(len(nodes))))


def backward_io(cell, nodes, param_names, atomic: bool) -> dict:
    """What a group's reverse-mode kernel reads and writes (the KernelSpec fields but its body), and
    idx (member -> k), ext (external reads) and gext (the externals that get gradients, by index)."""
    idx = {n: k for k, n in enumerate(nodes)}
    ext = _externals(cell, nodes)
    gext = [k for k, e in enumerate(ext) if e[0] not in param_names]
    several = {u for u, _, _ in ext if sum(e[0] == u for e in ext) > 1} if atomic else set()
    stores = [(f"gm{k}", f"d{k}", "=") for k in range(len(nodes))]
    stores += [(f"gx{k}", f"a{k}", "atomic" if ext[k][0] in several else "+=") for k in gext]
    spec = dict(inputs=tuple([("ext", e) for e in ext] + [("val", n) for n in nodes]),
                outputs=tuple([("grad", n) for n in nodes] + [("gext", ext[k]) for k in gext]),
                in_names=tuple([f"x{k}" for k in range(len(ext))] + [f"v{k}" for k in range(len(nodes))]),
                out_names=tuple([f"gm{k}" for k in range(len(nodes))] + [f"gx{k}" for k in gext]), stores=tuple(stores))
    return {"spec": spec, "idx": idx, "ext": ext, "gext": gext}


def fused_backward_kernel(cell, nodes, param_names, atomic: bool = False) -> KernelSpec:
    """Reverse-mode kernel of a group; gradients of parameters are left to hoisted reductions. atomic:
    gradients of a node read at several delays are added atomically (threads of two frames meet)."""
    io = backward_io(cell, nodes, param_names, atomic)
    idx, ext, gext = io["idx"], io["ext"], io["gext"]
    body = [f"T d{idx[n]} = gm{idx[n]};" for n in nodes]
    body += [f"T a{k} = 0;" for k in gext]
    for n in reversed(nodes):
        op, ops = cell.op(n), _operands(cell, n, idx, ext)
        for slot, ((u, d), name) in enumerate(zip(cell.reads(n), ops)):
            if u in param_names:
                continue
            e = op_expr(KERNEL[op.kind][1][slot], cell, n, ops, g=f"d{idx[n]}", y=f"v{idx[n]}")
            body.append(f"{'d' if name[0] == 'v' else 'a'}{name[1:]} += {e};")
    return KernelSpec(body=tuple(body), **io["spec"])


# -------------------------------------------------------------------------------------------------
# Capturable matrix products, both of the one form C[n, m] (+)= Σ_k A[n, k] · W[m, k]
# A [N, K] with row stride lda; W [M, K] contiguous; C [N, M] with row stride ldc.

GEMV_ROWS = 8   # at most this many rows go to the warp-per-output GEMV; more use the tiled GEMM

GEMV_SOURCE = r"""
extern "C" __global__ void rg_gemv_{S}(const {S}* __restrict__ A, long long lda,
        const {S}* __restrict__ W, {S}* C, long long ldc, int N, int M, int K, int accumulate) {{
    // one warp per output column m, all N (<= 8) rows at once; W's row m is read once, coalesced
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= M) return;
    const {S}* w = W + (long long)warp * K;
    {T} acc[8] = {{0, 0, 0, 0, 0, 0, 0, 0}};
    for (int k = lane; k < K; k += 32) {{
        {T} wk = w[k];
        #pragma unroll
        for (int n = 0; n < 8; ++n) if (n < N) acc[n] += A[n * lda + k] * wk;
    }}
    #pragma unroll
    for (int n = 0; n < 8; ++n) {{
        {T} v = acc[n];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffff, v, off);
        if (lane == 0 && n < N) {{
            {S}* c = C + n * ldc + warp;
            *c = accumulate ? *c + v : v;
        }}
    }}
}}
"""

GEMM_SOURCE = r"""
#define BM 32
#define BN 32
#define BK 32
extern "C" __global__ void rg_gemm_{S}(const {S}* __restrict__ A, long long lda,
        const {S}* __restrict__ W, {S}* C, long long ldc, int N, int M, int K, int accumulate) {{
    // 32x32 output tile per block of 256 threads, 2x2 outputs per thread, K in steps of 32
    __shared__ {T} As[BM][BK + 1];
    __shared__ {T} Ws[BN][BK + 1];
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int n0 = blockIdx.y * BM, m0 = blockIdx.x * BN;
    {T} acc[2][2] = {{{{0, 0}}, {{0, 0}}}};
    for (int k0 = 0; k0 < K; k0 += BK) {{
        for (int e = threadIdx.x; e < BM * BK; e += 256) {{
            int r = e / BK, c = e % BK;
            As[r][c] = (n0 + r < N && k0 + c < K) ? ({T})A[(long long)(n0 + r) * lda + k0 + c] : ({T})0;
            Ws[r][c] = (m0 + r < M && k0 + c < K) ? ({T})W[(long long)(m0 + r) * K + k0 + c] : ({T})0;
        }}
        __syncthreads();
        #pragma unroll 8
        for (int k = 0; k < BK; ++k) {{
            {T} a0 = As[ty][k], a1 = As[ty + 16][k], w0 = Ws[tx][k], w1 = Ws[tx + 16][k];
            acc[0][0] += a0 * w0; acc[0][1] += a0 * w1; acc[1][0] += a1 * w0; acc[1][1] += a1 * w1;
        }}
        __syncthreads();
    }}
    #pragma unroll
    for (int a = 0; a < 2; ++a)
        #pragma unroll
        for (int b = 0; b < 2; ++b) {{
            int n = n0 + ty + 16 * a, m = m0 + tx + 16 * b;
            if (n < N && m < M) {{
                {S}* c = C + (long long)n * ldc + m;
                *c = accumulate ? *c + acc[a][b] : acc[a][b];
            }}
        }}
}}
"""


def matmul_source(kind: str, ctype: str) -> str:
    """CUDA source of the capturable 'gemv' or 'gemm' kernel rg_<kind>_<ctype> for element type ctype."""
    return (GEMV_SOURCE if kind == "gemv" else GEMM_SOURCE).replace("{S}", ctype).replace(
        "{T}", math_type(ctype)).replace("{{", "{").replace("}}", "}")


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


GEMV_FUSED_ROWS = 8   # a per-frame GEMM with at most this many rows can run inside its fused kernel
PAIR_MAX_BYTES = 8 << 20   # ... and does when rows × its weight bytes are at most this (measured on an H200)

GEMV_FUSED_SOURCE = r"""
extern "C" __global__ void {name}(const {S}* __restrict__ gA, long long glda, const {S}* __restrict__ gW,
        int gK, {S}* gC, long long gldc, {args}long long rows, int F) {{
    // one block of 128 threads per feature f: the GEMM outputs of f for every merged linear op and
    // row (each thread a quarter-warp slice of K, then warp and block reductions), then threads
    // r < rows run the fused group's body for element (r, f)
    __shared__ {T} part[4][{m}][8];
    int f = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long r = threadIdx.x < rows ? threadIdx.x : 0;
{prefetch}
{decl}
    for (int k = threadIdx.x; k < gK; k += 128) {{
{wload}
        #pragma unroll
        for (int b = 0; b < 8; ++b) if (b < rows) {{
            {T} a = gA[b * glda + k];
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


def gemv_fused_kernel(spec: KernelSpec, gemm_nodes, offsets, ctype: str):
    """(name, source) of one frame's merged GEMM (rows ≤ 8) and the fused group that reads it, as one
    kernel. gemm_nodes/offsets: the merged linear ops and their column offsets in the GEMM output."""
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
        name="{name}", S=ctype, T=mt, args=args, m=m, prefetch="\n".join(prefetch),
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
