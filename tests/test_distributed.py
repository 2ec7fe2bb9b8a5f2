"""Data parallel training's host side (rnngraph/train/distributed.py, rnngraph/distributed.py) without GPUs:
the launcher's environment, the split of streams, the flat gradient buffer and the averaging rule, the
checksum comparison, a collective that waits too long, and the errors. The NCCL path itself runs only on
two or more GPUs."""
import types
from pathlib import Path

import numpy as np
import pytest

import rnngraph.distributed as dist
from rnngraph.arrays import float_dtype
from rnngraph.errors import RnnGraphError
from rnngraph.train.distributed import FlatGrads, Nccl, World, checksum, disagreeing, share
from rnngraph.train.ranks import Ranks


def test_the_world_comes_from_the_launchers_variables():
    assert World.from_env({}) == World()                                       # one process
    w = World.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0",
                        "MASTER_PORT": "4000"})
    assert w == World(3, 4, 1, "node0", 4000)
    assert World.from_env({"RANK": "1", "WORLD_SIZE": "2"}) == World(1, 2, 1, "127.0.0.1", 29500)
    assert w.store_port == 4000                          # NCCL's rendezvous: MASTER_PORT, free under our launcher
    under_torchrun = World.from_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "4000",
                                     "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert under_torchrun.torchrun and under_torchrun.store_port == 4001    # torchrun's store holds 4000


@pytest.mark.parametrize("torchrun, fix", [(False, "set MASTER_PORT to a free port"),
                                           (True, "pass torchrun a --master-port whose next port is free too")])
def test_a_rendezvous_port_in_use_is_one_error_before_nccl_starts(torchrun, fix):
    import socket
    from rnngraph.train.distributed import _check_free
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        world = World(0, 2, 0, "127.0.0.1", port - 1 if torchrun else port, torchrun)
        with pytest.raises(RnnGraphError, match=f"rank 0: NCCL's rendezvous cannot listen on 127.0.0.1:{port} ") as e:
            _check_free(world)
    assert str(e.value).endswith(fix)
    _check_free(world)                                   # free again
    with pytest.raises(RnnGraphError, match="MASTER_ADDR must name rank 0's machine"):
        _check_free(World(0, 2, 0, "192.0.2.1", port))   # an address no interface here holds (TEST-NET-1)


@pytest.mark.parametrize("env, says", [
    ({"RANK": "0"}, "needs WORLD_SIZE in the environment (set: RANK)"),
    ({"MASTER_ADDR": "x"}, "needs RANK and WORLD_SIZE"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 and WORLD_SIZE=2: a rank runs from 0 to WORLD_SIZE - 1"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' in the environment is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT a TCP port"),
])
def test_an_incomplete_or_inconsistent_environment_is_one_error(env, says):
    with pytest.raises(RnnGraphError, match=None) as e:
        World.from_env(env)
    assert says in str(e.value)


def test_streams_split_evenly_and_cover_every_stream_once():
    parts = [share(64, World(r, 4)) for r in range(4)]
    assert [(p.start, p.stop) for p in parts] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    with pytest.raises(RnnGraphError, match="10 streams do not split evenly over 4 ranks; pass --streams 8 or 12"):
        share(10, World(0, 4))
    with pytest.raises(RnnGraphError, match="pass --streams 4 "):
        share(3, World(0, 4))


def test_the_flat_buffer_packs_every_gradient_in_name_order_and_views_it_back():
    bf16 = float_dtype("bfloat16", half=True)
    grads = {"w": np.arange(6.0).reshape(2, 3).astype(bf16), "b": np.array([7.0, 8.0], np.float32)}
    flat = FlatGrads(np, {k: g.shape for k, g in grads.items()}, {k: g.dtype for k, g in grads.items()})
    assert flat.dtype == np.float32 and flat.names == ["b", "w"]                 # half widened to float32
    np.testing.assert_array_equal(flat.pack(grads), [7, 8, 0, 1, 2, 3, 4, 5])
    back = flat.unpack()
    assert back["w"].shape == (2, 3) and np.shares_memory(back["w"], flat.buffer)
    assert FlatGrads(np, {"a": (2,)}, {"a": np.float64}).dtype == np.float64
    with pytest.raises(RnnGraphError, match=r"gradients \['c'\] do not match"):
        flat.pack({**grads, "c": np.zeros(1)})


class FakeStream:
    def __init__(self, done: bool):
        self.done = done

    def record(self):
        return types.SimpleNamespace(done=self.done)


def fake_nccl(world, others, done=True, timeout_s=5.0):
    """An Nccl on numpy whose backend adds `others` (the other ranks' buffers) in its all-reduce and
    gathers them after this rank's values in its all-gather."""
    comm = Nccl.__new__(Nccl)
    aborted = []
    backend = types.SimpleNamespace(
        all_reduce=lambda src, dst, op, stream: dst.__iadd__(sum(others)),
        all_gather=lambda src, dst, n, stream: dst.__setitem__(slice(None), np.stack([src, *others])),
        _comm=types.SimpleNamespace(abort=lambda: aborted.append(True)))
    cp = types.SimpleNamespace(asarray=np.asarray, asnumpy=np.asarray, zeros=np.zeros,
                               cuda=types.SimpleNamespace(get_current_stream=lambda: FakeStream(done)))
    comm.cp, comm.world, comm.timeout_s, comm.backend = cp, world, timeout_s, backend
    return comm, aborted


