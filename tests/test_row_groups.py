"""Full-matrix persistent kernels split the batch into row groups, without a GPU: sequences never read one another,
so each group of G blocks runs its rows to the end, meeting only at its own barriers (bar[1 + group]). Run by the
emulator (cuda_on_cpu.py) one group after another against numpy's loop; which groups a GPU would run is said."""
import numpy as np
import pytest

from cuda_on_cpu import Emulated, needs_cxx
from rnngraph import load_cell
from rnngraph.errors import RnnGraphError
from rnngraph.run.backends import get_backend
from rnngraph.run.backends.cuda.persistent.kernels import ZERO_SOURCE, persistent_kernel
from rnngraph.run.backends.cuda.persistent.runner import (GROUP_FEWEST, GROUP_ROWS, GROUPS, chosen, full_groups,
                                                       padded_rows)
from rnngraph.run.executor import Executor
from test_loops import run_executor
from test_persistent import loops
from test_persistent_heads import assert_agree, problem_arrays

H200 = dict(sms=132, smem=227 * 1024)


def run_groups(cell, B, rows, dtype, tc=None, T=7, chunk=None, G=3):
    """(every array of a forward and backward by the emulated kernels, row groups of `rows` run one after another,
    the same by numpy 'stages', the backend); lengths ragged."""
    be = Emulated(G, "groups", rows, tensor_cores=tc)
    args, lengths = problem_arrays(cell, T, B, dtype), np.arange(B) * 5 % (T + 1)
    got = run_executor(Executor(cell, be, loop="persistent", chunk=chunk), *args, lengths)
    ref = Executor(cell, get_backend("numpy"), loop="stages", chunk=chunk)
    return got, run_executor(ref, *args, lengths), be


@needs_cxx
@pytest.mark.parametrize("name, B, rows, dtype, tc", [("lstm", 6, 2, "float64", False), ("gru", 12, 4, "float32", False),
                                                      ("peephole_lstm", 4, 1, "float64", False),
                                                      ("lstm", 32, 16, "bfloat16", True),
                                                      ("gru", 20, 10, "float16", True), ("mgu", 24, 8, "float32", False)])
