"""Warp roles (persistent/roles.py): in the forward of a head-wise cell whose blocks own whole heads and hand h on
in shared memory, with the weights resident in registers (sLSTM, the multi-head LSTM on CUDA cores), some warps sum
the GEMM, others run the elements and others store their values, meeting at named barriers. Which kernels take
them, what each role does in a frame and in what order, and, run on the CPU (cuda_on_cpu.py), that they compute
what numpy computes, with a last element warp only partly used and ragged, chunked calls."""
import re

import numpy as np
import pytest

from cuda_on_cpu import Emulated, needs_cxx
from nvrtc import nvrtc_compile
from rnngraph import load_cell
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cuda.persistent.kernels import persistent_kernel
from rnngraph.run.backends.cuda.persistent.phases import block_counts
from rnngraph.run.executor import Executor
from test_loops import run_executor
from test_persistent_heads import assert_agree, loops, problem_arrays


def roles(k) -> tuple | None:
    """(MT, ET) of a kernel in warp roles, else None."""
    found = [re.search(rf"#define {d} (\d+)\n", k.source) for d in ("MT", "ET")]
    return tuple(int(m.group(1)) for m in found) if all(found) else None


def test_which_kernels_run_in_warp_roles():
    """sLSTM H = 768 in 12 heads of 64 (a block a head): at 2 rows a block 256 threads sum (a weight row against
    both rows each), 128 run the 64 units × 2 rows and 128 store their values; at B = 1, 256, 64 and 64. Not where
    the weights stay in shared memory (float64, 4 rows a thread), on tensor cores, backward, or where heads split
    over blocks (barriers)."""
    cell = load_cell("slstm", 8, 768, heads=12)
    fwd, bwd = loops(cell)
    G, more = block_counts(cell, fwd, 132)
    assert roles(persistent_kernel(cell, fwd, "rg_bf16", 2, G)) == (256, 128)
    assert roles(persistent_kernel(cell, fwd, "rg_f16", 1, G)) == (256, 64)
    assert roles(persistent_kernel(cell, fwd, "float", 2, G)) == (256, 128)
    mh = load_cell("mh_lstm", 8, 512, heads=8)
    assert roles(persistent_kernel(mh, loops(mh)[0], "rg_bf16", 1, 8)) == (256, 64)
    for k in (persistent_kernel(cell, fwd, "double", 2, G), persistent_kernel(cell, fwd, "rg_bf16", 8, G),
              persistent_kernel(cell, fwd, "rg_bf16", 16, G), persistent_kernel(cell, bwd, "rg_bf16", 2, G),
              persistent_kernel(cell, fwd, "float", 2, more)):
        assert roles(k) is None and "rg_arrive" not in k.source
    odd = load_cell("slstm", 8, 48, heads=2)         # heads of 24: 24 elements at B = 1 would leave a warp part-used
    assert roles(persistent_kernel(odd, loops(odd)[0], "rg_bf16", 1, 2)) is None


@pytest.mark.parametrize("ctype, sums, hand", [("rg_bf16", "gs[q * NB + c] = acc", "((ST*)xs)[b * XLD + u] ="),
                                               ("float", "gs[q * NB + b + r] =", "xs[b * 64 + u] =")])
