"""CUDA source of loop strategy 'persistent': one cooperative kernel runs the whole time loop of the
core, forward or backward, with the per-frame GEMMs' weights held in shared memory. Pure strings:
this module runs without a GPU.

G blocks (at most one per SM, all resident: a cooperative launch) of NT threads. The loop's items
become phases, each split over the blocks by units, contiguous and balanced (block k owns units
[U·k/G, U·(k+1)/G)):
  gemm    a per-frame GEMM out = x · Wᵀ: units are its output columns;
  pair    a GEMM and the fused group reading it: units are the group's features (each one's column
          in every merged block of the GEMM), then the group's body for them;
  dgemm   d operand += g · W: units are the operand's columns (the block holds W's columns);
  fused / dfused  a fused group's forward or backward body: units are its features.
A GEMM phase's block loads its weight rows (dgemm: columns) into shared memory once, before frame
0; per frame it stages x's B rows in shared memory, one warp per weight row sums lane-strided over
K and reduces by a fixed shuffle tree (no atomics: runs are bit for bit reproducible), and writes
its outputs. Phases are separated by a grid barrier (an atomic counter: the cooperative launch
guarantees that all blocks are resident), except before a fused or dfused phase whose
block only reads what it wrote itself since the last barrier (same units, elementwise): LSTM's
forward needs one barrier per frame (before the pair), its backward one (before the dgemm).

Arrays are addressed by frame as in loop_kernels.py: element (t, b, f) of a node's [P+T, B, F]
buffer (row stride ld; a vector parameter has ld = 0) is p[((P + t - delay)·B + b)·ld + f].
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.ops import KERNEL, REDUCE, OpKind
from ..plan.items import Fused, FusedGrad, Gemm, GemmGrad, Pair
from .kernels import fused_backward_kernel, fused_forward_kernel, kernel_name

THREADS = 512               # threads per block: 16 warps, one weight row each at a time
MAX_ROWS = 8                # the batch rows a persistent kernel takes (its accumulators live in registers)

SOURCE = r"""
#define AT(p, ld, lag, col) p[((long long)(P + t - (lag)) * NB + b) * (ld) + (col)]
static __device__ __forceinline__ void grid_barrier(unsigned int* count, unsigned int target) {{
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
extern "C" __global__ void __launch_bounds__(NT, 1) {name}(unsigned int* bar, {args}int T, int P) {{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    CT* smem = (CT*)smem_raw;
    CT* xs = smem + XS_OFF;         // a GEMM phase's operand rows [NB, K]
    CT* gs = smem + GS_OFF;         // its sums [rows of the block, NB]
    CT* gp = smem + GP_OFF;         // their partial sums [(row, slice), NB]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, blk = blockIdx.x;
    unsigned int barriers = 0;      // the grid barriers passed: *bar counts G arrivals each (zeroed before launch)
    const unsigned int tags = bar[1] * (unsigned int)(T + 1) + 1;   // exchanged words of frame t carry tags + t
    (void)tags;
{load}
    __syncthreads();
{prologue}
    for (int s = 0; s < T; ++s) {{
        const int t = {frame};
{phases}
    }}
}}
"""

ZERO_SOURCE = r"""
extern "C" __global__ void rg_persist_zero(unsigned int* bar) { bar[0] = 0u; bar[1] += 1u; }
"""   # before each launch: the barrier count from 0, a new launch number for the exchanged words' tags

GEMV = r"""
        for (int e = tid; e < NB * {K}; e += NT) {{
            const int b = e / {K}, k = e - b * {K};
            {stage}
        }}
        __syncthreads();
        {{  // nq weight rows; where there are fewer than warps, each row's K splits into S slices
            const int nq = nu * {m}, S = nq > 0 && nq < NT / 32 ? (NT / 32) / nq : 1;
            for (int wq = warp; wq < nq * S; wq += NT / 32) {{
                const int q = wq / S, sl = wq - q * S, k1 = ({K} * (sl + 1)) / S;
                const CT* w = smem + {woff} + q * {K};
                CT acc[NB];
                #pragma unroll
                for (int b = 0; b < NB; ++b) acc[b] = 0;
                for (int k = ({K} * sl) / S + lane; k < k1; k += 32) {{
                    const CT wk = w[k];
                    #pragma unroll
                    for (int b = 0; b < NB; ++b) acc[b] += xs[b * {K} + k] * wk;
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


@dataclass(frozen=True)
class Phase:
    kind: str           # gemm | pair | dgemm | fused | dfused
    item: object        # the Gemm (gemm, dgemm), the Pair, or the Fused group
    units: int
    m: int = 1          # weight rows per unit (a pair: the GEMM's merged blocks)
    width: int = 0      # K of a GEMM phase: the length of its rows in shared memory

    @property
    def aligned(self) -> int | None:
        """The feature count F whose column f this phase's block alone writes at every unit f it owns,
        or None where its outputs are not columns of one F (a GEMM merging several blocks)."""
        if self.kind == "gemm":
            return self.units if len(self.item.nodes) == 1 else None
        return self.units


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


def problem(cell, loop) -> str | None:
    """Why a persistent kernel cannot run this loop, whatever the sizes, or None."""
    for st in loop.stages:
        for it in st.items:
            nodes = _nodes(it)
            if nodes is None:
                return f"its loop has a {type(it).__name__} item, which a persistent kernel does not run"
            for n in nodes:
                kind = cell.op(n).kind
                if kind in REDUCE:
                    return (f"op {n} ({kind.value}) reduces over features inside the loop, and a persistent "
                            "kernel splits features over blocks")
                if kind in (OpKind.CONCAT, OpKind.SLICE) or kind not in KERNEL and kind is not OpKind.LINEAR:
                    return f"op {n} ({kind.value}) has no rule a persistent kernel can run"
    return None


def _nodes(it):
    """The nodes of a loop item a persistent kernel runs, or None for other items."""
    if isinstance(it, Pair):
        return it.gemm.nodes + it.fused.nodes
    if isinstance(it, (Gemm, Fused)):
        return it.nodes
    if isinstance(it, (GemmGrad, FusedGrad)) and not getattr(it, "params", False):
        return it.item.nodes
    return None


def phases(cell, loop) -> list:
    """[[Phase]] per barrier group candidate: the loop's stages (a stage whose items may not overlap
    becomes one group per item), each a list of phases in run order."""
    groups = []
    for st in loop.stages:
        ps = [_phase(cell, it) for it in st.items]
        groups += [ps] if st.overlap or len(ps) == 1 else [[p] for p in ps]
    return groups


def _phase(cell, it) -> Phase:
    if isinstance(it, Pair):
        return Phase("pair", it, cell.op(it.fused.nodes[0]).size, len(it.gemm.nodes), cell.op(it.gemm.operand).size)
    if isinstance(it, Gemm):
        return Phase("gemm", it, sum(it.sizes), 1, cell.op(it.operand).size)
    if isinstance(it, GemmGrad):
        return Phase("dgemm", it.item, cell.op(it.item.operand).size, 1, sum(it.item.sizes))
    if isinstance(it, FusedGrad):
        return Phase("dfused", it.item, cell.op(it.item.nodes[0]).size)
    return Phase("fused", it, cell.op(it.nodes[0]).size)


def barriers(groups) -> list:
    """Per group, whether a grid barrier must come before it in every frame: before any GEMM phase
    (it reads whole rows), and before a fused phase unless every phase since the last barrier wrote
    only the columns its block owns of the same F (then this block's own writes are all it reads)."""
    out, pending = [], []
    for _ in range(2):                  # twice round: frame s's first group follows frame s-1's last
        out = []
        for g in groups:
            F = {p.units for p in g}
            own = all(p.kind in ("fused", "dfused") for p in g) and len(F) == 1 and \
                all(q.aligned == next(iter(F)) for q in pending)
            out.append(not own)
            pending = g if not own else pending + g
    return out


def shared_layout(groups, B: int, G: int) -> tuple:
    """({id(phase): weight offset}, xs, gs and gp offsets, total elements) of the shared memory: each
    GEMM phase's weights for the largest share of units a block gets, then x rows, the sums, the partials."""
    offs, n, xs, gs = {}, 0, 0, 0
    for p in (p for g in groups for p in g if p.kind in ("gemm", "pair", "dgemm")):
        per = -(-p.units // G)
        offs[id(p)] = n
        n += per * p.m * p.width
        xs, gs = max(xs, B * p.width), max(gs, per * p.m * B)
    gp = max(gs, THREADS // 32 * B)
    return offs, n, n + xs, n + xs + gs, n + xs + gs + gp


def persistent_kernel(cell, loop, ctype: str, B: int, G: int) -> Persistent:
    """The kernel running `loop` (a PersistentLoop; problem() is None) for B ≤ MAX_ROWS rows on G blocks."""
    groups = phases(cell, loop)
    woff, xs_off, gs_off, gp_off, total = shared_layout(groups, B, G)
    args: dict = {}

    def arg(kind, key):
        return f"pp{args.setdefault((kind, key), len(args))}"

    written = {n: (gi, p) for gi, g in enumerate(groups) for p in g for n in _nodes_of(p)}
    need = barriers(groups)
    swaps = _exchanges(cell, groups, written, ctype, G)     # group index -> operand passed in tagged words
    need = [n and gi not in swaps for gi, n in enumerate(need)]
    tagged = {u: arg("xb", u) for u in swaps.values()}
    # backward: groups before the frame's first barrier read only values (read-only here) and gradients of
    # their own block, so they run at the end of the previous frame's iteration, their loads issued before
    # its barrier (the forward has its barrier first: pair)
    k = next((gi for gi, n in enumerate(need) if n), 0) if loop.reverse else 0
    load, prologue, body, tail_loads, tail = [], [], [], [], []
    for gi, g in enumerate(groups):
        pre, early = [], {}
        for pi, p in enumerate(g):      # loads that need no barrier are issued before it
            ok = lambda kind, n, lag, p=p, gi=gi: kind == "val" and (loop.reverse or _own(written.get(n), p, lag, gi))
            lines, early[pi] = _prefetch(cell, p, f"r{gi}_{pi}_", arg, ok, G)
            pre += lines
        run = (["        grid_barrier(bar, ++barriers * G);"] if need[gi] else []) + \
            [ln for pi, p in enumerate(g) for ln in _phase_lines(cell, p, arg, early[pi], woff.get(id(p)), load,
                                                                    tagged.get(swaps.get(gi)), tagged)]
        if gi < k:
            prologue += pre + run
            tail_loads += pre
            tail += run
        else:
            body += pre + run
    if k:
        nxt = "        if (s + 1 < T) {{\n        const int t = T - 2 - s;\n{}\n        }}"
        decl = [ln for ln in tail_loads if ln.lstrip().startswith("CT ")]
        body = decl + [nxt.format("\n".join(ln for ln in tail_loads if ln not in decl))] + body + [nxt.format("\n".join(tail))]
        prologue = ["    {\n    const int t = T - 1;"] + prologue + ["    }"]
    names = list(args)
    ptr = {"w": "CT* pp{}, ", "xb": "unsigned long long* pp{}, "}
    sig = "".join(ptr.get(kind, "CT* pp{0}, long long ld{0}, ").format(k) for k, (kind, _) in enumerate(names))
    defs = {"CT": ctype, "NB": B, "G": G, "NT": THREADS, "XS_OFF": xs_off, "GS_OFF": gs_off, "GP_OFF": gp_off}
    text = "".join(f"#define {k} {v}\n" for k, v in defs.items()) + SOURCE.format(
        name="{name}", args=sig, load="\n".join(dict.fromkeys(load)), prologue="\n".join(prologue), phases="\n".join(body),
        frame="T - 1 - s" if loop.reverse else "s")
    name = kernel_name("persist", text)
    itemsize = 8 if ctype == "double" else 4
    return Persistent(name, text.replace("{name}", name), tuple(names), G, THREADS, total * itemsize)


def _phase_lines(cell, p, arg, early: dict, woff, load: list, xb, tagged: dict) -> list:
    """The lines running phase p at frame t (its GEMV first, with its weights' load added to `load`; its x
    from tagged words where xb names their buffer; its members in `tagged` also written so)."""
    out = [f"        {{   // {p.kind} {', '.join(_nodes_of(p))}",
           f"        const int u0 = ({p.units} * blk) / G, nu = ({p.units} * (blk + 1)) / G - u0;"]
    if woff is not None:
        load.append(_weights(p, woff, arg))
        out.append(_gemv(cell, p, woff, arg, xb))
    return out + _epilogue(cell, p, arg, early, tagged) + ["        __syncthreads();\n        }"]


def _exchanges(cell, groups, written, ctype: str, G: int) -> dict:
    """{group index: node}: where every forward group is one GEMM phase (a pair or a gemm) reading, one frame
    back or earlier in this one, a float32 node that a pair's or fused group's body writes on every block
    (its F ≥ G), and a pair's body reads only what its own block wrote, the grid barriers go: the writer
    stores each value with its frame's tag in one 64-bit word (two frames' words, by parity) and the GEMM
    spins on the words it stages. A block cannot overwrite a word two frames old before every block has
    read it: it has itself read every block's words of the frame in between. Else {} (barriers)."""
    out = {}
    for gi, g in enumerate(groups):
        (p, *rest) = g
        it = p.item.gemm if p.kind == "pair" else p.item
        gw, w = written.get(getattr(it, "operand", None), (None, None))
        body = w.item.fused.nodes if w is not None and w.kind == "pair" else getattr(getattr(w, "item", None), "nodes", ())
        if ctype != "float" or rest or p.kind not in ("pair", "gemm") or w is None or w.kind not in ("pair", "fused") \
                or it.operand not in body or it.delay > 1 or w.units != p.width or w.units < G:
            return {}
        if p.kind == "pair":
            spec, where = _sources(cell, p.item.fused.nodes, "fwd")
            if not all(_own(written.get(n), p, lag, gi) for nm, (_, n, lag) in where.items()
                       if nm in spec.in_names and n not in it.nodes):
                return {}
        out[gi] = it.operand
    return out


def _ld(pointer: str) -> str:
    """The row-stride argument of a frame array's pointer argument (pp<k> -> ld<k>)."""
    return "ld" + pointer[2:]


def _nodes_of(p) -> tuple:
    return p.item.gemm.nodes + p.item.fused.nodes if p.kind == "pair" else p.item.nodes


def _weights(p, off: int, arg) -> str:
    """Copies the block's weight rows of phase p into shared memory (row q = j·nu + u: block j's unit u)."""
    it = p.item.gemm if p.kind == "pair" else p.item
    w, K = arg("w", it), p.width
    if p.kind == "dgemm":           # W [M, K_op]: the block's columns, each a row of M here
        src = f"{w}[(long long)k * {p.units} + u0 + q]"
    else:                           # W [M, K]: row (j·F + u0 + u) for a pair, (u0 + q) for a gemm
        src = f"{w}[(long long)({p.units} * j + u0 + u) * {K} + k]" if p.kind == "pair" else \
            f"{w}[(long long)(u0 + q) * {K} + k]"
    return (f"    {{   const int u0 = ({p.units} * blk) / G, nu = ({p.units} * (blk + 1)) / G - u0;\n"
            f"        for (int e = tid; e < nu * {p.m * K}; e += NT) {{\n"
            f"            const int q = e / {K}, k = e - q * {K}, j = q / nu, u = q - j * nu;\n"
            f"            (void)j; (void)u;\n"
            f"            smem[{off} + e] = {src};\n        }}\n    }}")


def _gemv(cell, p, off: int, arg, xb) -> str:
    """p's GEMV: x staged (from its tagged words where xb names their buffer), the block's rows summed."""
    if p.kind == "dgemm":
        x, lag = arg("dcat", p.item), 0
    else:
        it = p.item.gemm if p.kind == "pair" else p.item
        x, lag = arg("val", it.operand), it.delay
    stage = f"xs[e] = AT({x}, {_ld(x)}, {lag}, k);"
    if xb:
        stage = (f"xs[e] = t - {lag} < 0 ? AT({x}, {_ld(x)}, {lag}, k) : "
                 f"exchanged({xb} + (((t - {lag}) & 1) * NB + b) * {p.width} + k, tags + t - {lag});")
    return GEMV.format(K=p.width, stage=stage, m=p.m, woff=off)


def _own(writer, p, lag: int, gi: int) -> bool:
    """Whether a forward value read at `lag` in phase p (group gi) is ready before the group's barrier: never
    written in the loop, or written by this block itself (an aligned phase of p's units) in an earlier frame
    or an earlier group of this one."""
    if writer is None:
        return True
    wg, w = writer
    return w.aligned == p.units and (lag >= 1 or wg < gi)


def _prefetch(cell, p, prefix: str, arg, ok, G: int) -> tuple:
    """(lines, {input name: register}) loading the inputs of phase p's body for which ok(kind, node, lag)
    holds into registers, each thread its one element (b, f); none where a thread has several."""
    if p.kind in ("gemm", "dgemm") or -(-p.units // G) * 8 > THREADS:
        return [], {}
    nodes, given = (p.item.fused.nodes, set(p.item.gemm.nodes)) if p.kind == "pair" else (p.item.nodes, set())
    spec, where = _sources(cell, nodes, "bwd" if p.kind == "dfused" else "fwd")
    early = {nm: prefix + nm for nm in spec.in_names if where[nm][1] not in given or where[nm][2]
             if ok(*where[nm])}
    if not early:
        return [], {}
    lines = [f"        CT {', '.join(f'{r} = 0' for r in early.values())};",
             f"        {{  const int u0 = ({p.units} * blk) / G, nu = ({p.units} * (blk + 1)) / G - u0;",
             "            if (tid < nu * NB) {", "                const int b = tid / nu, f = u0 + tid - b * nu;"]
    lines += [f"                {r} = {_at(arg, where[nm])};" for nm, r in early.items()]
    return lines + ["            }", "        }"], early


def _sources(cell, nodes, direction: str) -> tuple:
    """(the group's KernelSpec, {argument name: (kind, node, lag)}) for its forward or backward body."""
    spec = fused_forward_kernel(cell, nodes) if direction == "fwd" else \
        fused_backward_kernel(cell, nodes, set(cell.params))
    src = {"ext": lambda k: ("val", k[0], k[1]), "val": lambda n: ("val", n, 0), "out": lambda n: ("val", n, 0),
           "grad": lambda n: ("grad", n, 0), "gext": lambda k: ("grad", k[0], k[1])}
    return spec, {nm: src[kind](key) for nm, (kind, key) in zip(spec.in_names + spec.out_names,
                                                                  spec.inputs + spec.outputs)}


def _at(arg, source) -> str:
    kind, n, lag = source
    a = arg(kind, n)
    return f"AT({a}, {_ld(a)}, {lag}, f)"


def _epilogue(cell, p, arg, early: dict, tagged: dict) -> list:
    """The per-(b, f) part of a phase: a GEMM's stores, a pair's stores and fused body, a group's body."""
    head = ["        for (int e = tid; e < nu * NB; e += NT) {",
            "            const int b = e / nu, u = e - b * nu, f = u0 + u;", "            (void)f;"]
    if p.kind == "gemm":
        c = arg("cat", p.item)
        return head + [f"            AT({c}, {_ld(c)}, 0, f) = gs[u * NB + b];", "        }"]
    if p.kind == "dgemm":
        gx = arg("grad", p.item.operand)
        return head + [f"            AT({gx}, {_ld(gx)}, {p.item.delay}, f) += gs[u * NB + b];", "        }"]
    if p.kind == "pair":
        gemm, fused = p.item.gemm, p.item.fused
        c = arg("cat", gemm)
        lines = [f"            const CT g{j} = gs[({j} * nu + u) * NB + b];" for j in range(len(gemm.nodes))]
        lines += [f"            AT({c}, {_ld(c)}, 0, {p.units * j} + f) = g{j};" for j in range(len(gemm.nodes))]
        given = {n: f"g{j}" for j, n in enumerate(gemm.nodes)}
        return head + lines + _body(cell, fused.nodes, "fwd", arg, given, early, tagged) + ["        }"]
    return head + _body(cell, p.item.nodes, "fwd" if p.kind == "fused" else "bwd", arg, {}, early, tagged) + ["        }"]


def _body(cell, nodes, direction: str, arg, given: dict, early: dict, tagged: dict) -> list:
    """A fused group's body at element (b, f) of frame t: loads, the generated statements, stores.
    given: external nodes (read at delay 0) whose values are already in locals (a pair's GEMM sums);
    early: inputs already loaded into registers (_prefetch); tagged: members also written as tagged words."""
    spec, where = _sources(cell, nodes, direction)
    lines = []
    for nm, (kind, key) in zip(spec.in_names, spec.inputs):
        local = given.get(key[0]) if kind == "ext" and key[1] == 0 else None
        lines.append(f"CT {nm} = {local or early.get(nm) or _at(arg, where[nm])};")
    at = lambda nm: _at(arg, where[nm])
    lines += [f"CT {nm} = {at(nm)};" for nm in spec.out_names if nm.startswith("gm")] + spec.olds(at, "CT")
    lines += [ln.replace("T ", "CT ", 1) if ln.startswith("T ") else ln for ln in spec.body] + spec.writes(at)
    F = cell.op(nodes[0]).size
    lines += [f"exchange({tagged[n]} + ((t & 1) * NB + b) * {F} + f, tags + t, v{k});"
              for k, n in enumerate(nodes) if n in tagged and direction == "fwd"]
    return ["            " + ln for ln in lines]
