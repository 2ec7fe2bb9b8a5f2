"""A generated persistent kernel run on the CPU: its CUDA source compiled as C++ by the system's g++, each CUDA thread
a fiber of one OS thread (its own stack, switched only where it waits: a persistent kernel's blocks meet at barriers
thousands of times, which as std::threads on two cores cost a context switch each), __syncthreads a barrier of the
block, a named barrier (bar.sync id, n) a count of n arrivals, a warp shuffle an exchange through memory between
barriers of the warp, a tensor-core mma.sync the same (the warp's fragments exchanged, each output summed in
float32; TF32 rounding as cvt.rna), the grid barrier its row group's atomic counter, float16 through _Float16
(bfloat16 as the GPU's own bit arithmetic). PRELUDE without RG_FIBERS defined (the other kernels' tests launch it)
makes each CUDA thread a std::thread and __syncthreads a std::barrier (no named barriers). A test backend (Emulated)
runs the persistent loops this way on the numpy workspace and everything else as numpy does, so a kernel's indexing,
arguments and synchronisation are checked against the reference without a GPU.
blocks_in_turn=True runs the blocks one after another, each to its end: a kernel that reads another block's
values then reads them unwritten (zeros), so where every block owns whole heads the results say that no block
waits for another; a kernel with grid barriers needs its blocks at once (blocks_in_turn=False), or a row group's
at once (blocks_in_turn="groups": one row group after another, so no group reads another's rows or waits at
another's barrier).
"""
from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from rnngraph.plan.loops import PersistentLoop
from rnngraph.run.backends.cuda.persistent import mma
from rnngraph.run.backends.cuda.persistent.kernels import SYNC, persistent_kernel
from rnngraph.run.backends.cuda.persistent.roles import ROLES_SYNC
from rnngraph.run.backends.cuda.persistent.staging import BULK_INIT
from rnngraph.run.backends.cuda.source import CTYPES, HALF_PRELUDE, HALF_TYPES
from rnngraph.run.backends.numpy_backend import NumpyBackend

CXX = shutil.which("g++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no g++ to compile kernels for the CPU")
_BUILT: dict = {}
_DIR = Path(tempfile.mkdtemp(prefix="rnngraph_cuda_on_cpu_"))

HEADERS = ("atomic", "barrier", "cmath", "cstring", "csetjmp", "functional", "memory", "thread", "vector",
           "ucontext.h")      # what every emulated kernel includes, compiled once (rg_std.h.gch)
FLAGS = ("-std=c++20", "-O1", "-U_FORTIFY_SOURCE", "-fPIC", "-pthread", "-w")
FIBERS = "// each CUDA thread a std::thread"       # the line of PRELUDE that LAUNCH's kernels replace: fibers
BULK_BARRIER = BULK_INIT.split(";")[0].strip() + ";"       # staging.BULK_INIT's __shared__ declaration

