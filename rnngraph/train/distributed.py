"""Data parallel training over GPUs, the parts every rank runs: which rank this process is (the launcher's
environment variables), its share of the S streams, one flat gradient buffer all-reduced by NCCL
(CuPy's cupyx.distributed, whose TCP store does the rendezvous) and averaged as one process with S
streams would, a collective that waits too long turned into an error, and the parameter checksums ranks
compare to catch a divergence. Processes on the CPU (numpy arrays) communicate through gloo instead
(torch.distributed; torch is needed only there).

The averaging rule: every rank's loss is the mean over its S/N streams and K frames, so the mean over all
S streams is the mean of the ranks' losses, and its gradient the mean of their gradients: the sum over
ranks (the all-reduce) divided by N.
"""
from __future__ import annotations

import atexit
import errno
import math
import os
import socket
import time
from dataclasses import dataclass

import numpy as np

from ..errors import RnnGraphError

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_S = 300.0        # a collective that waits longer than this (a rank stopped or stuck) is an error


@dataclass(frozen=True)
class World:
    """This process's place among the ranks: its rank, how many there are, its GPU on its machine
    (local_rank), where rank 0 listens for the rendezvous, and whether torchrun started it (its own store
    then holds MASTER_PORT)."""
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    addr: str = "127.0.0.1"
    port: int = 29500
    torchrun: bool = False

    @property
    def store_port(self) -> int:
        """Where rank 0 runs CuPy's rendezvous store for NCCL: MASTER_PORT, or the port after it under
        torchrun, whose agent's store already listens on MASTER_PORT (gloo joins that store instead)."""
        return self.port + 1 if self.torchrun else self.port

    @classmethod
    def from_env(cls, env=None) -> "World":
        """The world the launcher describes in RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
        (torchrun's names; LOCAL_RANK defaults to RANK, MASTER_ADDR to 127.0.0.1, MASTER_PORT to 29500),
        or a world of one process when none is set; an incomplete or inconsistent set is one error."""
        env = os.environ if env is None else env
        if not any(v in env for v in VARIABLES):
            return cls()
        missing = [v for v in ("RANK", "WORLD_SIZE") if v not in env]
        if missing:
            raise RnnGraphError(f"a distributed run needs {' and '.join(missing)} in the environment (set: "
                                f"{', '.join(v for v in VARIABLES if v in env)}); set RANK and WORLD_SIZE for every "
                                "process, or none of the variables for one process")
        rank, size = _integer(env, "RANK"), _integer(env, "WORLD_SIZE")
        local, port = _integer(env, "LOCAL_RANK", rank), _integer(env, "MASTER_PORT", 29500)
        if size < 1 or not 0 <= rank < size:
            raise RnnGraphError(f"RANK={rank} and WORLD_SIZE={size}: a rank runs from 0 to WORLD_SIZE - 1")
        if local < 0 or not 0 < port < 65536:
            raise RnnGraphError(f"LOCAL_RANK={local}, MASTER_PORT={port}: LOCAL_RANK is a GPU index (0 or more) "
                                "and MASTER_PORT a TCP port (1 to 65535)")
        return cls(rank, size, local, env.get("MASTER_ADDR", "127.0.0.1"), port,
                   env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


def _integer(env, name: str, default: int | None = None) -> int:
    if name not in env:
        return default
    try:
        return int(env[name])
    except ValueError:
        raise RnnGraphError(f"{name}={env[name]!r} in the environment is not an integer") from None


def share(streams: int, world: World) -> slice:
    """The streams this rank trains: S/N consecutive ones (rank r: r·S/N up to (r+1)·S/N); S must divide."""
    if streams % world.size:
        fits = [k * world.size for k in (streams // world.size, streams // world.size + 1) if k]
        raise RnnGraphError(f"{streams} streams do not split evenly over {world.size} ranks; pass --streams "
                            f"{' or '.join(map(str, fits))} (a multiple of {world.size})")
    n = streams // world.size
    return slice(world.rank * n, (world.rank + 1) * n)


class FlatGrads:
    """Every parameter gradient in one flat buffer, in a fixed order (sorted names), so that one all-reduce
    a step moves them all. It has the widest of the gradients' dtypes and float32 (half gradients are
    widened: the optimiser's masters are float32)."""

    def __init__(self, xp, shapes: dict, dtypes: dict):
        self.names = sorted(shapes)
        self.shapes = {n: tuple(shapes[n]) for n in self.names}
        sizes = [math.prod(self.shapes[n]) for n in self.names]
        self.offsets = dict(zip(self.names, np.cumsum([0] + sizes[:-1]).tolist()))
        self.dtype = np.result_type(np.float32, *(np.dtype(dtypes[n]) for n in self.names if
                                                  np.dtype(dtypes[n]).itemsize > 2))
        self.buffer = xp.zeros(sum(sizes), self.dtype)      # [Σ sizes]

    def pack(self, grads: dict):
        """Copies grads (name -> array of its shape) into the buffer; returns the buffer."""
        if set(grads) != set(self.names):
            raise RnnGraphError(f"internal: gradients {sorted(set(grads) ^ set(self.names))} do not match the "
                                "flat buffer's parameters")
        for n in self.names:
            self.view(n)[...] = grads[n]
        return self.buffer

    def view(self, name: str):
        """The buffer's slice for parameter `name`, in its shape (no copy)."""
        o = self.offsets[name]
        return self.buffer[o:o + math.prod(self.shapes[name])].reshape(self.shapes[name])

    def unpack(self) -> dict:
        """name -> the buffer's view of that gradient (after the all-reduce: the ranks' average)."""
        return {n: self.view(n) for n in self.names}


def checksum(xp, params: dict) -> np.ndarray:
    """[2] float64: the sum and the sum of squares of every parameter, in a fixed order; ranks that applied
    the same updates to the same values hold the same checksum bit for bit."""
    out = np.zeros(2)
    for n in sorted(params):
        p = params[n].astype(xp.float64)
        out += [float(p.sum()), float((p * p).sum())]
    return out


def disagreeing(checksums) -> list:
    """The ranks whose checksum differs from rank 0's (checksums: [N, 2])."""
    c = np.asarray(checksums, dtype=np.float64)
    return [r for r in range(1, len(c)) if not np.array_equal(c[r], c[0])]


class PeerLost(RnnGraphError):
    """A collective failed or timed out: another rank stopped (its own error says why) or is stuck."""


def communicator(world: World, gpu: bool, timeout_s: float = TIMEOUT_S):
    """The ranks' communicator: Nccl for cupy arrays (gpu), Gloo for numpy ones; None for one process."""
    if world.size == 1:
        return None
    return Nccl(world, timeout_s) if gpu else Gloo(world, timeout_s)


class Gloo:
    """The ranks' communicator on the CPU: gloo through torch.distributed (rank 0's TCP store at
    world.addr:port does the rendezvous), on numpy arrays; a collective waiting longer than `timeout_s`, or
    one whose peer closed its connection, is a PeerLost error naming this rank."""

    def __init__(self, world: World, timeout_s: float = TIMEOUT_S):
        from datetime import timedelta
        try:
            import torch
            import torch.distributed as td
        except ImportError:
            raise RnnGraphError("processes on the CPU communicate through torch.distributed (gloo), and torch "
                                "is not installed: pip install torch, or run on GPUs (NCCL)") from None
        self.torch, self.td, self.world, self.timeout_s = torch, td, world, timeout_s
        self._call(lambda: td.init_process_group("gloo", init_method=f"tcp://{world.addr}:{world.port}",
                                                 rank=world.rank, world_size=world.size,
                                                 timeout=timedelta(seconds=timeout_s)), "joining the ranks")
        atexit.register(self.close)     # a process group left to the interpreter's exit aborts it (SIGABRT)

    def close(self) -> None:
        """Leaves the ranks (once; also at exit)."""
        if self.td.is_initialized():
            self.td.destroy_process_group()

    def allreduce_(self, buf, average: bool = True):
        """buf (a contiguous numpy array) := the sum over ranks (average: divided by their number)."""
        self._call(lambda: self.td.all_reduce(self.torch.from_numpy(buf)), "an all-reduce")
        if average:
            buf *= buf.dtype.type(1.0 / self.world.size)
        return buf

    def allgather(self, values: np.ndarray) -> np.ndarray:
        """[N, *values.shape]: every rank's `values` (float64), rank order."""
        src = self.torch.from_numpy(np.array(values, dtype=np.float64))
        out = [self.torch.empty_like(src) for _ in range(self.world.size)]
        self._call(lambda: self.td.all_gather(out, src), "an all-gather")
        return np.stack([o.numpy() for o in out])

    def _call(self, call, what: str):
        try:
            call()
        except RuntimeError as e:      # gloo: a peer's connection closed, or the timeout passed
            cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PeerLost(f"rank {self.world.rank}: {what} failed ({cause[:200]}); another rank stopped or "
                           f"is stuck (the wait limit is {self.timeout_s:g} s)") from None


class Nccl:
    """The ranks' communicator: NCCL through cupyx.distributed (rank 0's TCP store at world.addr:port does
    the rendezvous), on this rank's GPU (world.local_rank). Each collective is waited for at most
    `timeout_s` seconds; then the communicator is aborted and the wait is an error naming this rank."""

    def __init__(self, world: World, timeout_s: float = TIMEOUT_S, backend=None):
        import cupy
        self.cp, self.world, self.timeout_s = cupy, world, timeout_s
        if backend is None:
            cupy.cuda.Device(world.local_rank).use()
            from cupyx.distributed import NCCLBackend
            if world.rank == 0:
                _check_free(world)
            try:
                backend = NCCLBackend(world.size, world.rank, host=world.addr, port=world.store_port)
            except Exception as e:              # NCCL's and the TCP store's own errors
                raise PeerLost(f"rank {world.rank}: NCCL could not join the {world.size} ranks on GPU "
                               f"{world.local_rank} ({type(e).__name__}: {str(e)[:200]})") from None
            finally:
                _stop_store()
        self.backend = backend

    def allreduce_(self, buf, average: bool = True):
        """buf (a contiguous cupy array) := the sum over ranks (average: divided by their number)."""
        self._wait(lambda stream: self.backend.all_reduce(buf, buf, "sum", stream), "an all-reduce")
        if average and self.world.size > 1:
            buf *= buf.dtype.type(1.0 / self.world.size)
        return buf

    def allgather(self, values: np.ndarray) -> np.ndarray:
        """[N, *values.shape]: every rank's `values` (float64), rank order."""
        src = self.cp.asarray(np.asarray(values, dtype=np.float64))
        out = self.cp.zeros((self.world.size, *src.shape), src.dtype)
        self._wait(lambda stream: self.backend.all_gather(src, out, src.size, stream), "an all-gather")
        return self.cp.asnumpy(out)

    def _wait(self, call, what: str):
        stream = self.cp.cuda.get_current_stream()
        call(stream)
        done = stream.record()
        deadline = time.monotonic() + self.timeout_s
        while not done.done:
            if time.monotonic() > deadline:
                comm = getattr(self.backend, "_comm", None)     # cupyx keeps its NcclCommunicator there
                if comm is not None:
                    comm.abort()
                raise PeerLost(f"rank {self.world.rank}: {what} waited {self.timeout_s:g} s for the other "
                                    f"ranks; one of them stopped or is stuck; the communicator was aborted")
            time.sleep(1e-4)


def _check_free(world: World) -> None:
    """One error when rank 0 cannot listen on the store's port (cupyx's store would fail in its own process
    and the ranks would wait on whatever holds the port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((world.addr, world.store_port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                fix = "MASTER_ADDR must name rank 0's machine"
            elif world.torchrun:
                fix = ("torchrun's own store holds MASTER_PORT, so NCCL's rendezvous takes the port after it: "
                       "pass torchrun a --master-port whose next port is free too")
            else:
                fix = "set MASTER_PORT to a free port"
            raise RnnGraphError(f"rank 0: NCCL's rendezvous cannot listen on {world.addr}:{world.store_port} "
                                f"({e.strerror or e}); {fix}") from None


def _stop_store() -> None:
    """Ends the TCP store rank 0 started for the rendezvous. cupyx runs it in a child process that is no
    daemon and ends only when asked, and it does not ask at exit, so the interpreter would wait for it
    forever. Once the communicator exists (or failed to), every rank has read the NCCL id from it."""
    import multiprocessing
    from cupyx.distributed import _store
    for p in multiprocessing.active_children():
        if isinstance(p, _store.ExceptionAwareProcess):
            p.terminate()
            multiprocessing.Process.join(p, 5)      # its own join() takes no time limit
