"""The head-wise GEMM phases of a persistent kernel: where their rows and x columns lie (phases.py says which
phases are head-wise and whether each block owns whole heads; kernels.py puts the lines in place).

A head-wise GEMM of k heads merging J linear ops holds, per unit, J rows (row q = j·nu + u: linear op j, the
block's unit u) of one head's width RW (phase.width) in shared memory:
  gemm / pair  unit f (a feature of every merged linear op, each of F = phase.units features and k heads of
               F/k) holds W_j's row f, [K/k]; it reads x's columns of its head h = f / (F/k): h·K/k + i;
  dgemm        unit c (an operand column, head h = c / (K/k), i = c mod K/k) holds W_j[h][:, i], [F/k], and
               reads the output gradient's columns F·j + h·F/k + o; the J sums are added to the old value
               one linear op at a time (each rounded where storage is half), as the reference's batched GEMM
               a linear op does.
x is staged head by head, SW columns a head (a gemm's K/k; a dgemm's J·F/k, linear op by linear op), the
block's own heads where it owns whole heads (h0 its first), else all of them. Where a block owns whole heads,
each thread computes whole sums (HEAD_THREAD_GEMV: a weight row against one or a few x rows over K, the rows
padded apart in shared memory, or in the thread's registers for the whole call where resident() says so); where
heads split over blocks, a warp a row with the shared shuffle tree (gemv.py).

On tensor cores (half storage, B > MAX_ROWS, or fewer rows where asked) a block owns one head (one_head): a gemm's
or pair's J·nu rows all read that head's K/k columns of x, one MMA GEMM (mma.py); a dgemm runs J of them, linear
op j's nu rows against its F/k columns of the output gradient, each into its own sums.
"""
from __future__ import annotations

from ..source import HALF_TYPES, math_type
from . import mma, staging
from .gemv import row_sums
from .phases import THREADS, block_units

RESIDENT_WIDTH = 64         # the widest weight row a thread holds in registers (64 floats of its 128 at 512 threads)

HEAD_STAGE = r"""
        {first}for (int e = tid; e < NB * {XW}; e += NT) {{
            const int b = e / {XW}, r = e - b * {XW}, h = {h0} + r / {SW}, i = r - (r / {SW}) * {SW};
            {stage}
        }}"""
HEAD_GEMV = HEAD_STAGE + r"""
        __syncthreads();"""


THREAD_SUMS = r"""
        {{  // a thread R = {R} sums (weight row q, x rows b ... b + R - 1) of the nq = nu·m rows of one head each, the
            // row's weights loaded once for all R: K in four running sums each, added in a fixed order (no shuffles,
            // no atomics); rows RS apart, so a warp's rows hit distinct banks
            const int nq = nu * {m};
            {rows}
                const int q = e / (NB / {R}), b = (e - q * (NB / {R})) * {R};{wrow}
                const CT* x = xs + b * {XW} + {xoff};
                CT a[{R}][4] = {{}};
                {unroll}for (int k = 0; k < {K4}; k += 4) {{
                    {wload}
                    #pragma unroll
                    for (int r = 0; r < {R}; ++r) {{
                        {xload}
                        a[r][0] += x0 * w0; a[r][1] += x1 * w1; a[r][2] += x2 * w2; a[r][3] += x3 * w3;
                    }}
                }}{rest}
                #pragma unroll
                for (int r = 0; r < {R}; ++r) gs[q * NB + b + r] = (a[r][0] + a[r][1]) + (a[r][2] + a[r][3]);
            }}
        }}"""
HEAD_THREAD_GEMV = HEAD_GEMV + THREAD_SUMS + r"""
        __syncthreads();"""