def test_each_role_does_its_part_of_a_frame(ctype, sums, hand):
    """The GEMM warps touch no frame array (their weights are in registers). The element warps load sLSTM's states
    c, n, m (read at lag 1, stored at lag 0) and its four input biases (sunk into the loop) before the loop only,
    then carry them in registers, and its four gate inputs two frames ahead, even and odd frames into registers of
    their own; in each frame: the wait for the sums, the operand into xs, the arrival, the loads of frame s + 2,
    the 11 values into stage[s mod 2] (not the four GEMM sums, which only adds read: elements.stored_sums), the
    carried states, the arrival at STAGED. The store warps read those values, free the stage, then store them to
    memory. No __syncthreads in the loop. In half storage the GEMM warps run on tensor cores (mma.sync, their
    weights' fragments in registers), in float32 on CUDA cores (a weight row a thread in registers)."""
    cell = load_cell("slstm", 8, 768, heads=12)
    src = persistent_kernel(cell, loops(cell)[0], ctype, 2, 12).source
    gemm, rest = src.split("if (tid < MT) {", 1)[1].split("} else if (tid < MT + ET) {", 1)
    elements, stores = rest.split("} else if (tid < MT + 2 * ET) {", 1)
    assert "AT(" not in gemm and "__syncthreads" not in gemm + elements + stores
    assert gemm.index(sums) < gemm.index("rg_arrive(SUMS") < gemm.index("rg_wait(OPERAND")
    assert ("rg_mma(acc[i]" in gemm) == (ctype == "rg_bf16")
    before, loop = elements.split("for (int s2 = 0; s2 < NF; s2 += 2) {", 1)
    assert len(re.findall(r"= AT\(pp\d+, ld\d+, 1, f\)", before)) == 3
    assert len(re.findall(r"= AT\(pp\d+, ld\d+, 0, f\)", before)) == 12     # frames 0 and 1, the 4 biases once
    frames = loop.split("if (s2 + 1 < NF) {", 1)
    for k, (frame, regs) in enumerate(zip(frames, ("r_", "n_"))):      # even and odd frames, each its own inputs
        loads = re.findall(r"(\w+) = AT\(pp\d+, ld\d+, 0, f\)", frame)
        assert len(loads) == 4 and all(r.startswith(regs) and f"= {r};" in frame for r in loads)
        assert not re.search(r"AT\([^()=]*\) = ", frame)
        carry = re.search(r"r_x\d+ = v\d+;", frame).group()       # a carried state takes its stored value
        marks = [frame.index(s) for s in ("rg_wait(SUMS", hand, "rg_arrive(OPERAND", "s + 2 < NF",
                                          f"SG({k}, 0) = v", f"SG({k}, 10) = v", carry, f"rg_arrive(STAGED + {k}")]
        assert marks == sorted(marks) and f"SG({k}, 11)" not in frame
    marks = [stores.index(s) for s in ("rg_wait(STAGED", "= SG(s & 1, 10);", "rg_arrive(FREE", "AT(pp")]
    assert marks == sorted(marks) and len(re.findall(r"AT\(pp\d+, ld\d+, 0, f\) = w\d+;", stores)) == 11


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_roles_sources_compile(dtype):
    from rnngraph.run.backends.cuda.source import CTYPES
    for name, H, heads, rows in (("slstm", 768, 12, (1, 2)), ("mh_lstm", 64, 2, (1, 2))):
        cell = load_cell(name, 8, H, heads=heads)
        for B in rows:
            k = persistent_kernel(cell, loops(cell)[0], CTYPES[dtype], B, heads)
            assert roles(k)
            nvrtc_compile(k.source, k.name)


@needs_cxx
@pytest.mark.parametrize("name, H, B, dtype, roles_ran", [
    ("slstm", 64, 1, "bfloat16", (256, 32)), ("slstm", 64, 2, "float32", (256, 64)),
    ("mh_lstm", 64, 2, "float16", (256, 64)), ("mh_lstm", 128, 2, "bfloat16", (256, 128)),
    ("mh_lstm", 32, 8, "bfloat16", (128, 128)),        # heads of 16 units, 8 rows: x's tile of 8 rows full
    ("slstm", 48, 1, "bfloat16", None), ("slstm", 16, 5, "float32", None)])
def test_warp_roles_compute_the_reference(name, H, B, dtype, roles_ran):
    """Blocks one after another (none reads another's head), ragged lengths, then chunks of 1, 4 and 4 frames (a
    launch a chunk, each staging its first frame's operand); half storage on tensor cores (mma.sync emulated:
    tiles of 16 weight rows against x's rows in a tile of 8, of which B rows are real). Where a block's elements
    do not fill whole warps (heads of 24 units at B = 1, of 8 at B = 5), the kernel runs without roles, so that no
    warp arrives at a barrier with only some of its threads. float32 is held to float64's results of the same
    inputs, within 1e-4 or, where the problem amplifies rounding (an sLSTM's exponential gates: gradients of 1e5),
    twice numpy's own float32 error."""
    cell = load_cell(name, 8, H, heads=2)
    args, lengths = problem_arrays(cell, 9, B, dtype), np.array(([9, 4, 1, 7, 2] * 3)[:B])
    for chunk in (None, 4):
        be = Emulated(None, True)
        got = run_executor(Executor(cell, be, loop="persistent", chunk=chunk), *args, lengths)
        ref = Executor(cell, get_backend("numpy"), loop="stages", chunk=chunk)
        want = run_executor(ref, *args, lengths)
        if dtype == "float32":
            exact = run_executor(ref, *_float64(args), lengths)
            for k, (a, b, e) in enumerate(zip(got, want, exact, strict=True)):
                assert _rel(a, e) <= max(1e-4, 2 * _rel(b, e)), f"array {k}: {_rel(a, e):.1e} ({_rel(b, e):.1e})"
        else:
            assert_agree(got, want, dtype)
        assert roles(be.ran[0]) == roles_ran and not roles(be.ran[-1])      # the forward in roles, the backward not
        assert be.ran[0].tensor_cores == (roles_ran is not None and dtype != "float32")
        assert len(be.ran) == (2 if chunk is None else 6)


def _float64(args) -> tuple:
    """problem_arrays' (params, x, init, gy, gf) in float64."""
    up = lambda a: {k: v.astype(np.float64) for k, v in a.items()} if isinstance(a, dict) else a.astype(np.float64)
    return tuple(up(a) for a in args)


def _rel(a, exact) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - exact) / max(np.linalg.norm(exact), 1e-300))
