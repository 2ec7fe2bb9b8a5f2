"""The per-frame GEMM of a persistent kernel whose weights stay in registers (mma.Resident, planned by mma.layout):
the source of its fragments' load and of each frame's GEMM.

A phase's weights are the MMA's A operand, 16 weight rows a tile, in registers for the whole call; x's rows are B,
8 a tile: per k-step a warp loads x's B fragments once (2 LDS.32 a tile) and runs them against every m-tile it
holds. Warps (mg, kg) split the m-tiles (mg) and, within each slice of x's columns staged in turn, the k-steps (kg);
the k-groups' partial sums meet in shared memory, added in k-group order (no atomics: runs are bit for bit
reproducible). The sums land where every GEMM puts them (gs[q·NB + b]).
"""
from __future__ import annotations

from .mma import SUMS, Layout
from .staging import padded, stage_slice
from .phases import block_units

FRAGMENTS = r"""    unsigned {f}[{MTW}][{KPW}][4];     // phase {kind}'s weight fragments, held for every frame
    {{  {units}
        const int g = lane >> 2, c = lane & 3, kg = warp % {WK}, mg = warp / {WK};
        #pragma unroll
        for (int i = 0; i < {MTW}; ++i)
            #pragma unroll
            for (int ks = 0; ks < {KPW}; ++ks)
                #pragma unroll
                for (int h = 0; h < 4; ++h) {{      // A[m][k]: row q = 16·tile + g (+ 8), word 8·k-step + c (+ 4)
                    const int step = (ks / {KPS}) * {SLICE_STEPS} + kg * {KPS} + ks % {KPS};   // slice, kg's own
                    const int q = (mg + i * {WM}) * 16 + g + (h & 1) * 8, kw = step * 8 + c + (h >> 1) * 4;
                    unsigned v = 0u;
                    if (mg < {WM} && q < nu * {m}) {{
                        const int j = q / nu, u = q - j * nu;
                        (void)j; (void)u;
{word}
                    }}
                    {f}[i][ks][h] = v;
                }}
    }}"""
HALF_WORD = r"""                        {{ const int k = 2 * kw; if (k < {K}) v = (unsigned)({src}).u; }}
                        {{ const int k = 2 * kw + 1; if (k < {K}) v |= (unsigned)({src}).u << 16; }}"""
TF32_WORD = r"""                        {{ const int k = kw; if (k < {K}) v = {word}; }}"""

RESIDENT_GEMM = r"""
        {{  // tensor cores, the weights in registers ({f}): warp (mg, kg) its m-tiles mg + i·{WM}, in each of the
            // {S} slices of x's columns its k-steps from kg·{KPS}
            ST* xh = (ST*)xs;
            const int nq = nu * {m}, g = lane >> 2, c = lane & 3, kg = warp % {WK}, mg = warp / {WK};
            const unsigned* xw = (const unsigned*)xh;
            float acc[{MTW}][{NTI}][4] = {{}};
            #pragma unroll
            for (int sl = 0; sl < {S}; ++sl) {{
                {{  const int k0 = sl * {KSL}, kw = {KSL};
{stage}
                }}
                __syncthreads();
                if (mg < {WM}) {{
                    #pragma unroll
                    for (int j = 0; j < {KPS}; ++j) {{
                        const int ks = sl * {KPS} + j, kw = (kg * {KPS} + j) * 8 + c;
                        #pragma unroll
                        for (int n = 0; n < {NTI}; ++n) {{    // B[k][n] = x[row 8n + g][k]: words kw and kw + 4
                            const unsigned b0 = {cvt0}, b1 = {cvt1};
                            #pragma unroll
                            for (int i = 0; i < {MTW}; ++i)
                                {mma}(acc[i][n], {f}[i][ks][0], {f}[i][ks][1], {f}[i][ks][2], {f}[i][ks][3], b0,
                                       b1);
                        }}
                    }}
                }}
                if (sl + 1 < {S}) __syncthreads();       // the slice read before the next is staged
            }}
{sums}
        }}
        __syncthreads();"""