PRELUDE = r"""#include "rg_std.h"
// each CUDA thread a std::thread
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(a, b)
#define __restrict__
using std::exp; using std::tanh; using std::log1p; using std::fabs; using std::sqrt;
template <class T> static inline T rsqrt(T x) { return T(1) / std::sqrt(x); }
using std::min;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
struct alignas(16) float4 { float x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct rg_dim { int x; };
#ifdef RG_FIBERS
// every CUDA thread a fiber of one OS thread, switched only where it waits: at a barrier (resumed once the
// barrier's phase has moved on) or in a spin (resumed in turn)
#define RG_LOCAL static
static void rg_yield();
static void rg_wait_gen(const unsigned long* gen, unsigned long seen);
struct rg_barrier_t {           // n arrivals complete a phase; the others wait until it does
    int n, arrived = 0; unsigned long gen = 0;
    explicit rg_barrier_t(int n) : n(n) {}
    void arrive_and_wait() {
        const unsigned long g = gen;
        if (++arrived == n) { arrived = 0; ++gen; } else rg_wait_gen(&gen, g);
    }
};
#else
#define RG_LOCAL static thread_local
typedef std::barrier<> rg_barrier_t;
static inline void rg_yield() { std::this_thread::yield(); }
#endif
RG_LOCAL rg_dim threadIdx, blockIdx;
RG_LOCAL rg_barrier_t* rg_block_barrier;
RG_LOCAL std::vector<rg_barrier_t*>* rg_warp_barriers;
RG_LOCAL double* rg_shuffle;        // the block's [NT] exchange slots
RG_LOCAL unsigned char* rg_smem;
RG_LOCAL unsigned* rg_mma_regs;    // the block's [NT][6] fragment registers
static inline void __syncthreads() { rg_block_barrier->arrive_and_wait(); }
#ifdef RG_FIBERS       // named barriers: the persistent kernels' warp roles alone meet at them
struct rg_named_bar { int arrived = 0; unsigned long gen = 0; };
RG_LOCAL rg_named_bar* rg_named;     // the block's named barriers, by id
static inline void rg_named_arrive(int id, int n, bool wait) {      // n threads complete a barrier (bar.sync id, n)
    rg_named_bar& b = rg_named[id];
    const unsigned long gen = b.gen;
    if (++b.arrived == n) { b.arrived = 0; ++b.gen; } else if (wait) rg_wait_gen(&b.gen, gen);
}
static inline void rg_wait(int id, int n) { rg_named_arrive(id, n, true); }
static inline void rg_arrive(int id, int n) { rg_named_arrive(id, n, false); }
#endif
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    rg_barrier_t* b = (*rg_warp_barriers)[warp];
    rg_shuffle[threadIdx.x] = (double)v;
    b->arrive_and_wait();
    T r = (T)rg_shuffle[warp * 32 + (lane ^ o)];
    b->arrive_and_wait();
    return r;
}
static inline float exchanged(const unsigned long long* w, unsigned int tag) {
    unsigned long long v;
    while ((unsigned int)((v = __atomic_load_n(w, __ATOMIC_ACQUIRE)) >> 32) != tag) rg_yield();
    unsigned int u = (unsigned int)v; float f; std::memcpy(&f, &u, 4); return f;
}
static inline void exchange(unsigned long long* w, unsigned int tag, float x) {
    unsigned int u; std::memcpy(&u, &x, 4);
    __atomic_store_n(w, ((unsigned long long)tag << 32) | u, __ATOMIC_RELEASE);
}
template <class H> static inline void exchange_half(unsigned int* w, unsigned int t, float x) {
    H h;
    h = x;
    __atomic_store_n(w, (t << 16) | h.u, __ATOMIC_RELEASE);
}
static inline uint4 rg_tagged4(const unsigned int* w) {
    return {__atomic_load_n(w, __ATOMIC_ACQUIRE), __atomic_load_n(w + 1, __ATOMIC_ACQUIRE),
            __atomic_load_n(w + 2, __ATOMIC_ACQUIRE), __atomic_load_n(w + 3, __ATOMIC_ACQUIRE)};
}
static inline bool rg_tagged(uint4 v, unsigned int t) {     // a spin's test: a word not yet written lets others run
    const unsigned int k = t & 0xFFFFu;
    const bool ok = (v.x >> 16) == k && (v.y >> 16) == k && (v.z >> 16) == k && (v.w >> 16) == k;
    if (!ok) rg_yield();
    return ok;
}
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline unsigned int atomicCAS(unsigned int* p, unsigned int seen, unsigned int v) {
    __atomic_compare_exchange_n(p, &seen, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return seen;
}
static inline void grid_barrier(unsigned int* count, unsigned int target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __atomic_fetch_add(count, 1u, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(count, __ATOMIC_SEQ_CST) < target) rg_yield();
    }
    __syncthreads();
}
"""
PRELUDE_2D = PRELUDE.replace("struct rg_dim { int x; };", "struct rg_dim { int x, y; };").replace(
    "rg_dim threadIdx, blockIdx;", "rg_dim threadIdx, blockIdx, blockDim;")     # kernels of 2D blocks and grids
