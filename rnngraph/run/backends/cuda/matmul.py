"""Capturable matrix products of our own (cuBLAS cannot be recorded through CuPy), both of the one form
C[n, m] (+)= Σ_k A[n, k] · W[m, k]: A [N, K] with row stride lda; W [M, K] contiguous; C [N, M] with row
stride ldc. A warp-per-output GEMV for a few rows, a tiled GEMM for more."""
from __future__ import annotations

from .source import math_type

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
