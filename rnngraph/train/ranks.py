"""What data parallel training adds to a run of `rnngraph train` (train/loop.py): each rank trains its share
of the S streams, averages the loss and the gradients over the ranks once a step, validates its share of
the validation streams, gathers every stream's state for rank 0's checkpoints, takes its share back on a
resume (with any number of ranks S divides), and compares parameter checksums now and then.

With one process (no launcher variables) every method is the identity, so the loop has one code path.
The run equals one process training all S streams: the same chunks, dropout masks (each rank draws its part
of the whole batch's), learning rates and averaged gradients, up to the order of the sums.
"""
from __future__ import annotations

import time

import numpy as np

from .charlm import map_states
from ..arrays import array_module
from ..errors import RnnGraphError
from .distributed import TIMEOUT_S, FlatGrads, World, checksum, communicator, disagreeing, share

CHECK_EVERY = 100    # steps between parameter checksum comparisons (and at every checkpoint)


class Ranks:
    """This process's place in a data parallel run, and the collectives a training step needs.

    Example (inside a process a launcher started as rank 1 of 2, with 64 streams)::

        ranks = Ranks.join("cupy")
        ranks.mine(64)              # slice(32, 64)
        grads = ranks.average(grads)
    """

    def __init__(self, world: World, comm=None):
        self.world, self.comm, self._flat = world, comm, None
        self.reduce_s, self.reduces = 0.0, 0          # time in the gradients' all-reduce (host clock, waited)

    @classmethod
    def join(cls, backend: str = "auto", timeout_s: float = TIMEOUT_S) -> "Ranks":
        """The ranks the environment describes (one process when it describes none), communicating as
        `backend` ('numpy', 'cupy' or 'auto') computes: NCCL on this rank's GPU (LOCAL_RANK), or gloo on
        the CPU. Call it before anything is allocated on the GPU."""
        world = World.from_env()
        if world.size == 1:
            return cls(world)
        gpu = backend == "cupy"
        if backend == "auto":
            from ..run.backends import gpu_problem
            gpu = gpu_problem() is None
        return cls(world, communicator(world, gpu, timeout_s))

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    def mine(self, streams: int) -> slice:
        """This rank's streams of `streams` (which the ranks' number must divide; a one-line error if not)."""
        return share(streams, self.world)

    def part(self, n: int) -> slice:
        """This rank's consecutive part of n items that need not divide evenly (validation streams)."""
        bounds = np.linspace(0, n, self.size + 1).round().astype(int)
        return slice(int(bounds[self.rank]), int(bounds[self.rank + 1]))

    def mean(self, value: float) -> float:
        """The ranks' mean of a scalar (each rank's loss is the mean over an equal share)."""
        if self.comm is None:
            return value
        return float(self.comm.allgather(np.array([value])).mean())

    def sums(self, values) -> np.ndarray:
        """The ranks' elementwise sum of a few host numbers (float64)."""
        values = np.asarray(values, dtype=np.float64)
        return values if self.comm is None else self.comm.allgather(values).sum(axis=0)

    def average(self, grads: dict) -> dict:
        """grads (name -> array) replaced by their mean over the ranks: one all-reduce of one flat buffer."""
        if self.comm is None:
            return grads
        if self._flat is None or set(self._flat.names) != set(grads):
            xp = array_module(next(iter(grads.values())))
            self._flat = FlatGrads(xp, {n: g.shape for n, g in grads.items()}, {n: g.dtype for n, g in grads.items()})
        t0 = time.perf_counter()
        self.comm.allreduce_(self._flat.pack(grads))      # returns when the sum is there (Nccl waits for it)
        self.reduce_s, self.reduces = self.reduce_s + time.perf_counter() - t0, self.reduces + 1
        return {n: v.astype(grads[n].dtype, copy=False) for n, v in self._flat.unpack().items()}

    def gather_states(self, states: list) -> list:
        """Every stream's state from each rank's share (host arrays, streams on axis -2, as
        CharLM.states_to_host gives them), in stream order: what one process would hold."""
        if self.comm is None:
            return states
        return map_states(states, lambda a: np.concatenate(list(self.comm.allgather(a).astype(a.dtype)), axis=-2))

    def my_states(self, states: list, streams: int) -> list:
        """This rank's share of every stream's state (streams on axis -2)."""
        which = self.mine(streams)
        return map_states(states, lambda a: np.ascontiguousarray(a[..., which, :]))

    def check_same(self, params: dict, step: int, then: str) -> None:
        """One error naming the ranks whose parameters differ from rank 0's, `then` appended (what to do);
        all ranks must call it at the same step."""
        if self.comm is None:
            return
        bad = disagreeing(self.comm.allgather(checksum(array_module(next(iter(params.values()))), params)))
        if bad:
            raise RnnGraphError(f"at step {step} rank(s) {', '.join(map(str, bad))} hold parameters that differ "
                                f"from rank 0's{then}")

