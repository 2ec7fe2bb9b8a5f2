"""`rnngraph train --procs N`: real processes on the CPU, gloo through torch.distributed. The launcher, the
ranks' share of the streams, rank 0's checkpoints, resume across N, a killed rank, Ctrl-C and the errors.
The GPU path (--gpus, NCCL) is the same code with another communicator (tests/test_distributed.py checks
that one with a stand-in)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rnngraph.arrays import dropout_mask
from rnngraph.train.checkpoint import load_checkpoint
from rnngraph.train.loop import read_log
from rnngraph.train.ranks import Ranks
from rnngraph.train.distributed import World

td = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.skipif(not td.is_available() or not td.is_gloo_available(), reason="no gloo")

ROOT = Path(__file__).resolve().parents[1]
# float64, 2 layers with dropout between them and before the output layer: every rank draws its part.
RUN = ["train", "--hidden", "24", "--layers", "2", "--dropout", "0.2", "--streams", "8", "--bptt", "12",
       "--dtype", "float64", "--checkpoint-every", "5", "--progress-every", "0", "--epochs", "1"]


def rnngraph(*args, cwd, check=True, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-m", "rnngraph", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=300, **kw)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def losses(folder) -> np.ndarray:
    return read_log(folder)["loss"]


def test_two_processes_train_as_one_over_every_stream_and_resume_over_any_number(tmp_path):
    """N=2 gives one process's losses and validation bpc (float64, up to the order of the sums); a run
    cut at step 10 by 2 ranks, resumed by 1, cut at 20 and resumed by 2 follows the uninterrupted one."""
    rnngraph(*RUN, "--max-steps", "30", "--out", "one", cwd=tmp_path)
    two = rnngraph(*RUN, "--max-steps", "30", "--procs", "2", "--out", "two", cwd=tmp_path)
    assert "over 2 ranks" in two.stdout and two.stdout.count("done:") == 1 and two.stderr == ""
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-12)
    np.testing.assert_allclose(read_log(tmp_path / "two")["val_bpc"][-1], read_log(tmp_path / "one")["val_bpc"][-1],
                               rtol=1e-12)
    assert sorted(f.name for f in (tmp_path / "two").iterdir()) == ["checkpoint.npz", "log.csv", "log.json"]
    a, b = (load_checkpoint(tmp_path / d / "checkpoint.npz") for d in ("one", "two"))
    for k, v in a.arrays.items():                           # every stream's state, gathered in stream order
        np.testing.assert_allclose(b.arrays[k], v, rtol=1e-9, atol=1e-12, err_msg=k)

    rnngraph(*RUN, "--max-steps", "10", "--procs", "2", "--out", "cut", cwd=tmp_path)
    rnngraph("train", "--resume", "cut/checkpoint.npz", "--max-steps", "20", cwd=tmp_path)
    rnngraph("train", "--resume", "cut/checkpoint.npz", "--max-steps", "30", "--procs", "2", cwd=tmp_path)
    np.testing.assert_allclose(losses(tmp_path / "cut"), losses(tmp_path / "one"), rtol=1e-12)


def start(tmp_path, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "rnngraph", *RUN, "--procs", "2", "--checkpoint-every", "2",
                             "--out", "run", *extra], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,      # Ctrl-C as a terminal sends it, even where
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # pytest ignores it


def ranks_of(launcher: subprocess.Popen) -> dict:
    """rank -> pid of the processes the launcher started (found through /proc)."""
    found = {}
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == launcher.pid:
                env = dict(e.split("=", 1) for e in (d / "environ").read_text().split("\0") if "=" in e)
                found[int(env["RANK"])] = int(d.name)
        except (OSError, KeyError, IndexError, ValueError):
            pass
    return found


def wait_for_checkpoint(tmp_path, launcher) -> None:
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "checkpoint.npz").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.05)


STUCK = """
import sys, time
import numpy as np
from rnngraph.train.distributed import Gloo, PeerLost, World
rank, port = int(sys.argv[1]), int(sys.argv[2])
comm = Gloo(World(rank, 2, 0, "127.0.0.1", port), timeout_s=2.0)
if rank == 1:
    time.sleep(60)                      # joined, then never takes part: stuck, not gone
