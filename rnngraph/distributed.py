"""Data parallel training in your own loop, over the GPUs of one machine or several, on NCCL.

Start one process per GPU with a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT (torchrun's variables, e.g. ``torchrun --nproc-per-node 2 your_script.py``); with none of
them set, a script runs as one process and every call below is a no-op::

    import rnngraph.distributed as dist
    world = dist.init()                         # this process's rank, the ranks' number, its GPU (NCCL)
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

from .errors import RnnGraphError
from .train.distributed import TIMEOUT_S, World
from .train.ranks import Ranks

_STATE: dict = {}


def init(timeout_s: float = TIMEOUT_S, backend: str = "cupy") -> World:
    """Joins the ranks the environment describes (once per process; from 2 ranks up: NCCL on this rank's
    GPU, or gloo for numpy arrays with backend="numpy") and returns this process's World; a collective
    waiting longer than timeout_s seconds is an error."""
    if "ranks" not in _STATE:
        _STATE["ranks"] = Ranks.join(backend, timeout_s)
    return _STATE["ranks"].world


def _ranks() -> Ranks:
    if "ranks" not in _STATE:
        raise RnnGraphError("rnngraph.distributed is not initialised: call rnngraph.distributed.init() first")
    return _STATE["ranks"]


def rank() -> int:
    return _ranks().rank


def world_size() -> int:
    return _ranks().size


def share(streams: int) -> slice:
    """This rank's streams of `streams` (which the ranks' number must divide)."""
    return _ranks().mine(streams)


def allreduce_(grads: dict) -> dict:
    """Replaces each gradient (name -> array) by its mean over the ranks, in one all-reduce of a flat
    buffer; returns grads, the same arrays."""
    for n, v in _ranks().average(grads).items():
        if v is not grads[n]:
            grads[n][...] = v
    return grads


def check_same(params: dict, step: int) -> None:
    """Compares the ranks' parameter checksums; one error naming the ranks that differ from rank 0."""
    _ranks().check_same(params, step, ": the ranks started from different weights or applied different updates")