MMA = r"""
static inline float rg_value(unsigned r, int hi) {      // an element of a fragment register
    VALUE
}
static inline void rg_mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    // mma.sync row.col, float32 accumulation: the warp's fragments exchanged through memory
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    rg_barrier_t* bar = (*rg_warp_barriers)[warp];
    unsigned* regs = rg_mma_regs + warp * 32 * 6;
    const unsigned mine[6] = {a0, a1, a2, a3, b0, b1};
    for (int i = 0; i < 6; ++i) regs[lane * 6 + i] = mine[i];
    bar->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float sum = 0.f;
        for (int k = 0; k < 2 * KH; ++k) {  // A[row][k]: lane (row % 8, (k % KH) / PER), a0..a3 by row and k halves
            const int ka = (k % KH) / PER, hi = k % PER;
            const float a = rg_value(regs[((row % 8) * 4 + ka) * 6 + (row >= 8) + 2 * (k >= KH)], hi);
            const float b = rg_value(regs[(col * 4 + ka) * 6 + 4 + (k >= KH)], hi);   // B[k][col]: lane (col, ..)
            sum += a * b;
        }
        c[i] += sum;
    }
    bar->arrive_and_wait();
}
static inline void rg_copy16(void* smem, const void* global, bool full) {      // cp.async: a copy at once
    if (full) std::memcpy(smem, global, 16); else std::memset(smem, 0, 16);
}
static inline void rg_copies_wait() {}
static inline void rg_bulk_init(unsigned long long*) {}       // bulk copies (TMA): each at once, in the issuing thread
static inline void rg_bulk_expect(unsigned long long*, unsigned) {}
static inline void rg_bulk_copy(void* smem, const void* global, unsigned bytes, unsigned long long*) {
    std::memcpy(smem, global, bytes);
}
static inline void rg_bulk_wait(unsigned long long*, unsigned& phase) { phase ^= 1u; }
"""
# per MMA input type: an element's value (VALUE), half the k-step (KH) and the elements a register (PER)
MMA_TYPES = {
    "bf16": ("const unsigned short u = (unsigned short)(hi ? r >> 16 : r & 0xffffu); "
             "unsigned v = (unsigned)u << 16; float f; std::memcpy(&f, &v, 4); return f;", 8, 2),
    "f16": ("const unsigned short u = (unsigned short)(hi ? r >> 16 : r & 0xffffu); "
            "_Float16 h; std::memcpy(&h, &u, 2); return (float)h;", 8, 2),
    "tf32": ("(void)hi; return __uint_as_float(r);", 4, 1)}
TF32 = r"""
static inline unsigned rg_tf32(unsigned x) {    // cvt.rna.tf32.f32: to nearest, ties away from zero (inf, NaN kept)
    return (x & 0x7f800000u) == 0x7f800000u ? x : (x + 0x1000u) & 0xffffe000u;
}
static inline float rg_tf32f(float x) { return __uint_as_float(rg_tf32(__float_as_uint(x))); }
"""


def emulated_mma(ptx: str) -> str:
    """The C++ standing in for mma.helpers of PTX input type ptx."""
    value, kh, per = MMA_TYPES[ptx]
    text = MMA.replace("VALUE", value).replace("2 * KH", str(2 * kh)).replace("KH", str(kh)).replace("PER", str(per))
    return text + (TF32 if ptx == "tf32" else "")


F16 = {'float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(u)); return f;':
       "_Float16 h; std::memcpy(&h, &u, 2); return (float)h;",
       'asm("cvt.rn.f16.f32 %0, %1;" : "=h"(u) : "f"(f)); return *this;':
       "_Float16 h = (_Float16)f; std::memcpy(&u, &h, 2); return *this;"}    # round to nearest even, as cvt.rn

