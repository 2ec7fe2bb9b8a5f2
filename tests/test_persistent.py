"""Loop strategy 'persistent' without a GPU: the generated cooperative kernels (deterministic source, one
grid barrier where the plan needs one, shared memory as laid out, what cannot run said by name), compiled
by NVRTC (the pip wheel nvidia-cuda-nvrtc-cu12: a compiler, no GPU needed)."""
import pytest

from rnngraph import CELLS, build_schedule, load_cell
from rnngraph.errors import RnnGraphError
from rnngraph.plan.loops.persistent import persistent_plan
from rnngraph.plan.items import Fused
from rnngraph.run.backends.cuda.fused import fused_backward_kernel, fused_forward_kernel
from rnngraph.run.backends.cuda.param_grad import param_grad_kernel
from rnngraph.run.backends.cuda.persistent.kernels import persistent_kernel
from rnngraph.run.backends.cuda.persistent.phases import THREADS, problem
from nvrtc import nvrtc_compile

GEMM_CORES = [c for c in CELLS if "persistent" in build_schedule(load_cell(c, 4, 8)).loop_strategies]


def loops(cell):
    """(forward, backward) PersistentLoop items of a cell's plan."""
    s = build_schedule(cell, loop="persistent")
    return s.forward[1].items[0], next(sec for sec in s.backward if sec.name == "loop").items[0]


def test_cells_with_a_gemm_on_a_state_admit_persistent():
    assert set(GEMM_CORES) == {"lstm", "gru", "rnn_tanh", "rnn_relu", "peephole_lstm", "cifg_lstm", "mgu", "slstm",
                               "mh_lstm"}


def test_source_is_deterministic_and_named_by_its_text():
    cell = load_cell("lstm", 8, 64)
    fwd, bwd = loops(cell)
    a, b = persistent_kernel(cell, fwd, "float", 3, 132), persistent_kernel(load_cell("lstm", 8, 64), fwd, "float", 3, 132)
    assert a == b and a.name in a.source
    assert persistent_kernel(cell, fwd, "float", 4, 132).name != a.name != persistent_kernel(cell, bwd, "float", 3, 132).name


# cell: grid barriers per frame (forward, backward): one before each GEMM on a state; none before a fused
# group whose block reads only its own features (the backward's group after the dgemm of the next frame)
BARRIERS = {"lstm": (1, 1), "gru": (1, 1), "rnn_tanh": (1, 1), "peephole_lstm": (1, 1), "mgu": (2, 2)}


@pytest.mark.parametrize("name", sorted(BARRIERS))
def test_one_grid_barrier_per_gemm_phase(name):
    cell = load_cell(name, 8, 64)
    got = tuple(persistent_kernel(cell, lp, "float", 1, 132).source.count("grid_barrier(count,") for lp in loops(cell))
    assert got == BARRIERS[name]


@pytest.mark.parametrize("name", ["lstm", "gru", "mgu"])
def test_float32_forward_exchanges_tagged_words_instead_of_barriers(name):
    """Where each thread stages at most EXCHANGE_WORDS words and every block writes some: no barrier forward;
    float64 (no 64-bit word holds a double and its tag), B = 8 (8 words a thread) or fewer units than blocks
    keep them; the backward keeps its barriers."""
    cell = load_cell(name, 8, 512)
    fwd, bwd = loops(cell)
    count = lambda lp, ctype, B, G: persistent_kernel(cell, lp, ctype, B, G).source.count("grid_barrier(count,")
    assert count(fwd, "float", 1, 132) == 0 and "exchanged(" in persistent_kernel(cell, fwd, "float", 1, 132).source
    assert count(fwd, "double", 1, 132) == count(fwd, "float", 8, 132) == count(fwd, "float", 1, 600) == BARRIERS[name][0]
    assert count(bwd, "float", 1, 132) == BARRIERS[name][1]