def test_row_groups_compute_the_reference_one_group_after_another(name, B, rows, dtype, tc):
    """A group that read another's rows, or waited at its barrier, would read zeros or never finish."""
    cell = load_cell(name, 8, 16)
    got, want, be = run_groups(cell, B, rows, dtype, tc)
    assert_agree(got, want, dtype)
    assert [(k.row_groups, k.blocks, k.cooperative, k.tensor_cores) for k in be.ran] == [(B // rows, 3 * B // rows, True, tc)] * 2
    assert [k.resident for k in be.ran] == [tc] * 2       # on tensor cores the weights in registers (resident.py)


@needs_cxx
def test_row_groups_in_chunks():
    """Chunks of 1, 3 and 3 frames: each chunk's launch starts every group's barrier count from 0."""
    cell = load_cell("lstm", 8, 16)
    got, want, be = run_groups(cell, 8, 4, "float64", T=7, chunk=3)
    assert_agree(got, want, "float64")
    assert len(be.ran) == 6 and be.walked == [1, 3, 3, 3, 3, 1]


def test_each_group_meets_at_its_own_count():
    k = persistent_kernel(load_cell("lstm", 8, 16), loops(load_cell("lstm", 8, 16))[1], "float", 4, 3, 2)
    assert "unsigned int* count = bar + 1 + blockIdx.x / G;" in k.source and "grid_barrier(count," in k.source
    assert "b0 = (blockIdx.x / G) * NB" in k.source and "#define BT 8" in k.source
    assert "exchange(" not in k.source.split("__global__")[1]        # no tagged words across groups
    assert "for (int g = 0; g < groups; ++g) bar[1 + g] = 0u;" in ZERO_SOURCE


def test_which_row_groups_a_gpu_runs(monkeypatch):
    """Tensor cores: groups of GROUP_FEWEST to GROUP_ROWS rows dividing B, at least GROUPS where B allows, each on
    its share of the SMs (at most 64 blocks), the blocks dividing the units where that costs at most a quarter of
    them; CUDA cores: at most 8 rows a group."""
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_ROWS", raising=False)
    assert (GROUP_ROWS, GROUPS, GROUP_FEWEST) == (8, 4, 4)
    assert full_groups(4, True, 132, 512) == full_groups(6, True, 132, 512) == full_groups(9, True, 132, 512) == []
    assert full_groups(8, True, 132, 512) == [(4, 64)]                      # 2 groups of 4 on 64 blocks each
    assert full_groups(16, True, 132, 512) == [(4, 32), (8, 64)]            # 4 groups of 4, then 2 of 8
    assert full_groups(32, True, 132, 512) == [(8, 32), (16, 64)]          # 4 groups of 8 first
    assert full_groups(64, True, 132, 512) == [(8, 16), (16, 32), (32, 64)]   # then fewer groups: finer weights
    assert full_groups(48, True, 132, 512) == [(8, 16), (12, 32), (16, 44), (24, 64)]
    assert full_groups(256, True, 132, 512) == [(8, 4), (16, 8), (32, 16), (64, 32), (128, 64)]
    assert full_groups(100, True, 132, 512) == [(5, 4), (10, 13), (20, 26), (25, 32), (50, 64)]
    assert full_groups(64, True, 132, 400) == [(8, 16), (16, 25), (32, 50)]   # 25 of 33 blocks, 50 of 64 divide 400
    assert full_groups(8, False, 132, 512) == []
    assert full_groups(24, False, 132, 512) == [(8, 44)]
    assert full_groups(137, False, 132, 512) == []                          # no group of 8 rows or fewer on 132 SMs
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_ROWS", "8")
    assert full_groups(16, True, 132, 512) == [(8, 64)]
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_ROWS")
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_BLOCKS", "16")        # a group's most blocks
    assert full_groups(64, True, 132, 512) == [(8, 16), (16, 16), (32, 16)]
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_ROWS", "eight")
    with pytest.raises(RnnGraphError, match="RNNGRAPH_PERSISTENT_ROWS must be a whole number of rows"):
        full_groups(16, True, 132, 512)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_ROWS", "16")
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_BLOCKS", "0")
    with pytest.raises(RnnGraphError, match="RNNGRAPH_PERSISTENT_BLOCKS must be a whole number of blocks >= 1"):
        full_groups(64, True, 132, 512)


def test_a_group_whose_weights_do_not_fit_gives_way_to_fewer_groups():
    """bfloat16 LSTM, H = 1024, B = 256: groups of 16 rows (16 groups of 8 blocks) hold 1 MiB of weights a block;
    the first that fits is taken."""
    import ml_dtypes
    cell = load_cell("lstm", 32, 1024)
    k = chosen(cell, loops(cell)[0], 256, ml_dtypes.bfloat16, **H200)
    assert k.smem <= H200["smem"] and k.row_groups < 16 and k.tensor_cores


def test_groups_holding_their_weights_in_registers_run_on_fewer_blocks(monkeypatch):
    """bfloat16 LSTM, H = 768, B = 16: 2 groups of 8 rows hold their weights in registers on 64 blocks each and
    still on 48 (16 units a block: 4·16 weight rows of 768 halves), the fewest from 48 (3/4 of 64, runner.FEWER_BLOCKS)
    that divide the units, so they run on 48. RNNGRAPH_PERSISTENT_BLOCKS keeps the count asked for; H = 512 keeps its
    32 blocks a group (no count from 24 to 31 divides 512)."""
    import ml_dtypes
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_BLOCKS", raising=False)
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_ROWS", raising=False)
    cell = load_cell("lstm", 768, 768)
    for loop in loops(cell):
        k = chosen(cell, loop, 16, ml_dtypes.bfloat16, **H200)
        assert (k.row_groups, k.blocks, k.resident, k.tensor_cores) == (2, 96, True, True)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_BLOCKS", "64")
    assert chosen(cell, loops(cell)[1], 16, ml_dtypes.bfloat16, **H200).blocks == 128
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_BLOCKS")
    narrow = load_cell("lstm", 512, 512)
    k = chosen(narrow, loops(narrow)[1], 16, ml_dtypes.bfloat16, **H200)
    assert (k.row_groups, k.blocks, k.resident) == (4, 128, True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_batch_that_splits_into_no_groups_runs_padded_to_one_that_does(monkeypatch, dtype):
    """Beyond one tile of 16 rows, B = 17 or 31 would run one group of B rows on tensor cores (measured 1.4 and 1.9
    times B = 32's time): such a call runs padded to the next multiple of 8 rows, which splits into groups. B that
    split (33 into 3 groups of 11), multiples of 8, one tile, the per-head kernels and CUDA cores keep B."""
    import ml_dtypes
    for k in ("RNNGRAPH_PERSISTENT_ROWS", "RNNGRAPH_PERSISTENT_BLOCKS", "RNNGRAPH_PERSISTENT_TENSOR_CORES"):
        monkeypatch.delenv(k, raising=False)
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    cell = load_cell("lstm", 256, 256)
    loop = loops(cell)[0]
    rows = {B: padded_rows(cell, loop, B, dt, **H200) for B in (5, 13, 16, 17, 20, 23, 24, 31, 32, 33, 41, 61, 127)}
    assert rows == {5: 5, 13: 13, 16: 16, 17: 24, 20: 20, 23: 24, 24: 24, 31: 32, 32: 32, 33: 33, 41: 48, 61: 64,
                    127: 128}
    assert chosen(cell, loop, 31, dt, **H200).row_groups == 1 and chosen(cell, loop, 32, dt, **H200).row_groups == 4
    heads = load_cell("slstm", 256, 256, heads=4)
    assert padded_rows(heads, loops(heads)[0], 31, dt, **H200) == 31
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", "0")       # float32 on CUDA cores (groups of 8 at most)
    assert padded_rows(cell, loop, 31, "float32", **H200) == 31


def test_an_executor_asks_the_gpu_room_for_its_rows(monkeypatch):
    """Executor.batch_rows through a backend holding the cupy room's runners (Backend.batch_rows ->
    runner.batch_rows, on an H200's attributes): B = 31 runs as 32 where the persistent kernel runs it ('auto' and
    'persistent'), as 31 where 'stages' runs it."""
    from rnngraph.run.backends.cuda import persistent
    from rnngraph.run.backends.cuda.backend import ROOM, CupyBackend
    from rnngraph.run.backends.numpy_backend import NumpyBackend
    from rnngraph.run.backends.cuda.persistent import runner
    for k in ("RNNGRAPH_PERSISTENT_ROWS", "RNNGRAPH_PERSISTENT_BLOCKS", "RNNGRAPH_PERSISTENT_TENSOR_CORES"):
        monkeypatch.delenv(k, raising=False)
    facts = {"MultiProcessorCount": H200["sms"], "MaxSharedMemoryPerBlockOptin": H200["smem"], "ComputeCapability": 90,
             "CooperativeLaunch": 1}
    monkeypatch.setattr(runner, "gpu_of", lambda be: facts)

    class H200Room(NumpyBackend):
        RUNNERS, kernel_loops = ROOM, CupyBackend.kernel_loops
    assert ROOM[type(loops(load_cell("lstm", 4, 4))[0])] is persistent     # the room's module for the strategy
    cell = load_cell("lstm", 64, 256)
    rows = {loop: Executor(cell, H200Room(), loop=loop).batch_rows(31, np.dtype("float32"))
            for loop in ("auto", "persistent", "stages")}
    assert rows == {"auto": 32, "persistent": 32, "stages": 31}
