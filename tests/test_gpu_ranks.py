"""`rnngraph train --gpus N` on GPUs, NCCL through cupyx.distributed: the same run whatever N, resume across
N, a killed rank. The two-GPU tests need two GPUs (marker gpus2); the one-GPU tests run on any GPU: --gpus 1,
and two ranks sharing one GPU (which NCCL refuses) with gloo carrying their buffers through the host, so the
ranks' GPU training path runs whole on one GPU. tests/test_gpu_nccl.py checks NCCL itself, one rank."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from rnngraph.train.checkpoint import load_checkpoint
from rnngraph.train.loop import read_log
from test_ranks import ROOT, losses, ranks_of, rnngraph, wait_for_checkpoint

pytestmark = pytest.mark.gpu
RUN = ["train", "--hidden", "32", "--layers", "2", "--dropout", "0.2", "--streams", "8", "--bptt", "16",
       "--dtype", "float64", "--checkpoint-every", "5", "--progress-every", "0", "--epochs", "1",
       "--mode", "graph"]


def test_one_gpu_is_one_process(tmp_path):
    p = rnngraph(*RUN, "--max-steps", "10", "--gpus", "1", "--out", "one", cwd=tmp_path)
    rnngraph(*RUN, "--max-steps", "10", "--backend", "cupy", "--out", "plain", cwd=tmp_path)
    assert "ranks" not in p.stdout
    np.testing.assert_allclose(losses(tmp_path / "one"), losses(tmp_path / "plain"), rtol=1e-10)


TWO_ON_ONE = """
import sys
import cupy as cp
from rnngraph.train.distributed import Gloo, World
from rnngraph.train.loop import TrainConfig, Trainer
from rnngraph.train.ranks import Ranks


class GpuOverGloo(Gloo):
    # gloo carrying the cupy gradient buffer through the host (the all-gathers already take host numbers)
    def allreduce_(self, buf, average=True):
        host = cp.asnumpy(buf)
        super().allreduce_(host, average)
        buf[...] = cp.asarray(host)
        return buf


who, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfg = TrainConfig(hidden=32, layers=2, dropout=0.2, streams=8, bptt=16, dtype="float64", checkpoint_every=5,
                  max_steps=12, epochs=1, backend="cupy", mode="graph", progress=False, out=out)
if who == "one":
    Trainer(cfg, echo=lambda *a: None).run()
else:
    world = World(int(who), 2, 0, "127.0.0.1", port)
    Trainer(cfg, echo=lambda *a: None, ranks=Ranks(world, GpuOverGloo(world))).run()
"""


def test_two_ranks_on_one_gpu_train_as_one_process(tmp_path):
    """Two ranks of 4 streams each on one GPU (graph mode, float64, dropout: each rank draws its part of the
    mask on the GPU) give one process's losses, validation bpc and checkpoint with all 8 streams' states,
    to 1e-10 (atomic adds make neither run bit-reproducible)."""
    pytest.importorskip("torch.distributed")
    from rnngraph.lab.launch import _free_port
    env, port = {**os.environ, "PYTHONPATH": str(ROOT)}, str(_free_port())

    def start(who, out):
        return subprocess.Popen([sys.executable, "-c", TWO_ON_ONE, who, port, str(tmp_path / out)], env=env,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    for p in [start("one", "one"), *(start(r, "two") for r in ("0", "1"))]:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-10)
    np.testing.assert_allclose(read_log(tmp_path / "two")["val_bpc"][-1], read_log(tmp_path / "one")["val_bpc"][-1],
                               rtol=1e-10)
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.npz") for d in ("one", "two"))
    assert b.config["step"] == a.config["step"] == 12 and sorted(b.arrays) == sorted(a.arrays)
    for k, v in a.arrays.items():                           # every stream's state, gathered in stream order
        np.testing.assert_allclose(b.arrays[k], v, rtol=1e-9, atol=1e-12, err_msg=k)


@pytest.mark.gpus2
def test_two_gpus_train_as_one_and_resume_over_any_number(tmp_path):
    """float64: the losses of 2 GPUs equal one GPU's to 1e-10 (atomic adds make neither bit-reproducible);
    cut by 2 ranks at step 10, resumed by 1 to 20 and by 2 to 30, the run follows the uninterrupted one."""
    rnngraph(*RUN, "--max-steps", "30", "--backend", "cupy", "--out", "one", cwd=tmp_path)
    two = rnngraph(*RUN, "--max-steps", "30", "--gpus", "2", "--out", "two", cwd=tmp_path)
    assert "× 2 ranks (the gradients' all-reduce: " in two.stdout
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-10)
    rnngraph(*RUN, "--max-steps", "10", "--gpus", "2", "--out", "cut", cwd=tmp_path)
    rnngraph("train", "--resume", "cut/checkpoint.npz", "--max-steps", "20", "--backend", "cupy", cwd=tmp_path)
    rnngraph("train", "--resume", "cut/checkpoint.npz", "--max-steps", "30", "--gpus", "2", cwd=tmp_path)
    np.testing.assert_allclose(losses(tmp_path / "cut"), losses(tmp_path / "one"), rtol=1e-10)


@pytest.mark.gpus2
def test_a_killed_gpu_rank_stops_the_other_with_one_line(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-m", "rnngraph", *RUN, "--gpus", "2", "--checkpoint-every", "2",
                                 "--out", "run"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(tmp_path, launcher)
    os.kill(ranks_of(launcher)[1], signal.SIGKILL)
    t0 = time.monotonic()
    _, err = launcher.communicate(timeout=60)
    assert time.monotonic() - t0 < 15 and launcher.returncode == 2
    assert err.strip().startswith("rnngraph: error: rank 1: killed by SIGKILL; the other ranks were stopped; ")
    assert len(err.strip().splitlines()) == 1
    assert load_checkpoint(tmp_path / "run" / "checkpoint.npz").config["step"] % 2 == 0
