"""Data parallel training in your own loop, over the GPUs of one machine or several, on NCCL.

Start one process per GPU with a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT (torchrun's variables, e.g. ``torchrun --nproc-per-node 2 your_script.py``); with none of
them set, a script runs as one process and every call below is a no-op::

    import rnngraph.distributed as dist
    world = dist.init()                         # this process's rank, the ranks' number, its GPU
    mine = dist.share(64)                       # its streams of the 64: slice(rank·64/N, (rank+1)·64/N)
    layer = rnngraph.nn.LSTM(D, H, backend="cupy")
    ...
    gx, g0, grads = layer.backward(gy)          # the mean loss over this rank's streams
    dist.allreduce_(grads)                      # in place: the mean over every rank, as one process with all
    dist.check_same(layer.parameters(), step)   # now and then: every rank holds the same weights, or an error

Each rank must start from the same parameters (the same seed, or a broadcast) and apply the same
updates; `check_same` finds it when they do not. rnngraph.torch modules take torch's own
DistributedDataParallel instead.
"""
from __future__ import annotations

from .arrays import array_module
from .errors import RnnGraphError
from .train.distributed import TIMEOUT_S, FlatGrads, Nccl, World, checksum, disagreeing
from .train.distributed import share as _share

_STATE: dict = {}


def init(timeout_s: float = TIMEOUT_S) -> World:
    """Joins the ranks the environment describes (once per process; NCCL from 2 ranks up) and returns
    this process's World; a collective waiting longer than timeout_s seconds is an error."""
    if "world" not in _STATE:
        world = World.from_env()
        _STATE.update(world=world, comm=Nccl(world, timeout_s) if world.size > 1 else None, flat={})
    return _STATE["world"]


def _world() -> World:
    if "world" not in _STATE:
        raise RnnGraphError("rnngraph.distributed is not initialised: call rnngraph.distributed.init() first")
    return _STATE["world"]


def rank() -> int:
    return _world().rank


def world_size() -> int:
    return _world().size


def share(streams: int) -> slice:
    """This rank's streams of `streams` (which the ranks' number must divide)."""
    return _share(streams, _world())


def allreduce_(grads: dict, average: bool = True) -> dict:
    """Replaces each gradient (name -> cupy array) by its mean over the ranks (its sum with average=False),
    in one all-reduce of a flat buffer; returns grads."""
    world = _world()
    if world.size == 1:
        return grads
    key = tuple(sorted((n, tuple(g.shape), str(g.dtype)) for n, g in grads.items()))
    flat = _STATE["flat"].get(key)
    if flat is None:
        xp = array_module(next(iter(grads.values())))
        flat = _STATE["flat"][key] = FlatGrads(xp, {n: g.shape for n, g in grads.items()},
                                              {n: g.dtype for n, g in grads.items()})
    _STATE["comm"].allreduce_(flat.pack(grads), average)
    for n, v in flat.unpack().items():
        grads[n][...] = v
    return grads


def check_same(params: dict, step: int) -> None:
    """Compares the ranks' parameter checksums; one error naming the ranks that differ from rank 0."""
    world = _world()
    if world.size == 1:
        return
    xp = array_module(next(iter(params.values())))
    bad = disagreeing(_STATE["comm"].allgather(checksum(xp, params)))
    if bad:
        raise RnnGraphError(f"at step {step} rank(s) {', '.join(map(str, bad))} hold parameters that differ from "
                            "rank 0's: the ranks started from different weights or applied different updates")