def late_write_cell():
    """Two GEMM stages a frame, s read a frame back by h's group: h's backward (after the first barrier)
    adds into s's gradient a frame back, which s's group (moved to the end of the iteration) reads."""
    from rnngraph import Cell
    c = Cell("late_write")
    x, h, s = c.input("x", 4), c.state("h", 8), c.state("s", 8)
    hn = c.bind(h, c.tanh(c.linear(h.ago(1), "U_a", 8) + c.linear(x, "W", 8)) + s.ago(1), name="h")
    c.output(c.bind(s, c.sigmoid(c.linear(hn, "U_b", 8)) * s.ago(1), name="s"))
    return c.build()


def test_backward_loads_wait_for_a_later_group_adding_into_them():
    cell = late_write_cell()
    k = persistent_kernel(cell, loops(cell)[1], "float", 1, 8)
    loop = k.source[k.source.index("for (int s = 0; s < NF; ++s)"):]
    i = k.args.index(("grad", "s"))
    assert f"AT(pp{i}, ld{i}, 0, f)" not in loop[:loop.index("grid_barrier(count")]    # not before the barrier
    assert f"AT(pp{i}, ld{i}, 0, f)" in loop


def test_shared_memory_holds_the_blocks_weights_and_rows():
    """LSTM H=512, B=1 on 132 blocks: 4 features × 4 gates × 512 weights, x's row, 16 sums, 16 partials."""
    cell = load_cell("lstm", 8, 512)
    fwd, bwd = loops(cell)
    assert persistent_kernel(cell, fwd, "float", 1, 132).smem == 4 * (4 * 4 * 512 + 512 + 16 + max(16, THREADS // 32))
    assert persistent_kernel(cell, bwd, "float", 1, 132).smem == 4 * (4 * 2048 + 2048 + 4 + max(4, THREADS // 32))
    big = load_cell("lstm", 8, 2048)            # 16 MiB per 132 blocks: more than an SM's 227 KiB
    assert persistent_kernel(big, loops(big)[0], "float", 1, 132).smem > 227 * 1024


def test_what_a_persistent_kernel_cannot_run_is_said_by_name():
    """The plan does not admit it (one error naming the op); a loop item made by hand is refused the same way."""
    cell = load_cell("layernorm_lstm", 8, 16)
    with pytest.raises(RnnGraphError, match=r"^cell 'layernorm_lstm' does not admit loop strategy 'persistent': op mean10 "
                                            r"\(mean\) reduces over features inside the loop, .*; it admits stages$"):
        build_schedule(cell, loop="persistent")
    (by_hand,), _ = persistent_plan(build_schedule(cell, loop="stages"))
    assert "op mean10 (mean) reduces over features" in problem(cell, by_hand)
    assert problem(load_cell("lstm", 8, 16), loops(load_cell("lstm", 8, 16))[0]) is None


def test_vector_parameter_gradients_use_no_atomics():
    """Bit-for-bit reproducible training on the GPU: the bias sums add in a fixed order."""
    cell = load_cell("lstm", 8, 16)
    n = next(n for n in cell.graph if any(u == "b_hi" for u, _ in cell.reads(n)))
    slot = [u for u, _ in cell.reads(n)].index("b_hi")
    assert "atomicAdd" not in param_grad_kernel(cell, n, slot, "float")[1]


@pytest.mark.parametrize("name", [c for c in GEMM_CORES if not c.startswith("layernorm")])
def test_every_persistent_kernel_compiles(name):
    cell = load_cell(name, 8, 64)
    for lp in loops(cell):
        for ctype, B in (("float", 1), ("double", 8)):
            k = persistent_kernel(cell, lp, ctype, B, 132)
            nvrtc_compile(k.source, k.name)


def test_fused_kernels_compile():
    cell = load_cell("gru", 8, 16)
    group = next(it for st in build_schedule(cell, loop="stages").loop for it in st if isinstance(it, Fused))
    for spec in (fused_forward_kernel(cell, group.nodes), fused_backward_kernel(cell, group.nodes, set(cell.params))):
        nvrtc_compile(*reversed(spec.source("float")))
