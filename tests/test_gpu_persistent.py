"""Loop strategy 'persistent' on the GPU (one cooperative kernel per direction) against the numpy float64
reference running 'stages': built-in cells with a GEMM core, random user cells, ragged batches, chunked
calls, sizes up to what fits on chip, bit-identical reruns, replay after an in-place update, fallbacks."""
import warnings

import numpy as np
import pytest

from rnngraph.nn.recurrent import Recurrent
from test_gpu_loops import TOL, agree, calls, pair

pytestmark = pytest.mark.gpu
CELLS = ["lstm", "gru", "mgu", "peephole_lstm", "cifg_lstm", "rnn_tanh", "rnn_relu"]


def ran_persistent(layer):
    assert layer.loop_strategy == "persistent", layer.loop_note


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", ["staged", "graph"])
@pytest.mark.parametrize("cell", CELLS)
def test_builtins_match_the_reference(cell, mode, dtype):
    ref, gpu = pair(cell, "persistent", 5, 8, dtype, mode, num_layers=2, bidirectional=True)
    x = np.random.default_rng(3).standard_normal((19, 3, 5))
    agree(ref, gpu, [x], np.array([19, 11, 1]), dtype, f"{cell}/{mode} ragged")
    ran_persistent(gpu)
    agree(ref, gpu, [x[:7], x[7:14], x[14:]], None, dtype, f"{cell}/{mode} chunked")   # graph: replays


SIZES = [(T, B, H) for T in (1, 7, 100) for B in (1, 3, 8) for H in (64, 512, 1000)]


@pytest.mark.parametrize("T, B, H", SIZES, ids=[f"T{T}-B{B}-H{H}" for T, B, H in SIZES])
def test_lstm_sizes_in_float32(T, B, H):
    """Units split unevenly over the blocks (H = 1000), several weight rows per warp, B = 8 rows."""
    ref, gpu = pair("lstm", "persistent", 32, H, "float32", "graph")
    x = np.random.default_rng(5).standard_normal((T, B, 32))
    agree(ref, gpu, [x], None, "float32", f"T={T} B={B} H={H}")
    ran_persistent(gpu)


GEMM_SPOILS = ["a ⊙ σ(U·h@t-k)", "b + V·h@t-k", "b from another state g"]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spoil", GEMM_SPOILS)
def test_random_user_cells(spoil, seed):
    """Random cells with a GEMM on a state read 1-3 frames back (a second state beside it), in float64."""
    from test_random_forms import random_cell
    cell, *_, what = random_cell(seed, spoil)
    ref, gpu = pair(cell, "persistent", cell.inputs["x"], cell.op(cell.outputs[0]).size, "float64", "graph")
    x = np.random.default_rng(seed).standard_normal((13, 3, cell.inputs["x"]))
    agree(ref, gpu, [x], np.array([13, 6, 1]), "float64", what)
    ran_persistent(gpu)
    agree(ref, gpu, [x[:4], x[4:]], None, "float64", what + " chunked")


def test_a_gradient_added_a_frame_back_by_a_later_group():
    from test_persistent import late_write_cell
    ref, gpu = pair(late_write_cell(), "persistent", 4, 8, "float64", "graph")
    x = np.random.default_rng(8).standard_normal((11, 3, 4))
    agree(ref, gpu, [x], np.array([11, 5, 2]), "float64", "late write")
    ran_persistent(gpu)


def test_gradients_are_bit_identical_run_to_run():
    import cupy
    runs = []
    for _ in range(2):
        ref, gpu = pair("lstm", "persistent", 16, 512, "float32", "graph")
        runs.append(calls(gpu, [np.random.default_rng(2).standard_normal((50, 4, 16))], None, cupy, "float32"))
        ran_persistent(gpu)
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_replay_after_an_in_place_update():
    ref, gpu = pair("gru", "persistent", 6, 64, "float64", "graph")
    x = np.random.default_rng(6).standard_normal((12, 2, 6))
    agree(ref, gpu, [x], None, "float64", "before")
    for p, q in zip(ref.parameters().values(), gpu.parameters().values()):
        p *= 0.5
        q *= 0.5            # in place: the recorded graph reads the same arrays
    agree(ref, gpu, [x], None, "float64", "after")
    ran_persistent(gpu)


