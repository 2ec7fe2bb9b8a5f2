"""CUDA source of loop strategy 'persistent': one cooperative kernel runs the whole time loop of the
core, forward or backward, with the per-frame GEMMs' weights held in shared memory; phases.py
decides the phases, barriers and layout.

G blocks (at most one per SM, all resident: a cooperative launch) of NT threads. A GEMM phase's block
loads its weight rows (dgemm: columns) into shared memory once, before frame 0; per frame it stages
x's B rows in shared memory, warps sum its weight rows over K (lanes strided, a row's K split in
slices where the block has fewer rows than warps) and reduce by a fixed shuffle tree, then add the
slices in order (no atomics: runs are bit for bit reproducible), and it writes its outputs. Phases are
separated by a grid barrier (an atomic counter), except before a fused or dfused phase whose block only
reads what it wrote itself since the last one, and in a forward of GEMM phases only computed in
float32 (float32 or half storage), where each x value travels with its frame's tag in one 64-bit word
(a half value as stored, rounded) and the staging spins on the words it needs: LSTM's forward then
needs no barrier, its backward one a frame (before the dgemm). On tensor cores in half storage a value travels as
stored in a 32-bit word above a 16-bit tag, the staging loading four at once (staging.STAGE_TAGGED), from the launch's
third frame on (barriers before it). Weights sit in shared memory in their
storage type (half: twice float32's rows); x rows and sums in the math type. Where every block owns whole
heads (phases.per_head: head-wise GEMMs, G dividing their heads) it reads only what it wrote itself, so the
source (HEAD_SOURCE) has no grid barrier and no tagged word, and the launch is an ordinary one; the
head-wise GEMV is heads.py's. Any kernel may also split the rows over blocks (row groups: sequences never
read one another), G blocks a group, block k the units (or heads) of k mod G and its group's rows; a group's
blocks wait only for one another, at their own barrier count (bar[1 + group]; bar[0] numbers the launches).

The backward's barrier before the dgemm stays a grid barrier: each block flagging its frame once its columns are
written, the dgemm then waiting for its group's flags, measured slower on an H200 (bfloat16 LSTM, T = 1024, B = 16,
H = 768, training ms, alternating in one process): 7.03 with the barrier, 7.60 waiting for every flag and 8.83
copying each block's columns as its flag comes; the barrier spinning on relaxed loads with a fence after, 7.32.
Waiting for every flag ran the MGU, two barriers a frame, faster (10.58 against 11.19), GRU slower (6.91 / 6.78).
The GEMMs after the backward run beside it on a side stream, span by span as it walks frames, measured slower but for
the LSTM at B = 16 (bfloat16, H = 768, ms after / beside): LSTM B = 16 7.24 / 7.09, GRU 6.81 / 7.00, B = 32 (T = 300)
LSTM 3.43 / 3.82, GRU 2.98 / 3.35; their memory traffic slows the loop more than they save.

Arrays are addressed by frame as in ../scan.py: element (t, b, f) of a node's [P+T, B, F]
buffer (row stride ld; a vector parameter has ld = 0) is p[((P + t - delay)·B + b)·ld + f].
"""
from __future__ import annotations

from dataclasses import dataclass

from .....errors import RnnGraphError
from ..source import CTYPES, kernel_name, math_type, rounded
from . import mma, staging, sums
from .elements import epilogue, ld_arg, prefetch
from .heads import (handed_on, head_mma, head_thread_gemv, head_thread_parts, one_head, resident, resident_rows,
                    row_stride, rows_a_thread)
from .operands import full_gemv, head_w, head_x, load_weights, operand, phase_head_gemv
from .resident import fragments, resident_gemm
from .phases import (MAX_ROWS, THREADS, barriers, block_units, exchanges, loop_heads, nodes_of, own, per_head, phases,
                     shared_layout, sources, staged)
from .roles import (ROLES_SYNC, STAGE_DEFINE, element_inputs, mma_parts, roles_body, tensor_core_warps,
                    warp_roles)