def test_the_all_reduce_averages_as_one_process_with_every_stream_would():
    """Each rank's loss is the mean over its equal share of the streams: the mean over all is the ranks' mean."""
    comm, _ = fake_nccl(World(0, 3), [np.array([3.0, 6.0]), np.array([0.0, 3.0])])
    np.testing.assert_array_equal(comm.allreduce_(np.array([0.0, 0.0])), [1.0, 3.0])


def test_a_collective_that_waits_too_long_aborts_and_names_the_rank():
    comm, aborted = fake_nccl(World(1, 2), [np.zeros(2)], done=False, timeout_s=0.05)
    with pytest.raises(RnnGraphError, match="rank 1: an all-reduce waited 0.05 s for the other ranks"):
        comm.allreduce_(np.zeros(2))
    assert aborted == [True]


def test_checksums_name_the_ranks_that_diverged():
    p = {"w": np.array([1.0, 2.0]), "b": np.array([0.5])}
    c = checksum(np, p)
    np.testing.assert_array_equal(c, [3.5, 5.25])
    assert disagreeing([c, c, c]) == [] and disagreeing([c, c, c + [0, 1e-12]]) == [2]


@pytest.fixture
def state(monkeypatch):
    s = {}
    monkeypatch.setattr(dist, "_STATE", s)
    return s


def test_the_public_api_is_a_no_op_for_one_process(state, monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(RnnGraphError, match=r"call rnngraph.distributed.init\(\) first"):
        dist.rank()
    assert dist.init() == World() and (dist.rank(), dist.world_size(), dist.share(6)) == (0, 1, slice(0, 6))
    g = {"w": np.ones(3)}
    assert dist.allreduce_(g) is g and dist.check_same(g, 1) is None


def test_the_public_api_averages_in_place_and_checks_the_ranks_agree(state):
    comm, _ = fake_nccl(World(0, 2), [np.array([3.0, 3.0, 3.0, 1.0])])
    state.update(ranks=Ranks(World(0, 2), comm))
    grads = {"w": np.ones((1, 3)), "b": np.array([5.0])}
    w = grads["w"]
    dist.allreduce_(grads)
    assert grads["w"] is w                                             # the caller's arrays, updated in place
    np.testing.assert_array_equal(grads["b"], [4.0])                  # (5 + 3) / 2: "b" packs first
    np.testing.assert_array_equal(grads["w"], [[2.0, 2.0, 1.0]])
    comm.backend.all_gather = lambda src, dst, n, stream: dst.__setitem__(slice(None), np.stack([src, src + 1]))
    with pytest.raises(RnnGraphError, match="at step 7 rank.s. 1 hold parameters that differ from rank 0's"):
        dist.check_same({"w": np.ones(2)}, 7)


def test_two_ranks_averaged_equal_one_process_with_every_stream(state):
    """A mean loss over 6 streams on one process, and over 3 streams on each of two ranks: rank 0's
    gradients after allreduce_ (the stand-in adds rank 1's flat buffer) equal the one process's, in
    float64, for an LSTM layer's parameters."""
    from rnngraph.nn import Recurrent
    rng = np.random.default_rng(0)
    x, target = rng.standard_normal((7, 6, 4)), rng.standard_normal((7, 6, 5))

    def grads(streams):
        layer = Recurrent("lstm", 4, 5, num_layers=2, dtype="float64", seed=3)
        y, _ = layer(x[:, streams])
        n = y.shape[1]                              # loss: mean over the streams of Σ_t,f (y - target)² / 2
        return layer.backward((y - target[:, streams]) / n)[2]

    one = grads(slice(0, 6))
    other = grads(slice(3, 6))
    flat = FlatGrads(np, {k: g.shape for k, g in other.items()}, {k: g.dtype for k, g in other.items()})
    comm, _ = fake_nccl(World(0, 2), [flat.pack(other).copy()])
    state.update(ranks=Ranks(World(0, 2), comm))
    mine = dist.allreduce_(grads(dist.share(6)))
    for k in one:
        np.testing.assert_allclose(mine[k], one[k], rtol=1e-12, atol=1e-15)


def test_rank_0s_rendezvous_store_is_stopped_so_the_process_can_exit(tmp_path):
    """cupyx's TCP store runs in a child process no one stops at exit: a rank 0 that left it running would
    never exit. After the rendezvous (here one rank's, without NCCL) Nccl stops it, and the process exits."""
    pytest.importorskip("cupyx.distributed")
    import subprocess
    import sys
    code = ("from cupyx.distributed import _store\n"
            "from rnngraph.lab.launch import _free_port\n"
            "from rnngraph.train.distributed import _stop_store\n"
            "port = _free_port()\n"
            "store = _store.TCPStore(1)\n"
            "store.run('127.0.0.1', port)\n"
            "_store.TCPStoreProxy('127.0.0.1', port).barrier()\n"
            "_stop_store()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 0, p.stderr[-2000:]