def rows_a_thread(p, G: int, B: int) -> int:
    """The x rows each thread of a block owning whole heads sums against one weight row (HEAD_THREAD_GEMV): the most,
    of 4, 2 and 1, that divide the block's B rows and still give at least half the block's threads a row (the
    row's weights are loaded and converted once for all of them; sLSTM in heads of 64 at 2 rows a block: 256
    threads of 512 each two sums)."""
    nq = -(-p.units // G) * p.m
    return next(r for r in (4, 2, 1) if r == 1 or B % r == 0 and nq * (B // r) >= THREADS // 2)


def row_stride(width: int, itemsize: int) -> int:
    """The shared-memory stride (elements) of a per-head block's weight rows on CUDA cores (HEAD_THREAD_GEMV): the
    width padded so that a warp's consecutive rows start in distinct banks (an odd count of 4-byte words; 8-byte
    elements an odd count of elements)."""
    s = width
    while (s % 2 == 1) if itemsize == 2 else (s % 2 == 0):
        s += 1
    while itemsize == 2 and (s // 2) % 2 == 0:
        s += 2
    return s


def head_thread_gemv(p, woff: int, x: str, ld: str, xw: int, stride: int, st: str, rows: int = 1,
                     kept: bool = False, resident: bool = False) -> str:
    """The GEMV of head-wise phase p in a block owning whole heads, a thread `rows` sums (HEAD_THREAD_GEMV;
    rows_a_thread): x staged as head_gemv stages it, the block's weight rows `stride` apart; kept: x stays in shared
    memory from the frame before (handed_on), staged from memory only at a launch's first frame; resident: the
    thread's one weight row is in registers (resident_rows), not read from shared memory each frame."""
    return HEAD_THREAD_GEMV.format(**_thread_gemv(p, woff, x, ld, xw, stride, st, rows, resident),
                                   first="if (s == 0) " if kept else "")


def head_thread_parts(p, woff: int, x: str, ld: str, xw: int, stride: int, st: str, rows: int,
                      resident: bool) -> tuple:
    """(x's staging, the sums) of head_thread_gemv apart, without barriers, for warp roles (roles.py)."""
    fields = _thread_gemv(p, woff, x, ld, xw, stride, st, rows, resident)
    return HEAD_STAGE.format(**fields, first=""), THREAD_SUMS.format(**fields)


def _thread_gemv(p, woff: int, x: str, ld: str, xw: int, stride: int, st: str, rows: int, resident: bool) -> dict:
    """The fields of HEAD_THREAD_GEMV but `first`."""
    stage, xoff = _staging(p, x, ld, True)
    k4 = p.width // 4 * 4
    w = f"wr{woff}" if resident else "w"     # resident: one (row, rows) a thread, the loop over k unrolled
    wload, xload = _row_loads(p, xw, stride, st, w if resident else None)
    rest = "".join(f"\n                {{ const CT wk = {w}[{k}];\n                  #pragma unroll\n"
                   f"                  for (int r = 0; r < {rows}; ++r) a[r][{j}] += x[r * {xw} + {k}] * wk; }}"
                   for j, k in enumerate(range(k4, p.width)))
    return dict(
        XW=xw, SW=p.head_width, stage=stage, h0=f"(u0 / {per_unit(p)})", m=p.m, xoff=xoff, K4=k4, rest=rest, R=rows,
        wload=wload, xload=xload,
        rows=(f"if (tid < nq * (NB / {rows})) {{\n                const int e = tid;" if resident else
              f"for (int e = tid; e < nq * (NB / {rows}); e += NT) {{"),
        wrow="" if resident else f"\n                const ST* w = sw + {woff} + q * {stride};",
        unroll="#pragma unroll\n                " if resident else "")


def resident(p, G: int, B: int, rows: int, gemms: int, ctype: str) -> bool:
    """Whether HEAD_THREAD_GEMV holds phase p's weights in registers for the whole sequence (resident_rows loads
    them), where each thread has one weight row and computes in float: p the kernel's only GEMM phase (of `gemms`),
    of width ≤ RESIDENT_WIDTH, at most two x rows a thread. A frame's step then loads x alone from shared memory."""
    nq = -(-p.units // G) * p.m
    return (gemms == 1 and math_type(ctype) == "float" and p.width <= RESIDENT_WIDTH and rows <= 2
            and nq * (B // rows) <= THREADS)


def resident_rows(p, woff: int, rows: int, src: str) -> str:
    """The declaration, before the time loop, of a thread's weight row of phase p in registers (resident): row
    q = j·nu + u of the block's rows (src: that row's element k in memory, heads.head_weight), zeros past them."""
    return (f"    CT wr{woff}[{p.width}];     // this thread's weight row, for every frame (HEAD_THREAD_GEMV)\n"
            f"    {{   {block_units(p.units)}\n"
            f"        const int q = tid / (NB / {rows}), j = q / nu, u = q - j * nu;\n"
            f"        const bool mine = tid < nu * {p.m} * (NB / {rows});\n"
            f"        (void)j; (void)u;\n"
            f"        #pragma unroll\n"
            f"        for (int k = 0; k < {p.width}; ++k) wr{woff}[k] = mine ? (CT){src} : (CT)0;\n    }}")


def _row_loads(p, xw: int, stride: int, st: str, registers: str | None = None) -> tuple:
    """The lines of HEAD_THREAD_GEMV's step over four columns k ... k + 3 loading weights w0 ... w3 and one x row's
    x0 ... x3: the weights from the array `registers` where they are resident, else a shared-memory load a pair of
    half weights (rows and offsets even); one load for the four float x columns where every staged row and head
    starts 16 bytes apart; else one load an element. The shared-memory pipe issues a load an instruction, and at
    two rows a thread the scalar loads were 12 of its 20 instructions."""
    if registers:
        wload = "const CT w0 = {0}[k], w1 = {0}[k + 1], w2 = {0}[k + 2], w3 = {0}[k + 3];".format(registers)
    elif st in HALF_TYPES and stride % 2 == 0:
        wload = "float w0, w1, w2, w3;\n                    rg_pair(w + k, w0, w1); rg_pair(w + k + 2, w2, w3);"
    else:
        wload = "const CT w0 = w[k], w1 = w[k + 1], w2 = w[k + 2], w3 = w[k + 3];"
    if math_type(st) == "float" and xw % 4 == 0 and p.head_width % 4 == 0 and p.width % 4 == 0:
        xload = (f"const float4 xv = *(const float4*)(x + r * {xw} + k);\n"
                 "                        const float x0 = xv.x, x1 = xv.y, x2 = xv.z, x3 = xv.w;")
    else:
        xload = (f"const CT* xr = x + r * {xw} + k;\n"
                 "                        const CT x0 = xr[0], x1 = xr[1], x2 = xr[2], x3 = xr[3];")
    return wload, xload


def _staging(p, x: str, ld: str, apart: bool) -> tuple:
    """(the line staging element (b, h, i) of x, the offset in a staged row of row q's head and linear op)."""
    h0 = f"(u0 / {per_unit(p)})" if apart else "0"
    xoff = f"(((u0 + q % nu) / {per_unit(p)}) - {h0}) * {p.head_width}"
    if p.kind == "dgemm":
        F, fh = p.item.sizes[0], p.width
        return f"xs[e] = AT({x}, {ld}, 0, {F} * (i / {fh}) + h * {fh} + i % {fh});", xoff + f" + (q / nu) * {fh}"
    it = p.item.gemm if p.kind == "pair" else p.item
    return f"xs[e] = AT({x}, {ld}, {it.delay}, h * {p.width} + i);", xoff


def per_unit(p) -> int:
    """Units per head: F/k output features of a gemm or pair, K/k operand columns of a dgemm."""
    return p.units // p.heads


def head_gemv(p, woff: int, x: str, ld: str, xw: int, apart: bool) -> str:
    """The GEMV of a head-wise phase p: x (a frame array's pointer and its row stride ld, read at the GEMM's delay;
    a dgemm's output gradient) staged head by head, xw columns a row, then each row over its head's columns."""
    sw, h0 = p.head_width, f"(u0 / {per_unit(p)})" if apart else "0"
    stage, xoff = _staging(p, x, ld, apart)
    xdecl = f"\n                const CT* x = xs + {xoff};     // the staged columns of row q's head (and linear op)"
    return HEAD_GEMV.format(XW=xw, SW=sw, stage=stage, h0=h0, first="") + row_sums(p.m, woff, p.width, xw, "x", xdecl,
                                                                          " of one head each", "row")


def head_weight(p, w: str) -> str:
    """The element of the packed head-wise weights w [ΣF, K/k] at row q, column k of phase p's block in shared
    memory (q = j·nu + u for a gemm or pair: linear op j's row u0 + u; a dgemm's row q: operand column u0 + q)."""
    if p.kind == "dgemm":           # W_j[h][k, i] of operand column c = u0 + u, h = c / (K/k), i = c mod K/k
        F, fh, kh = p.item.sizes[0], p.width, per_unit(p)
        return f"{w}[(long long)({F} * j + ((u0 + u) / {kh}) * {fh} + k) * {kh} + (u0 + u) % {kh}]"
    return f"{w}[(long long)({p.units} * j + u0 + u) * {p.width} + k]"


def one_head(groups, G: int) -> bool:
    """Whether each of G blocks owns exactly one head of every head-wise GEMM phase (tensor cores need it)."""
    return all(p.heads == G for g in groups for p in g if p.kind in ("gemm", "pair", "dgemm"))


def head_mma(p, woff: int, lay, x: str, ld: str, kept: bool = False) -> str:
    """The tensor-core GEMM of a head-wise phase p whose block owns one head, h = u0 / (units a head), on x (a
    frame array's pointer and row stride: the operand, or a dgemm's output gradient); kept: x stays in shared
    memory from the frame before (handed_on), staged from x only at a launch's first frame."""
    h = f"(u0 / {per_unit(p)})"
    if p.kind != "dgemm":
        it = p.item.gemm if p.kind == "pair" else p.item
        return mma.gemm(p, woff, lay, x, ld, it.delay, col=f"{h} * {p.width} + k", first_only=kept)
    F, WLD = p.item.sizes[0], lay.wld(p.width)
    cols = [f"{F * j} + {h} * {p.width} + k" for j in range(p.m)]
    at_once = lay.x_buffers >= p.m          # every linear op's slice staged before the first GEMM
    head = staging.stage_at_once(p, lay, x, ld, cols) if at_once else ""
    return head + "".join(mma.gemm(p, f"{woff} + {j} * nu * {WLD}", lay, x, ld, 0, col=cols[j], m=1,
                                   sums=f"(gs + {j} * nu * NB)", buffer=j if at_once else None) for j in range(p.m))


def handed_on(groups, lay=None):
    """In a kernel whose blocks own whole heads, the pair phase whose fused body writes its own GEMM's operand, read
    one frame back, where it is the kernel's only GEMM, a head's operand columns are its units and, on tensor cores
    (lay), x is staged in one slice (sLSTM's and the multi-head LSTM's forward: h): its body also writes that
    operand into the staged rows (shared memory), which the next frame's GEMM reads as they are, so x leaves
    shared memory only at a launch's first frame. Else None."""
    gemms = [p for g in groups for p in g if p.kind in ("gemm", "pair", "dgemm")]
    if len(gemms) != 1 or gemms[0].kind != "pair" or gemms[0].heads == 1:
        return None
    p = gemms[0]
    it = p.item.gemm
    whole = p.width == per_unit(p) and (lay is None or lay.ks[id(p)] == mma.padded(p.width))
    return p if whole and it.delay == 1 and it.operand in p.item.fused.nodes else None