AT_DEFINE = r"""
#define AT(p, ld, lag, col) p[((long long)(P + t - (lag)) * NB + b) * (ld) + (col)]
"""
SYNC = r"""static __device__ __forceinline__ void grid_barrier(unsigned int* count, unsigned int target) {{
    // every block's thread 0 arrives with a release add (after the block's writes: bar.sync orders them),
    // then spins with acquire loads until all G have arrived; bar.sync hands that on to the block
    __syncthreads();
    if (threadIdx.x == 0) {{
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(count) : "memory");
        unsigned int seen;
        do {{ asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory"); }} while (seen < target);
    }}
    __syncthreads();
}}
static __device__ __forceinline__ CT exchanged(const unsigned long long* w, unsigned int tag) {{
    // a float written with its frame's tag in one 64-bit word: spin until the word carries `tag`
    unsigned long long v;
    do {{ asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(w) : "memory"); }} while ((unsigned int)(v >> 32) != tag);
    return __uint_as_float((unsigned int)v);
}}
static __device__ __forceinline__ void exchange(unsigned long long* w, unsigned int tag, CT x) {{
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(w), "l"(((unsigned long long)tag << 32) | __float_as_uint(x)) : "memory");
}}
"""
KERNEL_HEAD = r"""extern "C" __global__ void __launch_bounds__(NT, 1) {name}(unsigned int* bar, {args}const long long* __restrict__ run, int tab, int T, int P) {{
    const int NF = run ? (int)run[tab + 3 * run[0] + 1] : T;     // frames to walk: a chunk's n (run/cursor.py)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    ST* sw = (ST*)smem_raw;         // the GEMM phases' weight rows, as stored (half storage: twice as many fit)
    CT* smem = (CT*)(smem_raw + W_BYTES);
    CT* xs = smem + XS_OFF;         // a GEMM phase's operand rows [NB, K]
    CT* gs = smem + GS_OFF;         // its sums [rows of the block, NB]
    CT* gp = smem + GP_OFF;         // their partial sums [(row, slice), NB]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, blk = blockIdx.x;
"""
SYNC_VARS = r"""    unsigned int barriers = 0;      // the barriers passed: the group's count counts G arrivals each (zeroed before launch)
    unsigned int* count = bar + 1 + blockIdx.x / G;     // the row group's barrier count (one group: bar[1])
    const unsigned int tags = bar[0] * (unsigned int)(T + 1) + 1;   // exchanged words of frame t carry tags + t
    (void)tags; (void)count;
"""
BODY = r"""{load}
    __syncthreads();
{prologue}
    for (int s = 0; s < NF; ++s) {{
        const int t = {frame};
{phases}
    }}
{after}}}
"""
# rows split over blocks (row groups): a frame holds BT rows, the block's NB start at b0
ROWS_AT_DEFINE = r"""
#define AT(p, ld, lag, col) p[((long long)(P + t - (lag)) * BT + b0 + b) * (ld) + (col)]
"""
ROWS_BLOCK = ", blk = blockIdx.x % G, b0 = (blockIdx.x / G) * NB;"
SOURCE = AT_DEFINE + SYNC + KERNEL_HEAD + SYNC_VARS + BODY
# per head: no block waits for another, so no barrier or tagged word, and an ordinary launch
HEAD_SOURCE = AT_DEFINE + KERNEL_HEAD + "    (void)bar;\n" + BODY
# ... in warp roles (roles.py)
ROLES_SOURCE = AT_DEFINE + ROLES_SYNC + STAGE_DEFINE + KERNEL_HEAD + "    (void)bar;\n{roles}"

ZERO_SOURCE = r"""
extern "C" __global__ void rg_persist_zero(unsigned int* bar, int groups) {
    bar[0] += 1u;
    for (int g = 0; g < groups; ++g) bar[1 + g] = 0u;
}
"""   # before each launch: a new launch number for the exchanged words' tags, each row group's barrier count from 0

ITEMSIZE = {ct: 8 if ct == "double" else 2 if math_type(ct) != ct else 4 for ct in CTYPES.values()}