t0 = time.monotonic()
try:
    comm.allreduce_(np.ones(4))
    print("no error")
except PeerLost as e:
    print(f"{time.monotonic() - t0:.2f}|{e}")
"""


def test_a_stuck_rank_makes_the_others_collective_an_error_after_the_wait_limit_not_a_hang():
    from rnngraph.lab.launch import _free_port
    port, env = _free_port(), {**os.environ, "PYTHONPATH": str(ROOT)}
    ranks = [subprocess.Popen([sys.executable, "-c", STUCK, str(r), str(port)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    try:
        out, err = ranks[0].communicate(timeout=60)
    finally:
        ranks[1].kill()
        ranks[1].wait()
    waited, message = out.strip().split("|", 1)
    assert 1.5 < float(waited) < 15, (out, err)
    assert message.startswith("rank 0: an all-reduce failed (")
    assert message.endswith("); another rank stopped or is stuck (the wait limit is 2 s)")


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the ranks through /proc")
def test_a_killed_rank_stops_the_other_within_seconds_with_one_line_and_the_checkpoint_intact(tmp_path):
    launcher = start(tmp_path)
    wait_for_checkpoint(tmp_path, launcher)
    pids = ranks_of(launcher)
    assert sorted(pids) == [0, 1]
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    out, err = launcher.communicate(timeout=60)
    assert time.monotonic() - t0 < 15
    assert launcher.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    step = load_checkpoint(tmp_path / "run" / "checkpoint.npz").config["step"]
    assert step % 2 == 0
    assert lines[0] == ("rnngraph: error: rank 1: killed by SIGKILL; the other ranks were stopped; checkpoint "
                        f"run/checkpoint.npz (step {step}) is intact")
    assert not any(ranks_of(launcher).values())


def test_ctrl_c_stops_every_rank_and_says_how_to_continue(tmp_path):
    launcher = start(tmp_path)
    wait_for_checkpoint(tmp_path, launcher)
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130
    assert len(err.strip().splitlines()) == 1, err
    step = load_checkpoint(tmp_path / "run" / "checkpoint.npz").config["step"]
    assert err.strip() == (f"rnngraph: interrupted; checkpoint run/checkpoint.npz holds step {step}; continue "
                           "with rnngraph train --resume run/checkpoint.npz --procs 2")


@pytest.mark.parametrize("args, says", [
    (["--procs", "3"], "8 streams do not split evenly over 3 ranks; pass --streams 6 or 9 (a multiple of 3)"),
    (["--procs", "2", "--gpus", "2"], "pass --gpus N (GPUs, NCCL) or --procs N (CPU processes, gloo), not both"),
    (["--procs", "2", "--backend", "cupy"], "--procs runs on numpy, not --backend cupy; use --gpus instead"),
    (["--gpus", "2", "--backend", "numpy"], "--gpus runs on cupy, not --backend numpy; use --procs instead"),
    (["--procs", "2", "--mode", "graph"], "--procs runs on the CPU, where --mode graph does not; use --gpus for graph mode"),
])
def test_what_cannot_run_is_one_line_before_any_rank_starts(tmp_path, args, says):
    p = rnngraph(*RUN, *args, cwd=tmp_path, check=False)
    assert p.returncode == 2 and p.stderr.strip() == f"rnngraph: error: {says}" and not (tmp_path / "runs").exists()


def test_gpus_without_a_usable_gpu_says_so(tmp_path):
    from rnngraph.run.backends import gpu_problem
    if gpu_problem() is None:
        pytest.skip("a GPU is usable here")
    p = rnngraph(*RUN, "--gpus", "2", cwd=tmp_path, check=False)
    assert p.returncode == 2 and p.stderr.startswith("rnngraph: error: --gpus 2 needs GPUs: ")
    assert p.stderr.strip().endswith("on the CPU, --procs 2 runs 2 processes")


def test_a_rank_under_an_external_launcher_names_itself_and_checks_the_number(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "WORLD_SIZE": "4", "MASTER_PORT": "1"}
    p = subprocess.run([sys.executable, "-m", "rnngraph", *RUN, "--procs", "2"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip() == ("rnngraph: rank 1: error: --procs 2 under a launcher that started 4 ranks; give the "
                                "launcher's number or drop the option")


def test_dropout_parts_are_the_whole_batchs_mask():
    whole = dropout_mask(np.random.default_rng(3), (5, 8, 7), 0.3, np, np.float64)
    parts = [dropout_mask(np.random.default_rng(3), (5, 4, 7), 0.3, np, np.float64, window=(o, 8)) for o in (0, 4)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), whole)


def test_validation_parts_cover_every_stream_once_and_states_split_back():
    parts = [Ranks(World(r, 3)).part(10) for r in range(3)]
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 7), (7, 10)]
    h = np.arange(2 * 6 * 3.0).reshape(2, 6, 3)                      # [layers, streams, features]
    mine = [Ranks(World(r, 2)).my_states([None, (h, h + 1)], 6) for r in range(2)]
    np.testing.assert_array_equal(np.concatenate([m[1][1] for m in mine], axis=-2), h + 1)
    assert mine[0][0] is None


def test_a_divergence_found_by_the_checksums_stops_the_run_naming_the_ranks(tmp_path):
    from rnngraph.errors import RnnGraphError
    from rnngraph.train.loop import TrainConfig, Trainer

    class Diverged:                      # a stand-in communicator: rank 1 reports other parameters
        def allgather(self, values):
            return np.stack([values, values + 1.0])

        def allreduce_(self, buf, average=True):
            return buf

    cfg = TrainConfig(hidden=8, streams=4, bptt=8, max_steps=2, out=str(tmp_path / "r"), progress=False)
    trainer = Trainer(cfg, echo=lambda *a: None, ranks=Ranks(World(0, 2), Diverged()))
    with pytest.raises(RnnGraphError, match=r"at step 2 rank\(s\) 1 hold parameters that differ from rank 0's; "
                                            "no checkpoint was written yet"):
        trainer.run()
    assert not (tmp_path / "r" / "checkpoint.npz").exists()
    assert json.loads(json.dumps(trainer.history))[-1]["step"] == 2


def test_a_rank_refusing_at_the_start_is_the_line_and_the_other_run_is_kept(tmp_path):
    rnngraph(*RUN, "--max-steps", "2", "--out", "run", cwd=tmp_path)          # another run in the folder
    before = (tmp_path / "run" / "checkpoint.npz").read_bytes()
    p = rnngraph(*RUN, "--max-steps", "2", "--procs", "2", "--out", "run", cwd=tmp_path, check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("rnngraph: error: rank 0: run/checkpoint.npz already holds a checkpoint; ")
    assert p.stderr.strip().endswith("the other ranks were stopped; checkpoint run/checkpoint.npz (step 2) is intact")
    assert (tmp_path / "run" / "checkpoint.npz").read_bytes() == before


def test_under_torchrun_the_ranks_train_as_one_process_and_rank_0_alone_speaks(tmp_path):
    """torchrun (the launcher across machines) holds MASTER_PORT with its own store; gloo joins it."""
    from rnngraph.lab.launch import _free_port
    one = rnngraph(*RUN, "--max-steps", "6", "--out", "one", cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "-m", "rnngraph",
                        *RUN, "--max-steps", "6", "--procs", "2", "--out", "two"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("done:") == 1 and "× 2 ranks" in p.stdout, p.stdout
    assert one.stdout.count("done:") == 1
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-12)