LAUNCH = r"""
struct rg_fiber {           // a CUDA thread: its context, stack and what PRELUDE's per-thread variables hold for it
    ucontext_t ctx; jmp_buf jb; std::unique_ptr<char[]> stack; bool started = false, done = false;
    const unsigned long* wait_gen = nullptr; unsigned long wait_seen = 0;       // a barrier's phase it waits past
    int tid, blk; rg_barrier_t* bb; std::vector<rg_barrier_t*>* wb; double* shuffle; unsigned char* smem;
    unsigned* mma_regs; rg_named_bar* named;
};
static jmp_buf rg_main;
static rg_fiber* rg_current;
static std::function<void()> rg_kernel;
// switches: a fiber's first start through setcontext, then _setjmp/_longjmp (no signal mask saved or restored)
static void rg_yield() { if (!_setjmp(rg_current->jb)) _longjmp(rg_main, 1); }
static void rg_wait_gen(const unsigned long* gen, unsigned long seen) {
    rg_current->wait_gen = gen; rg_current->wait_seen = seen;
    rg_yield();
    rg_current->wait_gen = nullptr;
}
static void rg_entry() { rg_kernel(); rg_current->done = true; _longjmp(rg_main, 1); }
static bool rg_ready(const rg_fiber& f) { return !f.done && !(f.wait_gen && *f.wait_gen == f.wait_seen); }
static void rg_resume(rg_fiber* f) {
    threadIdx.x = f->tid; blockIdx.x = f->blk; rg_block_barrier = f->bb; rg_warp_barriers = f->wb;
    rg_shuffle = f->shuffle; rg_smem = f->smem; rg_mma_regs = f->mma_regs; rg_named = f->named; rg_current = f;
    if (!_setjmp(rg_main)) {
        if (!f->started) { f->started = true; setcontext(&f->ctx); }
        _longjmp(f->jb, 1);
    }
}
extern "C" void rg_launch(void** ptrs, long long* lds, const long long* run, int tab, int T, int P, int rg_nblocks, int NTH, long long smem, int together) {
    const size_t STACK = 256 << 10;
    rg_kernel = [&]() { KERNEL_CALL; };
    std::vector<std::unique_ptr<rg_barrier_t>> bars;
    std::vector<std::vector<rg_barrier_t*>> wbs(rg_nblocks);
    std::vector<std::vector<double>> shuffles(rg_nblocks, std::vector<double>(NTH));
    std::vector<std::vector<unsigned char>> smems(rg_nblocks, std::vector<unsigned char>(smem + 16));
    std::vector<std::vector<unsigned>> mma_regs(rg_nblocks, std::vector<unsigned>(6 * NTH));
    std::vector<std::unique_ptr<rg_named_bar[]>> named;
    std::vector<rg_barrier_t*> bbs;
    for (int blk = 0; blk < rg_nblocks; ++blk) {
        named.emplace_back(new rg_named_bar[16]);
        bbs.push_back(bars.emplace_back(new rg_barrier_t(NTH)).get());
        for (int k = 0; k < NTH / 32; ++k) wbs[blk].push_back(bars.emplace_back(new rg_barrier_t(32)).get());
    }
    for (int b0 = 0; b0 < rg_nblocks; b0 += together) {      // `together` blocks at a time, then the next
        const int b1 = std::min(rg_nblocks, b0 + together);
        std::vector<rg_fiber> fibers((b1 - b0) * NTH);
        for (int blk = b0, i = 0; blk < b1; ++blk)
            for (int tid = 0; tid < NTH; ++tid, ++i) {
                rg_fiber& f = fibers[i];
                f.tid = tid; f.blk = blk; f.bb = bbs[blk]; f.wb = &wbs[blk]; f.shuffle = shuffles[blk].data();
                f.smem = smems[blk].data(); f.mma_regs = mma_regs[blk].data(); f.named = named[blk].get();
                f.stack.reset(new char[STACK]);
                getcontext(&f.ctx);
                f.ctx.uc_stack.ss_sp = f.stack.get(); f.ctx.uc_stack.ss_size = STACK; f.ctx.uc_link = nullptr;
                makecontext(&f.ctx, rg_entry, 0);
            }
        for (size_t live = fibers.size(); live;)         // each in turn until it waits, until all have ended
            for (auto& f : fibers)
                if (rg_ready(f)) { rg_resume(&f); live -= f.done; }
    }
}
"""


def cpp_source(k) -> str:
    """The kernel's source as C++ for the emulator, with a launcher
    rg_launch(ptrs, lds, run, tab, T, P, blocks, threads, smem, together): `together` blocks at once."""
    src = k.source
    for sync in (SYNC, ROLES_SYNC):     # the grid barrier and the named barriers: PRELUDE's
        src = src.replace(sync.replace("{{", "{").replace("}}", "}"), "")
    src = src.replace("extern __shared__ __align__(16) unsigned char smem_raw[];", "unsigned char* smem_raw = rg_smem;")
    src = src.replace(BULK_BARRIER, "unsigned long long rg_bulk;")     # the bulk copies' mbarrier: unused here
    src = src.replace('extern "C" __global__ void', "static void")
    call = []
    for j, (kind, _) in enumerate(k.args):
        kinds = {'xb': 'unsigned long long', 'xh': 'unsigned int', 'sums': 'CT'}
        call.append(f"({kinds.get(kind, 'ST')}*)ptrs[{j + 1}]")
        if kind not in ("w", "xb", "xh", "sums"):
            call.append(f"lds[{j}]")
    call = f"{k.name}((unsigned int*)ptrs[0], {', '.join(call)}, run, tab, T, P)"
    half = HALF_PRELUDE
    for a, b in F16.items():
        half = half.replace(a, b)
    for ctype, ptx in mma.PTX_TYPE.items():     # tensor cores: the MMA emulated (its input type's values)
        src = src.replace(mma.helpers(ctype), emulated_mma(ptx))
    return PRELUDE.replace(FIBERS, "#define RG_FIBERS") + (half if any(h in src for h in HALF_TYPES) else "") + src + \
        LAUNCH.replace("KERNEL_CALL", call)


def compiled(text: str):
    """C++ `text` compiled by g++ into a shared library and loaded (once per text); the standard headers it
    includes (rg_std.h, PRELUDE's first line) parsed once, as a precompiled header of the same flags."""
    header = _DIR / "rg_std.h"
    if not header.exists():
        header.write_text("".join(f"#include <{h}>\n" for h in HEADERS))
        subprocess.run([CXX, *FLAGS, "-x", "c++-header", str(header), "-o", f"{header}.gch"], check=True,
                       capture_output=True, text=True)
    key = hashlib.sha1(text.encode()).hexdigest()[:16]
    if key not in _BUILT:
        cpp, so = _DIR / f"{key}.cpp", _DIR / f"{key}.so"
        cpp.write_text(text)
        subprocess.run([CXX, *FLAGS, "-shared", f"-I{_DIR}", str(cpp), "-o", str(so)], check=True, capture_output=True,
                       text=True)
        _BUILT[key] = ctypes.CDLL(str(so))
    return _BUILT[key]