@dataclass(frozen=True)
class Persistent:
    """A generated persistent kernel: its name, source, arguments and launch shape."""
    name: str
    source: str
    args: tuple         # ("val" | "grad", node), ("cat" | "dcat" | "w", Gemm): a frame array's pointer and
                        # row stride, or ("w", ...) the packed weights' pointer alone, in the kernel's order
    blocks: int
    threads: int
    smem: int           # dynamic shared memory bytes
    cooperative: bool = True    # False per head: no block waits for another, an ordinary launch
    tensor_cores: bool = False  # its GEMMs on tensor cores (mma.py)
    row_groups: int = 1         # the groups of rows its blocks split B into, each with its own barrier count
    resident: bool = False      # every GEMM's weights in registers (resident.py)
    split: bool = False         # float32 on tensor cores in 3xTF32 (mma.SPLIT), not TF32
    static_smem: int = 0        # static shared memory bytes (the bulk copies' mbarrier, staging.BULK_INIT)
    sums: tuple = ()            # ((fused group, parameter), its first column in part): the gradients it sums (sums.py)
    sum_columns: int = 0        # part's columns ([B, sum_columns], the math type; argument ("sums", "part"))

    @property
    def shared(self) -> int:
        """The shared memory a block needs, dynamic and static."""
        return self.smem + self.static_smem


