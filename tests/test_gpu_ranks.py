"""`rnngraph train --gpus N` on GPUs, NCCL through cupyx.distributed: the same run whatever N, resume across
N, a killed rank. The two-GPU tests need two GPUs (marker gpus2); the one-GPU test runs on any GPU."""
import os
import signal
import time

import numpy as np
import pytest

from rnngraph.train.checkpoint import load_checkpoint
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
    import subprocess
    import sys
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
