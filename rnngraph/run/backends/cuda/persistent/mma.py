"""The persistent kernel's per-frame GEMMs on tensor cores, for half storage (full matrices from
runner.TENSOR_CORES_FROM rows, head-wise ones beyond MAX_ROWS; up to MMA_ROWS), and for float32 in TF32 where the
user allows it (full matrices, as torch's allow_tf32), else in 3xTF32. A full-matrix GEMM phase's block holds its
weight rows in registers where they fit (RESIDENT_WORDS a thread, all such phases together, RESIDENT_SUMS sums; x
staged in at most UNROLLED_SLICES equal slices): planned here (resident(): which warps hold which tiles and
k-steps), generated in resident.py. Otherwise a GEMM phase's block holds its weight rows in shared memory as
stored (bfloat16 or float16; float32 rounded to TF32 once, or as float32 in 3xTF32), each row padded to KP = K
rounded up to 16 and strided WLD = KP + PAD elements (PAD: 16 bytes; the pad zero; the stride keeps the fragments'
loads free of bank conflicts). Per frame it stages x's B rows, as stored, K in slices of KS columns of even width
([ceil(B/16)·16, KS + PAD] elements: B = 256 and K = 2048 do not fit at once; staging.py: each row a bulk copy, or
every 16-byte copy in flight at once, through L2, where rows are 16-byte aligned), and every warp runs `mma.sync`
with float32 accumulation on its tiles of 16 rows × 8 weight rows, fixed per warp: m16n8k16 on halves, m16n8k8 on
TF32 (x's values rounded to TF32, to nearest, as they enter the MMA: a product's inputs each within 2⁻¹¹ relative,
the product exact in float32, the sums float32); float32 where TF32 is not allowed in 3xTF32 (SPLIT: the weights kept
as float32, three MMAs a product, within about 3·2⁻²² of it); no atomics, so runs are bit for bit reproducible.
The sums land where the CUDA-core GEMV puts them (gs[q·NB + b]), so the phases' stores and fused bodies are the same
code. Rows of x past B and weight rows past the block's are read but never stored (an MMA's output element reads
only its own row and column); the pad columns are zero in both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import staging
from .phases import block_units
from .staging import padded, stage_slice

MMA_ROWS = 256              # the batch rows a tensor-core persistent kernel takes
XS_BYTES = 96 << 10         # the staged slice of x takes at most this much shared memory
XS_RESIDENT_BYTES = 160 << 10   # ... where every GEMM phase holds its weights in registers (none in shared memory)
RESIDENT_WORDS = 48         # the weight fragments' registers a thread may hold, all resident phases together
RESIDENT_SUMS = 32          # ... and the float32 sums of a resident GEMM's tiles a thread may hold (4 a tile)

PTX_TYPE = {"rg_bf16": "bf16", "rg_f16": "f16", "float": "tf32"}
K_STEP = {"bf16": 16, "f16": 16, "tf32": 8}             # the MMA's k: m16n8k16 on halves, m16n8k8 on TF32

HELPERS = r"""
static __device__ __forceinline__ void rg_mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                              unsigned b0, unsigned b1) {{
    // D = A·B + D: A 16x{k} (rows of x), B {k}x8 (weight rows, k-major), D 16x8 in float32
    asm volatile("mma.sync.aligned.m16n8k{k}.row.col.f32.{ptx}.{ptx}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}
"""
TF32 = r"""
static __device__ __forceinline__ unsigned rg_tf32(unsigned x) {
    // a float32's bits rounded to TF32 (10-bit mantissa), to nearest, ties away from zero
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(__uint_as_float(x)));
    return r;
}
static __device__ __forceinline__ float rg_tf32f(float x) { return __uint_as_float(rg_tf32(__float_as_uint(x))); }
"""
SPLIT_BITS = r"""
static __device__ __forceinline__ void rg_split(unsigned x, unsigned& big, unsigned& small) {
    // finite float32 bits as big + small, both TF32: big x rounded, small the rest rounded (3xTF32); rounded as
    // cvt.rna.tf32.f32 rounds finite values (to nearest, ties away), in integer operations, not the slower cvt
    big = (x + 0x1000u) & 0xffffe000u;
    small = (__float_as_uint(__uint_as_float(x) - __uint_as_float(big)) + 0x1000u) & 0xffffe000u;
}
"""
SPLIT = SPLIT_BITS + r"""static __device__ __forceinline__ void rg_mma3(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
    // D = A·B + D on float32 operands in 3xTF32: small·big, big·small, then big·big (small·small dropped)
    unsigned A[4], a[4], Bb[2], b[2];
    rg_split(a0, A[0], a[0]); rg_split(a1, A[1], a[1]); rg_split(a2, A[2], a[2]); rg_split(a3, A[3], a[3]);
    rg_split(b0, Bb[0], b[0]); rg_split(b1, Bb[1], b[1]);
    rg_mma(c, a[0], a[1], a[2], a[3], Bb[0], Bb[1]);
    rg_mma(c, A[0], A[1], A[2], A[3], b[0], b[1]);
    rg_mma(c, A[0], A[1], A[2], A[3], Bb[0], Bb[1]);
}
"""

GEMM = r"""
        {{  // tensor cores: the block's nq weight rows against x's NB rows, in tiles of 16 rows x 8 weight rows;
            // where there are fewer tiles than warps, S warps share a tile, each taking every S-th k-step
            ST* xh = (ST*)xs{xoff};
            const int nq = nu * {m}, nt = (nq + 7) >> 3, tiles = {MT} * nt, S = tiles < NT / 32 ? (NT / 32) / tiles : 1;
            float acc[{TPW}][4];
            #pragma unroll
            for (int i = 0; i < {TPW}; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
            #pragma unroll {UNROLL}
            for (int k0 = 0; k0 < {KP}; k0 += {KS}) {{
                const int kw = min({KS}, {KP} - k0);{stage}
                #pragma unroll
                for (int i = 0; i < {TPW}; ++i) {{
                    const int wt = warp + i * (NT / 32), tile = wt / S, sl = wt - tile * S;
                    if (tile < tiles) {{
                        const int r = (tile / nt) * 16 + (lane >> 2), c = (lane & 3) * {E};
                        const unsigned* w = (const unsigned*)(sw + {woff} + ((tile % nt) * 8 + (lane >> 2)) * {WLD} + k0 + c);
                        const unsigned* x0 = (const unsigned*)(xh + r * {XLD} + c);
                        const unsigned* x8 = (const unsigned*)(xh + (r + 8) * {XLD} + c);
                        for (int h = sl * 8; h < kw / {E}; h += 8 * S)
                            {mma}(acc[i], {a}, w[h], w[h + 4]);
                    }}
                }}
                __syncthreads();
            }}
            if (S > 1) {{        // the k-slices' partial sums, added in slice order (no atomics)
                if (warp < tiles * S)
                    for (int c = 0; c < 4; ++c) gp[(warp * 4 + c) * 32 + lane] = acc[0][c];
                __syncthreads();
                if (warp < tiles * S && warp % S == 0)
                    for (int c = 0; c < 4; ++c) {{
                        float v = 0.f;
                        for (int sl = 0; sl < S; ++sl) v += gp[((warp + sl) * 4 + c) * 32 + lane];
                        acc[0][c] = v;
                    }}
            }}
            #pragma unroll
            for (int i = 0; i < {TPW}; ++i) {{
                const int wt = warp + i * (NT / 32), tile = wt / S, sl = wt - tile * S;
                if (tile < tiles && sl == 0) {{
                    const int b = (tile / nt) * 16 + (lane >> 2), q = (tile % nt) * 8 + (lane & 3) * 2;
                    if (b < NB && q < nq) {gs}[q * NB + b] = acc[i][0];
                    if (b < NB && q + 1 < nq) {gs}[(q + 1) * NB + b] = acc[i][1];
                    if (b + 8 < NB && q < nq) {gs}[q * NB + b + 8] = acc[i][2];
                    if (b + 8 < NB && q + 1 < nq) {gs}[(q + 1) * NB + b + 8] = acc[i][3];
                }}
            }}
        }}
        __syncthreads();"""

A_WORDS = ("x0[h]", "x8[h]", "x0[h + 4]", "x8[h + 4]")    # a lane's A fragment: rows r and r + 8, k-words h and h + 4
SUMS = 4 * 32               # a warp's partial sums of one tile: 4 floats a lane
UNROLLED_SLICES = 4         # x staged in at most this many slices: the slice loop unrolled (its bounds constants)


@dataclass(frozen=True)
class Layout:
    """Shared memory of a tensor-core kernel: per GEMM phase its weights' offset (elements), their row stride
    (wld) and rows; the x slice's columns KS per phase, its row stride XLD and rows (B padded to 16); the
    element's bytes (2: halves, 4: float32 in TF32)."""
    woff: dict          # id(phase) -> offset of its weight rows, in elements
    weights: int        # elements of all weight rows
    ks: dict            # id(phase) -> columns of x staged at once
    xld: int
    x_rows: int
    tiles_per_warp: int
    itemsize: int = 2
    x_buffers: int = 1  # slices of x staged at once: a head-wise dgemm's J linear ops' output gradients (heads.py)
    resident: dict = field(default_factory=dict)    # id(phase) -> Resident: weights in registers (resident.py)
    split: bool = False     # float32 in 3xTF32 (SPLIT): weights as float32, operands split as they enter the MMA

    @property
    def mma(self) -> str:
        """The MMA helper the GEMMs call: rg_mma3 in 3xTF32, else rg_mma."""
        return "rg_mma3" if self.split else "rg_mma"

    def rounded(self, x: str) -> str:
        """Expression x (float32 bits) as it enters the MMA: rounded to TF32 (itemsize 4, not split), else as is."""
        return f"rg_tf32({x})" if self.itemsize == 4 and not self.split else x

    @property
    def pad(self) -> int:
        """The elements a row of weights or of staged x is padded by: 16 bytes (keeps the fragments' loads in
        distinct banks)."""
        return 16 // self.itemsize

    def wld(self, width: int) -> int:
        """The row stride of a phase's weight rows of `width` columns."""
        return padded(width) + self.pad

    @property
    def partials(self) -> int:
        """The float32 partial sums the resident phases' warps hand one another (their largest)."""
        return max((r.partials for r in self.resident.values()), default=0)


@dataclass(frozen=True)
class Resident:
    """A GEMM phase whose weights stay in registers (resident.py), `name` their array. Its WM·WK warps are (mg, kg) =
    (w div WK, w mod WK): warp (mg, kg) holds the A fragments of m-tiles mg, mg + WM, ... (MTW tiles of 16 weight
    rows) for KPW k-steps (the MMA's k each), KPW / slices in each of the `slices` equal parts of x's padded row
    that are staged in turn (there, the k-steps from kg·KPW / slices), against NTI tiles of 8 of x's rows."""
    name: str
    wm: int
    wk: int
    mtw: int
    kpw: int
    nti: int
    slices: int = 1

    @property
    def words(self) -> int:
        """The fragment registers a thread holds."""
        return self.mtw * self.kpw * 4

    @property
    def partials(self) -> int:
        """The float32 partial sums its warps write for one another (none where WK = 1)."""
        return 0 if self.wk == 1 else self.wk * self.wm * self.mtw * self.nti * SUMS


def resident(p, B: int, G: int, warps: int, words: int, itemsize: int, name: str,
             budget: int = XS_RESIDENT_BYTES) -> Resident | None:
    """How full-matrix phase p keeps its weights in registers at B rows on G blocks of `warps` warps, in at most
    `words` registers a thread (and RESIDENT_SUMS sums), x staged in the fewest equal slices (at most
    UNROLLED_SLICES) of at most `budget` bytes, or None: the split of its m-tiles and k-steps over warps that moves
    the fewest 32-bit words through shared memory a frame (x's B fragments, loaded by every m-group; the k-groups'
    partial sums, written and read), fewest registers first among equals; its k-groups take whole k-steps of each
    slice."""
    mti, nti, rows = -(-(-(-p.units // G) * p.m) // 16), -(-B // 8), -(-B // 16) * 16
    kst = padded(p.width) * itemsize // 32      # k-steps of 32 bytes a row: 16 halves, 8 TF32 values
    S = next((S for S in range(1, UNROLLED_SLICES + 1)
              if kst % S == 0 and rows * (kst // S * 32 + 16) <= budget), None)
    best = None
    for wk in (d for d in range(1, warps + 1) if S and kst // S % d == 0):
        for wm in range(1, min(mti, warps // wk) + 1):
            r = Resident(name, wm, wk, -(-mti // wm), kst // wk, nti, S)
            cost = (2 * kst * nti * wm + (2 * r.partials // 32 if wk > 1 else 0), r.words)
            if r.words <= words and r.mtw * nti * 4 <= RESIDENT_SUMS and (best is None or cost < best[0]):
                best = (cost, r)
    return best and best[1]


def layout(gemm_phases, B: int, G: int, threads: int, itemsize: int = 2, split: bool = False) -> Layout:
    """The layout for `gemm_phases` (each with units, m and width K) at B rows on G blocks, elements of
    `itemsize` bytes (2: half storage; 4: float32 in TF32, or split in 3xTF32): full-matrix phases keep their
    weights in registers (resident) where the registers allow and x's rows stage in at most UNROLLED_SLICES slices,
    else in shared memory (then x within the smaller budget, XS_BYTES, for all)."""
    rows, pad = -(-B // 16) * 16, 16 // itemsize
    res = _residents(gemm_phases, B, G, threads, itemsize, XS_RESIDENT_BYTES)
    if len(res) < len(gemm_phases):        # weights in shared memory too: x within the smaller budget
        res = _residents(gemm_phases, B, G, threads, itemsize, XS_BYTES)
    cap = max(16, (XS_BYTES // (itemsize * rows) - pad) // 16 * 16)     # x's slices where weights sit in shared memory
    woff, n, ks, tiles = {}, 0, {}, 1
    for p in gemm_phases:
        per, KP = -(-p.units // G) * p.m, padded(p.width)
        woff[id(p)] = n
        n += 0 if id(p) in res else -(-per // 8) * 8 * (KP + pad)
        ks[id(p)] = KP // res[id(p)].slices if id(p) in res else padded(-(-KP // -(-KP // cap)))   # each within the cap
        tiles = max(tiles, rows // 16 * -(-per // 8))
    xld = max(ks.values()) + pad
    bufs = max((p.m for p in gemm_phases if p.kind == "dgemm" and p.heads > 1 and ks[id(p)] == padded(p.width)),
               default=1)                       # one slice each: their J slices in flight at once
    bufs = bufs if bufs * rows * xld * itemsize <= XS_BYTES else 1
    return Layout(woff, n, ks, xld, rows, -(-tiles // (threads // 32)), itemsize, bufs, res, split)


def _residents(gemm_phases, B: int, G: int, threads: int, itemsize: int, budget: int) -> dict:
    """{id(phase): Resident} of the full-matrix phases, in order, while their registers last (RESIDENT_WORDS in
    all), x's slices each within `budget` bytes."""
    out, words = {}, RESIDENT_WORDS
    for i, p in enumerate(gemm_phases):
        r = resident(p, B, G, threads // 32, words, itemsize, f"wf{i}", budget) if p.heads == 1 else None
        if r:
            out[id(p)], words = r, words - r.words
    return out


def weights(p, off: int, src: str, lay: Layout) -> str:
    """Copies the block's weight rows of phase p into shared memory, padded to KP with zeros (float32 rounded to
    TF32, unless split); src: the element of row q (j, u: its merged block and unit), column k."""
    KP, WLD = padded(p.width), lay.wld(p.width)
    src = f"rg_tf32f({src})" if lay.itemsize == 4 and not lay.split else src
    return (f"    {{   {block_units(p.units)}\n"
            f"        for (int e = tid; e < nu * {p.m * KP}; e += NT) {{\n"
            f"            const int q = e / {KP}, k = e - q * {KP}, j = q / nu, u = q - j * nu;\n"
            f"            (void)j; (void)u;\n"
            f"            if (k < {p.width}) sw[{off} + q * {WLD} + k] = {src}; else sw[{off} + q * {WLD} + k] = 0.f;\n"
            f"        }}\n    }}")


def gemm(p, off, lay: Layout, x: str, ld: str, lag: int, col: str = "k", m: int | None = None, sums: str = "gs",
         buffer: int | None = None, first_only: bool = False, xh: str | None = None) -> str:
    """Phase p's GEMM on tensor cores over x (a frame array's pointer and row-stride arguments, read at `lag`):
    x's column `col` (an expression of k, the GEMM's column) against m·nu weight rows from offset `off` (an
    expression; m: p.m), the sums into `sums` (gs, or an offset into it). A head-wise phase's x columns are its
    head's (heads.head_mma). buffer: x is already staged (stage_at_once), in that buffer of xs; first_only: staged
    at a launch's first frame only (the frames after write it into xs themselves: heads.handed_on); xh: x's tagged
    half words (stage_slice)."""
    KP, KS = padded(p.width), lay.ks[id(p)]
    slices = -(-KP // KS)
    stage = ""                              # already staged (buffer), else staged here and waited for
    if buffer is None:
        stage = "\n" + stage_slice(p, lay, x, ld, lag, col, True, xh)
        if first_only:
            stage = "\n                if (s == 0) {" + stage + "\n                }"
        stage += "\n                __syncthreads();"
    return GEMM.format(m=p.m if m is None else m, MT=lay.x_rows // 16, TPW=lay.tiles_per_warp, KP=KP, KS=KS,
                       UNROLL=slices if slices <= UNROLLED_SLICES else 1, XLD=lay.xld, WLD=lay.wld(p.width), woff=off,
                       stage=stage, gs=sums, E=4 // lay.itemsize, a=", ".join(map(lay.rounded, A_WORDS)), mma=lay.mma,
                       xoff=f" + {buffer * lay.x_rows * lay.xld}" if buffer else "")


def helpers(ctype: str, split: bool = False) -> str:
    """The MMA's helpers for storage type ctype (PTX_TYPE's keys), with 3xTF32's where split."""
    ptx = PTX_TYPE[ctype]
    return (HELPERS.format(ptx=ptx, k=K_STEP[ptx]) + staging.HELPERS + (TF32 if ptx == "tf32" else "") +
            (SPLIT if split else ""))