def persistent_kernel(cell, loop, ctype: str, B: int, G: int, row_groups: int = 1,
                      tensor_cores: bool | None = None, split: bool = False) -> Persistent:
    """The kernel running `loop` (a PersistentLoop; problem() is None) for B ≤ MAX_ROWS rows on G blocks, or
    in half storage up to mma.MMA_ROWS on tensor cores (mma.py; head-wise GEMMs one head a block, heads.py):
    tensor_cores None takes them beyond MAX_ROWS rows (and in warp roles, roles.tensor_core_warps); True (half
    storage; float32 in TF32, or in 3xTF32 where split, full matrices) at any B; False nowhere.
    row_groups > 1: the frames hold B·row_groups rows, and G·row_groups blocks run them, block k the units (or
    heads) of k mod G and rows B·(k div G) on (sequences never read one another), each group's G blocks meeting
    at their own barriers."""
    groups = phases(cell, loop)
    itemsize = ITEMSIZE[math_type(ctype)]
    tc, on_tc = None, B > MAX_ROWS if tensor_cores is None else tensor_cores
    in_float = tensor_cores is True and ctype == "float" and loop_heads(groups) == 1     # asked for, full matrices
    if on_tc and ITEMSIZE[ctype] != 2 and not in_float or split and not in_float:
        raise RnnGraphError("internal: tensor cores take half storage (float32 in TF32 or 3xTF32 where asked, full "
                            "matrices)")
    if on_tc and loop_heads(groups) > 1 and not one_head(groups, G):
        raise RnnGraphError(f"internal: a head-wise persistent kernel on tensor cores runs one head a block, not "
                            f"on {G} blocks")
    if on_tc:                   # tensor cores: their layout of the weights and the x slice
        tc = mma.layout([p for g in groups for p in g if p.kind in ("gemm", "pair", "dgemm")], B, G, THREADS,
                        ITEMSIZE[ctype], split)
        woff, n_w = tc.woff, tc.weights
        xs = -(-tc.x_buffers * tc.x_rows * tc.xld * ITEMSIZE[ctype] // itemsize)
        gs = max((-(-p.units // G) * p.m * B for g in groups for p in g if id(p) in woff), default=0)
        xs_off, gs_off, gp_off, total = 0, xs, xs + gs, xs + gs + max(THREADS // 32 * mma.SUMS, tc.partials)
    else:
        woff, n_w, xs_off, gs_off, gp_off, total = shared_layout(groups, B, G, _stride(groups, G, ctype))
    w_bytes = -(-n_w * ITEMSIZE[ctype] // 16) * 16
    args: dict = {}

    def arg(kind, key):
        return f"pp{args.setdefault((kind, key), len(args))}"

    written = {n: (gi, p) for gi, g in enumerate(groups) for p in g for n in nodes_of(p)}
    apart = per_head(groups, G)     # each block owns whole heads: it reads only what it wrote, after its own sync
    kept = handed_on(groups, tc) if apart else None      # its operand stays in shared memory between frames
    need = [False] * len(groups) if apart else barriers(groups)
    half_words = on_tc and ITEMSIZE[ctype] == 2     # tensor cores in half storage: 32-bit words, 16-bit tags
    swaps = {} if apart or (on_tc or row_groups > 1) and not half_words else \
        exchanges(cell, groups, written, ctype, B, G, half_words)       # group -> operand in tagged words
    need = [n and gi not in swaps for gi, n in enumerate(need)]
    tagged = {u: (arg("xh" if half_words else "xb", u), half_words) for u in swaps.values()}
    # backward: groups before the frame's first barrier read only values (read-only here) and gradients of
    # their own block, so they run at the end of the previous frame's iteration, their loads issued before
    # its barrier (the forward has its barrier first: pair)
    k = next((gi for gi, n in enumerate(need) if n), 0) if loop.reverse else 0
    # ... and in a block owning whole heads (no barriers) on CUDA cores, one group before the first dgemm moves so:
    # its loads for the next frame go before this frame's dgemm, which their wait then overlaps (on tensor cores the
    # registers held across the MMA cost more than the wait: sLSTM's training step at B = 64 took 45% longer)
    first_dgemm = next((gi for gi, g in enumerate(groups) if any(p.kind == "dgemm" for p in g)), 0)
    k = 1 if apart and tc is None and loop.reverse and first_dgemm == 1 else k
    # backward: values are read-only, and where every phase splits the same features, every gradient at
    # feature f is written by f's block alone, so loads of both go before the barrier, except the gradient
    # a dgemm adds into (its own old value aside) while the loads wait
    mine = len({p.units for g in groups for p in g}) == 1
    operands = {p.item.operand for g in groups for p in g if p.kind == "dgemm"}
    # ... and the groups moved to the end of the iteration (before k) issue theirs before the groups from k
    # on run, so not the gradients those add into frames back (rows the moved groups read)
    late = {n for g in groups[k:] for p in g if p.kind == "dfused"
            for kind, n, lag in sources(cell, p.item.nodes, "bwd")[1].values() if kind == "grad" and lag}
    gemms = sum(p.kind in ("gemm", "pair", "dgemm") for g in groups for p in g)
    rows = {id(p): rows_a_thread(p, G, B) for g in groups for p in g}     # x rows a thread sums (whole heads)
    held = {id(p): apart and tc is None and resident(p, G, B, rows[id(p)], gemms, ctype) for g in groups for p in g}
    mw = tensor_core_warps(kept, G, B, ctype) if kept and tensor_cores is not False else None
    roles = warp_roles(kept, G, B, rows[id(kept)], mw) \
        if kept and held[id(kept)] and len(groups) == len(groups[0]) == 1 else None
    load, prologue, body, tail_loads, tail = [], [], [], [], []
    summed, after, cols = [], [], {}    # the parameter sums its dfused phases take (sums.py); register -> columns
    for gi, g in enumerate(groups if roles is None else ()):
        pre, early, per, adds = [], {}, {}, {}
        for pi, p in enumerate(g):      # loads that need no barrier are issued before it
            ok = (lambda kind, n, lag, p=p, gi=gi: kind == "val" or mine and kind == "grad" and (
                p.kind == "dgemm" or n not in operands and (gi >= k or n not in late))) if loop.reverse else \
                (lambda kind, n, lag, p=p, gi=gi: kind == "val" and own(written.get(n), p, lag, gi))
            ok = (lambda *source: True) if apart and gi >= k else ok
            lines, early[pi], per[pi] = prefetch(cell, p, f"r{gi}_{pi}_", arg, ok, G, B)
            pre += lines
            adds[pi] = [] if apart else sums.phase_sums(cell, p, ctype, per[pi], G, B, summed, cols, load, after)
        lag = operand(g[0], arg)[2] if gi in swaps else 0
        run = (["        grid_barrier(count, ++barriers * G);"] if need[gi] else
               [f"        if (t - {lag} < 2) grid_barrier(count, ++barriers * G);   // tagged words from frame 2 on"]
               if gi in swaps and half_words else []) + \
            [ln for pi, p in enumerate(g) for ln in _phase_lines(cell, p, arg, early[pi], woff.get(id(p)), load,
                                                                    tagged.get(swaps.get(gi)), tagged, ctype,
                                                                    staged(p, G, apart), apart, tc, per[pi],
                                                                    p is kept, rows[id(p)], held[id(p)], adds[pi])]
        if gi < k:
            prologue += pre + run
            tail_loads += pre
            tail += run
        else:
            body += pre + run
    if k:
        nxt = "        if (s + 1 < NF) {{\n        const int t = NF - 2 - s;\n{}\n        }}"
        decl = [ln for ln in tail_loads if ln.lstrip().startswith("ST ")]
        body = decl + [nxt.format("\n".join(ln for ln in tail_loads if ln not in decl))] + body + [nxt.format("\n".join(tail))]
        prologue = ["    {\n    const int t = NF - 1;"] + prologue + ["    }"]
    source, defs = HEAD_SOURCE if apart else SOURCE, {}
    if roles:
        defs, text, more = _in_roles(cell, kept, roles, arg, woff[id(kept)], ctype, G, B, rows[id(kept)], total,
                                     mw)
        source = ROLES_SOURCE.replace("{roles}", text.replace("{", "{{").replace("}", "}}"))
        total += more
    width = sum(w for _, w in cols.values())
    if summed:      # each thread's sums stored once, after its last frame, into part [B·row_groups, width]
        part, row = arg("sums", "part"), "b0 + " if row_groups > 1 else ""
        after = [sums.stores(p, pairs, n, part, width, row) for p, pairs, n in after]
    names = list(args)
    ptr = {"w": "ST* pp{}, ", "xb": "unsigned long long* pp{}, ", "xh": "unsigned int* pp{}, ", "sums": "CT* pp{}, "}
    sig = "".join(ptr.get(kind, "ST* pp{0}, long long ld{0}, ").format(k) for k, (kind, _) in enumerate(names))
    defs = {"ST": ctype, "CT": math_type(ctype), "NB": B, "G": G, "NT": THREADS, "W_BYTES": w_bytes,
            "XS_OFF": xs_off, "GS_OFF": gs_off, "GP_OFF": gp_off, **defs}
    if swaps and half_words:        # a tagged word [2, rows, F]: frame parity `slot`, the block's row b, column col
        at = "BT + b0 + b" if row_groups > 1 else "NB + b"
        defs["XAT(p, slot, col, F)"] = f"p[((long long)(slot) * {at}) * (F) + (col)]"
    if row_groups > 1:
        defs["BT"] = B * row_groups
        source = ROWS_AT_DEFINE + source[len(AT_DEFINE):].replace(", blk = blockIdx.x;", ROWS_BLOCK, 1)
    on_mma = tc is not None or bool(roles and mw)
    text = "".join(f"#define {k} {v}\n" for k, v in defs.items()) + (mma.helpers(ctype, split) if on_mma else "") + \
        source.format(
        name="{name}", args=sig, load="\n".join(dict.fromkeys(load)), prologue="\n".join(prologue), phases="\n".join(body),
        frame="NF - 1 - s" if loop.reverse else "s", after="".join(ln + "\n" for ln in after))
    name = kernel_name("persist", text)
    return Persistent(name, text.replace("{name}", name), tuple(names), G * row_groups, THREADS,
                      w_bytes + total * itemsize, cooperative=not apart, tensor_cores=on_mma,
                      row_groups=row_groups, resident=bool(tc and tc.resident and len(tc.resident) == len(tc.woff)),
                      split=split, static_smem=staging.BULK_SHARED if staging.BULK_INIT in load else 0,
                      sums=tuple((u, cols[r][0]) for u, r in summed), sum_columns=width)


def _phase_lines(cell, p, arg, early: dict, woff, load: list, xb, tagged: dict, st: str, xw: int,
                 apart: bool, tc=None, per: int = 1, kept: bool = False, rows: int = 1, res: bool = False,
                 adds=()) -> list:
    """The lines running phase p at frame t (its GEMV first, with its weights' load added to `load`; its x
    from tagged words where xb names their buffer (its argument, whether half words: on tensor cores); its members
    in `tagged` also written so; a head-wise
    GEMV staging xw columns, the block's own heads where it owns whole heads, `apart`); tc: the tensor
    cores' layout (mma.Layout), where they run the GEMMs; per: the elements a thread holds in registers loaded
    early (elements.prefetch), where more than one; kept: its operand stays in shared memory (heads.handed_on);
    rows: the x rows a thread sums against one weight row where each block owns whole heads (heads.rows_a_thread);
    res: each thread holds its weight row in registers (heads.resident)."""
    out = [f"        {{   // {p.kind} {', '.join(nodes_of(p))}",
           f"        {block_units(p.units)}"]
    if woff is not None and tc is not None and p.heads > 1:
        x = head_x(p, arg)
        load.append(mma.weights(p, woff, head_w(p, arg), tc))
        out.append(head_mma(p, woff, tc, x, ld_arg(x), kept))
    elif woff is not None and tc is not None and id(p) in tc.resident:     # its weights in registers
        src, x, lag = operand(p, arg)
        load.append(fragments(p, src, tc))
        out.append(resident_gemm(p, tc, x, ld_arg(x), lag, xb and xb[0]))
    elif woff is not None and tc is not None:
        src, x, lag = operand(p, arg)
        load.append(mma.weights(p, woff, src, tc))
        out.append(mma.gemm(p, woff, tc, x, ld_arg(x), lag, xh=xb and xb[0]))
    elif woff is not None and p.heads > 1 and apart:     # a thread whole sums, the rows padded apart
        x, rs = head_x(p, arg), row_stride(p.width, ITEMSIZE[st])
        load.append(resident_rows(p, woff, rows, head_w(p, arg))
                    if res else load_weights(p, woff, arg, rs))
        out.append(head_thread_gemv(p, woff, x, ld_arg(x), xw, rs, st, rows, kept, res))
    elif woff is not None:
        load.append(load_weights(p, woff, arg))
        out.append(full_gemv(p, woff, arg, xb and xb[0]) if p.heads == 1 else
                   phase_head_gemv(p, woff, arg, xw, apart))
    if any("rg_bulk_wait(" in ln for ln in out):      # staged in bulk copies: the block's mbarrier, made once
        load.append(staging.BULK_INIT)
    xs = _handing_on(p, xw, st, tc and tc.xld) if kept else None
    return out + epilogue(cell, p, arg, early, tagged, st, per, xs, last=adds) + ["        __syncthreads();\n        }"]


def _handing_on(p, xw: int, st: str, xld=None) -> str:
    """The line of a handed-on pair's body (heads.handed_on) writing its GEMM's operand, as stored, into the staged
    rows of x, where the next frame's GEMM reads it: in the math type xw apart, or as stored xld apart where the
    GEMM runs on tensor cores."""
    v = f"v{p.item.fused.nodes.index(p.item.gemm.operand)}"
    return f"((ST*)xs)[b * {xld} + u] = {v};" if xld else f"xs[b * {xw} + u] = {rounded(v, st)};"


def _in_roles(cell, p, roles: tuple, arg, woff: int, st: str, G: int, B: int, rows: int, total: int,
              mw: int | None) -> tuple:
    """({#define: value}, the body after KERNEL_HEAD, the math-type elements of shared memory it adds after `total`)
    of the forward whose only phase is the handed-on pair p, its weights resident, in warp roles (MT, ET)
    (roles.py), the GEMM on mw warps' tensor cores where mw is given."""
    sets, inputs = element_inputs(cell, p, arg)
    x, xw = head_x(p, arg), staged(p, G, True)
    if mw:
        more, load, stage, gemm_sums = mma_parts(p, G, mw, head_w(p, arg), x, ld_arg(x))
    else:
        more, load = {}, resident_rows(p, woff, rows, head_w(p, arg))
        stage, gemm_sums = head_thread_parts(p, woff, x, ld_arg(x), xw, row_stride(p.width, ITEMSIZE[st]), st, rows,
                                             True)
    frames = [epilogue(cell, p, arg, early, {}, st, 1, _handing_on(p, xw, st, mw and "XLD"), arrive, inputs["carry"])
              for early, arrive in zip(sets, inputs["arrive"])]
    defs, text, extra = roles_body(p, roles, load, stage, gemm_sums, inputs, frames, total, ITEMSIZE[st],
                                   ITEMSIZE[math_type(st)])
    return {**defs, **more}, text, extra


def _stride(groups, G: int, ctype: str):
    """The row stride of each GEMM phase's weights in shared memory on CUDA cores: padded (heads.row_stride) where
    each block owns whole heads (heads.head_thread_gemv), else the width."""
    return (lambda p: row_stride(p.width, ITEMSIZE[ctype])) if per_head(groups, G) else (lambda p: p.width)
