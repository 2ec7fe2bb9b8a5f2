"""The row sums of a persistent kernel's GEMM phase on CUDA cores, shared by full and head-wise GEMMs: each
of the block's nq weight rows (in shared memory) against x's staged rows, a row's K split over idle warps,
every sum reduced by a fixed shuffle tree and the slices added in order (no atomics)."""
from __future__ import annotations

ROW_SUMS = r"""
        {{  // nq weight rows{rows}; where there are fewer than warps, each {row} splits into S slices
            const int nq = nu * {m}, S = nq > 0 && nq < NT / 32 ? (NT / 32) / nq : 1;
            for (int wq = warp; wq < nq * S; wq += NT / 32) {{
                const int q = wq / S, sl = wq - q * S, k1 = ({RW} * (sl + 1)) / S;
                const ST* w = sw + {woff} + q * {RW};{xdecl}
                CT acc[NB];
                #pragma unroll
                for (int b = 0; b < NB; ++b) acc[b] = 0;
                for (int k = ({RW} * sl) / S + lane; k < k1; k += 32) {{
                    const CT wk = w[k];
                    #pragma unroll
                    for (int b = 0; b < NB; ++b) acc[b] += {x}[b * {XW} + k] * wk;
                }}
                #pragma unroll
                for (int b = 0; b < NB; ++b) {{
                    CT v = acc[b];
                    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                    if (lane == 0) gp[wq * NB + b] = v;
                }}
            }}
            __syncthreads();
            for (int e = tid; e < nq * NB; e += NT) {{     // the slices added in order
                const int q = e / NB, b = e - q * NB;
                CT v = 0;
                for (int sl = 0; sl < S; ++sl) v += gp[(q * S + sl) * NB + b];
                gs[q * NB + b] = v;
            }}
        }}
        __syncthreads();"""


def row_sums(m: int, woff: int, RW: int, XW: int, x: str = "xs", xdecl: str = "", rows: str = "",
             row: str = "row's K") -> str:
    """The lines summing nq = nu·m rows of width RW (weights at woff) against x's NB staged rows, XW apart; x and
    xdecl: where a row's x starts (a head-wise row: its head's columns); rows, row: the comment's words."""
    return ROW_SUMS.format(m=m, woff=woff, RW=RW, XW=XW, x=x, xdecl=xdecl, rows=rows, row=row)
