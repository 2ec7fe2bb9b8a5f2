"""The NCCL communicator (train/distributed.py's Nccl) on a real NCCL communicator of one rank, which any GPU
can hold: cupyx.distributed's backend built as the ranks build it, its all-reduce and all-gather on the
dtypes training uses, a collective that outwaits its limit aborting the communicator, and a whole training
run through it equal to one process's. Ranks on two GPUs are tests/test_gpu_ranks.py's (marker gpus2).

Each case runs in its own process with a time limit, so that a hang inside NCCL fails the test instead of
stopping the suite."""
import os
import subprocess
import sys
import textwrap

import pytest

from test_ranks import ROOT

pytestmark = pytest.mark.gpu

START = """
import time
import numpy as np
import cupy as cp
from rnngraph.lab.launch import _free_port
from rnngraph.train.distributed import Nccl, PeerLost, World
world = World(0, 1, 0, "127.0.0.1", _free_port())
"""


def run(code: str, timeout: float = 120) -> str:
    """Runs START + code in a fresh Python; returns its stdout (the test fails on an error or a hang)."""
    p = subprocess.run([sys.executable, "-c", START + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_one_rank_collectives_keep_the_values_and_their_dtype():
    """The sum over one rank is the buffer itself (average: divided by 1); all-gather gives [1, n] float64."""
    out = run("""
        comm = Nccl(world, timeout_s=60)
        for dtype in (cp.float32, cp.float64):
            x = cp.arange(1000, dtype=dtype) / 7
            y = x.copy()
            assert comm.allreduce_(y) is y and y.dtype == dtype
            assert cp.array_equal(y, x), dtype
            assert cp.array_equal(comm.allreduce_(y, average=False), x)
        g = comm.allgather(np.array([1.5, -2.25, 3.0]))
        assert isinstance(g, np.ndarray) and g.dtype == np.float64 and g.tolist() == [[1.5, -2.25, 3.0]]
        print("ok")
    """)
    assert out.strip() == "ok"


def test_a_collective_that_outwaits_its_limit_aborts_the_communicator_and_names_the_rank():
    """A kernel that spins ~2 s holds the stream; an all-reduce queued behind it with a 0.3 s limit aborts
    the communicator (NCCL's own abort) at 0.3 s, well before the kernel ends, and is a PeerLost error.
    The abort itself waits for that kernel (measured on the H200: the error comes at ~2 s); a collective
    stuck on a lost peer is NCCL's own kernel, which the abort stops."""
    out = run("""
        comm = Nccl(world, timeout_s=0.3)
        spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long cycles) {
            long long t0 = clock64();
            while (clock64() - t0 < cycles) {}
        }''', "spin")
        y = cp.ones(1 << 20, cp.float32)
        comm.allreduce_(y)                              # compiles and warms the path
        aborted = []

        class Timed:                                    # NCCL's communicator, its abort timed
            def __init__(self, nccl):
                self.nccl = nccl

            def __getattr__(self, name):
                return getattr(self.nccl, name)

            def abort(self):
                aborted.append(time.monotonic() - t0)
                self.nccl.abort()

        comm.backend._comm = Timed(comm.backend._comm)
        spin((1,), (1,), (np.int64(4_000_000_000),))    # ~2 s at the H200's ~1.98 GHz
        t0 = time.monotonic()
        try:
            comm.allreduce_(y)
            print("no error")
        except PeerLost as e:
            print(f"{aborted[0]:.2f}|{time.monotonic() - t0:.2f}|{e}")
    """)
    aborted_at, raised_at, message = out.strip().split("|", 2)
    assert 0.3 <= float(aborted_at) < 1.0 and float(raised_at) < 10, out
    assert message == ("rank 0: an all-reduce waited 0.3 s for the other ranks; one of them stopped or is stuck; "
                       "the communicator was aborted")


def test_a_run_through_a_one_rank_nccl_communicator_is_one_process(tmp_path):
    """The trainer's every collective through NCCL (the loss mean, the flat gradient buffer's all-reduce,
    the validation sums, the gathered states of each checkpoint, the checksums): the same losses,
    validation bpc and checkpoint as a run without ranks, in float64 with dropout, graph mode (to 1e-10:
    atomic adds make neither run bit-reproducible)."""
    out = run(f"""
        from rnngraph.train.checkpoint import load_checkpoint
        from rnngraph.train.loop import TrainConfig, Trainer, read_log
        from rnngraph.train.ranks import Ranks
        base = dict(hidden=32, layers=2, dropout=0.2, streams=8, bptt=16, max_steps=12, checkpoint_every=5,
                    backend="cupy", mode="graph", dtype="float64", progress=False)
        plain = Trainer(TrainConfig(**base, out="{tmp_path}/plain"), echo=lambda *a: None)
        plain.run()
        ranks = Ranks(world, Nccl(world, timeout_s=60))
        nccl = Trainer(TrainConfig(**base, out="{tmp_path}/nccl"), echo=lambda *a: None, ranks=ranks)
        nccl.run()
        a, b = read_log("{tmp_path}/plain"), read_log("{tmp_path}/nccl")
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-10)
        np.testing.assert_allclose(b["val_bpc"][~np.isnan(b["val_bpc"])], a["val_bpc"][~np.isnan(a["val_bpc"])],
                                   rtol=1e-10)
        ca, cb = load_checkpoint("{tmp_path}/plain/checkpoint.npz"), load_checkpoint("{tmp_path}/nccl/checkpoint.npz")
        assert cb.config["step"] == ca.config["step"] == 12
        assert sorted(cb.arrays) == sorted(ca.arrays)
        for name in ca.arrays:
            np.testing.assert_allclose(cb.arrays[name], ca.arrays[name], rtol=1e-10, atol=1e-13, err_msg=name)
        assert ranks.reduces == 12 and ranks.reduce_s > 0
        print("ok", len(a["loss"]))
    """, timeout=300)
    assert out.split() == ["ok", "12"]


def test_under_torchrun_the_rendezvous_takes_the_port_after_torchruns_own_store(tmp_path):
    """torchrun's agent listens on MASTER_PORT; NCCL's rendezvous store then listens on the next port,
    joins, all-reduces and lets the process exit."""
    from rnngraph.lab.launch import _free_port
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import cupy as cp
        from rnngraph.train.distributed import Nccl, World
        world = World.from_env()
        assert world.torchrun and world.size == 1 and world.store_port == world.port + 1, world
        y = cp.arange(5, dtype=cp.float32)
        Nccl(world, timeout_s=60).allreduce_(y)
        assert y.tolist() == [0, 1, 2, 3, 4]
        print("ok", world.store_port - world.port)
    """))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
                        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script)], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["ok", "1"]
