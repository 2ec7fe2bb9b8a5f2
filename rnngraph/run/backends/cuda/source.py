"""What every generated CUDA source shares: the element type of each dtype (half storage computes in
float registers and rounds once when stored, as the numpy reference does: run/backends/base.py), the
prelude defining the half types, an op's expression from the op table, and a kernel's name from its text.
Pure strings: this room's generators run without a GPU."""
from __future__ import annotations

import hashlib

CTYPES = {"float32": "float", "float64": "double", "bfloat16": "rg_bf16", "float16": "rg_f16"}
HALF_TYPES = ("rg_bf16", "rg_f16")
ROW_REDUCTION = "rg_row_sum"        # the block-wide sum a row reduction's kernel defines (rows.py)

HALF_PRELUDE = r"""
// half storage: loads convert to float, a float stored is rounded to nearest even (NaN stays NaN)
struct rg_bf16 {
    unsigned short u;
    __device__ __forceinline__ operator float() const { return __uint_as_float((unsigned int)u << 16); }
    __device__ __forceinline__ rg_bf16& operator=(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(u) : "f"(f));     // one instruction (a NaN becomes the canonical one)
#else
        unsigned int x = __float_as_uint(f);
        u = (unsigned short)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : (x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
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
template <typename H> static __device__ __forceinline__ void rg_pair(const H* p, float& lo, float& hi) {
    // two adjacent elements of a 4-byte aligned pair, one load
    const unsigned int w = *(const unsigned int*)p;
    H a, b;
    a.u = (unsigned short)w; b.u = (unsigned short)(w >> 16);
    lo = (float)a; hi = (float)b;
}
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


def options(source: str, fast: bool = True) -> tuple:
    """The compiler's options for a generated source: --use_fast_math where it stores bfloat16 and `fast` allows
    (RNNGRAPH_FAST_MATH=0 does not), but for a row reduction's kernel (rows.py: a layer norm). The approximate
    tanh, exp, reciprocal and division it then compiles to (one MUFU instruction or a few) err by at most 2^-11
    relative (tanh.approx; exp2, rcp and div a few float32 ulps), an eighth of bfloat16's rounding unit 2^-8, so a
    stored value moves by at most a rounding flip, as any float32 difference does (the GPU tests' bound); they
    shorten the chain of a frame (sLSTM's forward: 0.1 µs a frame of 0.9). A layer norm divides by σ after x − μ
    cancels: there the approximations moved the LayerNorm-LSTM's gradients by 13 u against 6 u exactly (measured
    on an H200), so its kernels compile exactly. float16's unit (2^-11) is no larger than tanh.approx's error, and
    float32 and float64 keep every bit: those compile exactly too."""
    fast = fast and "rg_bf16" in source and "rg_f16" not in source and ROW_REDUCTION not in source
    return ("--use_fast_math",) if fast else ()


def op_expr(template: str, cell, n, operands, **extra) -> str:
    op = cell.op(n)
    attrs = {f"a{k}": repr(v) for k, v in enumerate(op.attrs)}
    return template.format(*operands, **attrs, **extra)


def kernel_name(kind: str, text: str) -> str:
    return f"rg_{kind}_{hashlib.sha1(text.encode()).hexdigest()[:12]}"