WHOLE_SUMS = r"""            if (mg < {WM})
                #pragma unroll
                for (int i = 0; i < {MTW}; ++i)
                    #pragma unroll
                    for (int n = 0; n < {NTI}; ++n) {{   // D[m][n]: weight rows g (+ 8), x rows 2c, 2c + 1 of tile n
                        const int q = (mg + i * {WM}) * 16 + g, b = n * 8 + 2 * c;
                        if (q < nq && b < NB) {gs}[q * NB + b] = acc[i][n][0];
                        if (q < nq && b + 1 < NB) {gs}[q * NB + b + 1] = acc[i][n][1];
                        if (q + 8 < nq && b < NB) {gs}[(q + 8) * NB + b] = acc[i][n][2];
                        if (q + 8 < nq && b + 1 < NB) {gs}[(q + 8) * NB + b + 1] = acc[i][n][3];
                    }}"""
ADDED_SUMS = r"""            if (mg < {WM})      // partial sums in fragment order: [kg][mg][i][n][register][lane]
                #pragma unroll
                for (int i = 0; i < {MTW}; ++i)
                    #pragma unroll
                    for (int n = 0; n < {NTI}; ++n)
                        #pragma unroll
                        for (int r = 0; r < 4; ++r)
                            gp[kg * {SLOTS} + (((mg * {MTW} + i) * {NTI} + n) * 4 + r) * 32 + lane] = acc[i][n][r];
            __syncthreads();
            for (int e = tid; e < {SLOTS}; e += NT) {{     // each sum's k-groups added in order
                float v = 0.f;
                #pragma unroll
                for (int kk = 0; kk < {WK}; ++kk) v += gp[kk * {SLOTS} + e];
                const int ln = e & 31, r = (e >> 5) & 3, tn = e >> 7, n = tn % {NTI}, mi = tn / {NTI},
                          i = mi % {MTW};
                const int q = (mi / {MTW} + i * {WM}) * 16 + (ln >> 2) + (r >> 1) * 8,
                          b = n * 8 + (ln & 3) * 2 + (r & 1);
                if (q < nq && b < NB) {gs}[q * NB + b] = v;
            }}"""


def fragments(p, src: str, lay: Layout) -> str:
    """Declares resident phase p's weight fragments and loads them once (the pad rows and columns zero); src: the
    element of row q (j, u: its merged block and unit), column k in memory."""
    r = lay.resident[id(p)]
    word = (HALF_WORD if lay.itemsize == 2 else TF32_WORD).format(K=p.width, src=src,
                                                                  word=lay.rounded(f"__float_as_uint({src})"))
    return FRAGMENTS.format(f=r.name, MTW=r.mtw, KPW=r.kpw, WK=r.wk, WM=r.wm, m=p.m, kind=p.kind, word=word,
                            units=block_units(p.units), KPS=r.kpw // r.slices, SLICE_STEPS=r.kpw // r.slices * r.wk)


def resident_gemm(p, lay: Layout, x: str, ld: str, lag: int, xh: str | None = None, sums: str = "gs") -> str:
    """Resident phase p's GEMM (RESIDENT_GEMM) over x (a frame array's pointer and row stride, read at `lag`; xh: its
    tagged half words, mma.stage_slice), staged in its slices, the sums into `sums`."""
    r = lay.resident[id(p)]
    word = "(n * 8 + g < NB ? xw[(n * 8 + g) * {XLDW} + kw{plus}] : 0u)"
    b = [lay.rounded(word.format(XLDW=lay.xld * lay.itemsize // 4, plus=plus)) for plus in ("", " + 4")]
    slots = r.wm * r.mtw * r.nti * SUMS
    tail = (WHOLE_SUMS if r.wk == 1 else ADDED_SUMS).format(WM=r.wm, MTW=r.mtw, NTI=r.nti, WK=r.wk, SLOTS=slots,
                                                           gs=sums)
    return RESIDENT_GEMM.format(mma=lay.mma, f=r.name, WM=r.wm, WK=r.wk, KPS=r.kpw // r.slices, MTW=r.mtw, NTI=r.nti,
                                m=p.m, S=r.slices, KSL=padded(p.width) // r.slices, cvt0=b[0], cvt1=b[1], sums=tail,
                                stage=stage_slice(p, lay, x, ld, lag, "k", True, xh))