def test_a_batch_of_no_row_groups_runs_padded():
    """B = 31 splits into no groups of 4 to 8 rows: the call runs as 32 rows (runner.batch_rows), the added
    sequence of length 0, and agrees with the reference (float32 in 3xTF32, H = 256, ragged lengths)."""
    ref, gpu = pair("lstm", "persistent", 16, 256, "float32", "graph")
    x = np.random.default_rng(4).standard_normal((9, 31, 16))
    agree(ref, gpu, [x], np.arange(31) % 10, "float32", "B=31")
    ran_persistent(gpu)
    assert gpu._last[3].Bp == 32


def test_too_large_falls_back_to_stages_and_says_why(monkeypatch):
    """float32 beyond 8 rows: row groups on CUDA cores, from 32 rows on tensor cores in 3xTF32 (up to 256 rows); on CUDA
    cores alone (RNNGRAPH_PERSISTENT_TENSOR_CORES=0) B = 139 splits into no groups of 8 rows on 132 SMs."""
    ref, gpu = pair("lstm", "persistent", 8, 64, "float32", "graph")
    x = np.random.default_rng(1).standard_normal((5, 9, 8))       # B = 9 > 8 rows: 3 row groups of 3
    agree(ref, gpu, [x], np.arange(9) % 6, "float32", "B=9")
    ran_persistent(gpu)
    x = np.random.default_rng(1).standard_normal((3, 137, 8))
    agree(ref, gpu, [x], None, "float32", "B=137")                # 3xTF32 in row groups, B padded to its bucket
    ran_persistent(gpu)
    monkeypatch.setenv("RNNGRAPH_PERSISTENT_TENSOR_CORES", "0")
    x = np.random.default_rng(2).standard_normal((3, 139, 8))     # a new shape (the loop chosen again), B prime
    agree(ref, gpu, [x], None, "float32", "B=139 on CUDA cores")
    assert gpu.loop_strategy == "stages" and "no such row groups" in gpu.loop_note
    monkeypatch.delenv("RNNGRAPH_PERSISTENT_TENSOR_CORES")
    x = np.random.default_rng(3).standard_normal((2, 257, 8))
    agree(ref, gpu, [x], None, "float32", "B=257")
    assert gpu.loop_strategy == "stages" and "at most 256" in gpu.loop_note
    big = Recurrent("lstm", 8, 2048, backend="cupy", mode="graph", loop="persistent")
    big(big.backend.asarray(np.zeros((2, 8, 8), "float32")))
    assert big.loop_strategy == "stages" and "KiB of shared memory" in big.loop_note


def test_a_refused_launch_warns_once_and_runs_stages(monkeypatch):
    from rnngraph.errors import RnnGraphWarning
    from rnngraph.run.backends.cuda.persistent import runner as persistent
    monkeypatch.setattr(persistent, "device", lambda i: {"CooperativeLaunch": 0, "MultiProcessorCount": 1,
                                                         "MaxSharedMemoryPerBlockOptin": 1 << 20, "ComputeCapability": 90})
    monkeypatch.setattr(persistent, "_REFUSED", set())
    with pytest.warns(RnnGraphWarning, match="runs frame by frame: this GPU cannot launch cooperative kernels"):
        ref, gpu = pair("lstm", "persistent", 4, 16, "float64", "staged")
        agree(ref, gpu, [np.random.default_rng(0).standard_normal((6, 2, 4))], None, "float64", "refused")
    assert gpu.loop_strategy == "stages" and "cooperative" in gpu.loop_note
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpu(gpu.backend.asarray(np.zeros((6, 2, 4))))             # said once


def test_auto_picks_persistent_on_the_gpu():
    layer = Recurrent("lstm", 4, 32, backend="cupy", mode="graph")
    layer(layer.backend.asarray(np.zeros((3, 2, 4), "float32")))
    assert layer.loop_strategy == "persistent" and layer.loop_note is None
    assert TOL["float32"] == 1e-4