def built(k):
    """The compiled launcher of kernel k (built once per source)."""
    lib = compiled(cpp_source(k))
    lib.rg_launch.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong), ctypes.c_void_p,
                              ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_longlong, ctypes.c_int]
    return lib


class Emulated(NumpyBackend):
    """numpy, with the persistent loops run by their generated kernels on the CPU: G blocks (None: the first
    of phases.block_counts for 132 SMs), in turn, a row group at a time or at once, each running `rows` rows
    (None: all; fewer: the rest in more blocks, G a row group), on tensor cores where `tensor_cores` says (None:
    beyond MAX_ROWS rows), float32 there in 3xTF32 where `split`;
    `ran` lists each kernel run (its Persistent), `walked` the frames each walked (a chunk's n, else T)."""
    name = "emulated"
    kernel_loops = walking_loops = frozenset({"persistent"})
    compiles_heads = True

    def __init__(self, G=None, blocks_in_turn=False, rows=None, tensor_cores=None, split=False):
        super().__init__("staged")
        self.G, self.in_turn, self.rows, self.ran, self.walked = G, blocks_in_turn, rows, [], []
        self.tensor_cores, self.split = tensor_cores, split
        self.sums: dict = {}        # loop -> the (group, parameter) sums its last compiled kernel takes

    def loop_problem(self, cell, loop, B, dtype):
        return None

    def loop_sums(self, cell, loop, B, dtype):
        return self.sums.get(loop, frozenset())

    def compile(self, cell, item, views, per_frame):
        if not isinstance(item, PersistentLoop):
            return None
        from rnngraph.run.backends.cuda.persistent.phases import block_counts
        vals, grads, cat, wcat, P, T, B, running, _ = views
        dtype = next(iter(cat.values()))[0].dtype
        G = self.G or block_counts(cell, item, 132)[0]
        rows = self.rows or B           # rows a block: the rest of B in more blocks (row groups)
        k = persistent_kernel(cell, item, CTYPES[str(dtype)], rows, G, B // rows, self.tensor_cores, self.split)
        part = np.full((B, k.sum_columns), np.nan, np.float64 if dtype == np.float64 else np.float32)
        pick = {"val": vals.__getitem__, "grad": grads.__getitem__, "cat": lambda it: cat[it][0],
                "dcat": lambda it: cat[it][1], "w": lambda it: wcat[it][0],
                "xb": lambda n: np.zeros((2, B, cell.op(n).size), np.uint64),
                "xh": lambda n: np.zeros((2, B, cell.op(n).size), np.uint32), "sums": lambda _: part}
        arrays = [np.zeros(1 + k.row_groups, np.uint32)] + [pick[kind](key) for kind, key in k.args]
        lds = [0 if a.ndim == 1 else a.strides[0] // (B * a.itemsize) for a in arrays[1:]]
        self.sums[item] = frozenset(key for key, _ in k.sums)

        def sums(grid, block, args):        # as sums.SUMS_SOURCE: each column's rows added in order
            for (_, u), c in k.sums:
                g = grads[u]
                g[...] = (g.astype(part.dtype) + part[:, c:c + g.shape[0]].sum(axis=0)).astype(g.dtype)
        return [(self._launcher(k, arrays, lds, running, T, P), None, None, None)] + \
            ([(sums, None, None, None)] if k.sums else [])

    def _launcher(self, k, arrays, lds, running, T, P):
        lib = built(k)
        ptrs = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        ld = (ctypes.c_longlong * max(len(lds), 1))(*lds)

        cur, tab = running or (None, 0)         # a chunk's workspace: the kernel walks the running chunk's n frames

        def run(grid, block, args):
            arrays[0][0] += 1                   # as rg_persist_zero: a new launch number (the words' tags move on),
            arrays[0][1:] = 0                   # each row group's barrier count from 0
            self.ran.append(k)
            self.walked.append(T if cur is None else int(cur[tab + 3 * cur[0] + 1]))
            together = {True: 1, "groups": k.blocks // k.row_groups}.get(self.in_turn, k.blocks)
            lib.rg_launch(ptrs, ld, None if cur is None else cur.ctypes.data, tab, T, P, k.blocks, k.threads, k.smem,
                          together)
        return run
