"""`rnngraph train --gpus N` (or `--procs N` on the CPU): start one process per rank, watch them, and stop
them all together.

Each rank is `python -m rnngraph` with the same arguments and the launcher's usual variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: what torchrun sets, so a run across machines starts the
same processes with torchrun instead). Ranks run in their own sessions, so a Ctrl-C (or SIGTERM, SIGHUP)
reaches this process alone, which passes it on once as SIGINT. A rank that stops with an error writes its
one line to a fault file (cli.py) instead of printing it; the first rank to fail stops the others (SIGTERM,
then SIGKILL), and this process prints one line naming that rank and its cause (none when rank 0's stdout,
this process's, was a pipe its reader closed). Rank 0 holds the lock on the run's folder (train/lock.py) and
writes checkpoints atomically, so the last one stays intact whatever is killed when.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import Interrupted, RnnGraphError

FAULT_FILE = "RNNGRAPH_FAULT_FILE"     # where a launched rank writes the line it would have printed
GRACE_S = 5.0                          # how long stopped ranks get before SIGKILL
POLL_S = 0.05


def write_fault(message: str, status: int, peer: bool) -> bool:
    """In a launched rank: records its last line for the launcher (True); elsewhere nothing (False)."""
    path = os.environ.get(FAULT_FILE)
    if not path:
        return False
    Path(path).write_text(json.dumps({"message": message, "status": status, "peer": peer}))
    return True


def as_rank() -> None:
    """In a rank this launcher started: its Ctrl-C (passed on as SIGINT) raises KeyboardInterrupt even where
    the shell started the launcher with SIGINT ignored (a background job)."""
    if os.environ.get(FAULT_FILE):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def check_gpus(n: int) -> None:
    """One line when this machine cannot run n ranks on n GPUs."""
    from ..run.backends import gpu_problem
    problem = gpu_problem()
    if problem is not None:
        raise RnnGraphError(f"--gpus {n} needs GPUs: {problem}; on the CPU, --procs {n} runs {n} processes")
    import cupy
    visible = cupy.cuda.runtime.getDeviceCount()
    if n > visible:
        mask = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise RnnGraphError(f"--gpus {n} but {visible} GPU{'s are' if visible > 1 else ' is'} visible"
                            f"{f' (CUDA_VISIBLE_DEVICES={mask})' if mask is not None else ''}; pass --gpus {visible} "
                            "or fewer")


def launch(n: int, argv: list, out: Path, flag: str) -> int:
    """Runs `rnngraph <argv>` as ranks 0 .. n-1 on this machine; returns 0 when all finish, else raises
    with one line (the first failing rank and its cause; Ctrl-C: what was kept, and how to continue with
    the option `flag`, e.g. '--gpus 2')."""
    from ..train.lock import check_free
    check_free(out)                             # rank 0 takes the lock; a run holding it now is one line here
    port, faults = _free_port(), Path(tempfile.mkdtemp(prefix="rnngraph-ranks-"))
    procs = []
    try:
        for r in range(n):
            env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), FAULT_FILE: str(faults / f"rank{r}.json")}
            procs.append(subprocess.Popen([sys.executable, "-m", "rnngraph", *argv], env=env, start_new_session=True,
                                          stdout=None if r == 0 else subprocess.DEVNULL))
        try:
            failed = _watch(procs, faults)
        except KeyboardInterrupt:
            _stop(procs, 2 * GRACE_S, signal.SIGINT)
            fault = _fault(faults, 0)       # rank 0's own line, unless a lost peer ended it first
            if fault and fault["status"] == 130:
                raise Interrupted(fault["message"].removeprefix("interrupted; ")) from None
            raise Interrupted(_kept(out, flag)) from None
        if failed is None:
            return 0
        _stop(procs, GRACE_S)
        if any((_fault(faults, r) or {}).get("status") == 128 + signal.SIGPIPE for r in range(n)):
            raise BrokenPipeError("the reader of rank 0's output has gone")   # cli.py's closed stdout: ours too
        raise RnnGraphError(f"rank {failed}: {_cause(procs[failed], _fault(faults, failed))}; the other ranks were "
                            f"stopped; {_kept(out)}")
    finally:
        _stop(procs, 0.0)
        for f in faults.iterdir():
            f.unlink()
        faults.rmdir()


def _watch(procs: list, faults: Path) -> int | None:
    """Waits until every rank ends well (None) or one fails: that rank (the first seen; among those seen
    together, one whose cause is its own rather than a lost peer)."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            own = [r for r in bad if not (_fault(faults, r) or {}).get("peer")]
            return (own or bad)[0]
        if all(c == 0 for c in codes):
            return None
        time.sleep(POLL_S)


def _stop(procs: list, grace_s: float, first=signal.SIGTERM) -> None:
    """`first` (SIGTERM; SIGINT: Ctrl-C, passed on) to the ranks still running, SIGKILL to those left after
    grace_s (at once when grace_s is 0)."""
    if grace_s:
        for p in procs:
            _signal(p, first)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    for p in procs:
        _signal(p, signal.SIGKILL)
        p.wait()


def _signal(p: subprocess.Popen, sig) -> None:
    if p.poll() is None:
        p.send_signal(sig)


def _fault(faults: Path, rank: int) -> dict | None:
    try:
        return json.loads((faults / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def _cause(p: subprocess.Popen, fault: dict | None) -> str:
    if fault is not None:
        return fault["message"].removeprefix("error: ")
    if p.returncode < 0:
        return f"killed by {signal.Signals(-p.returncode).name}"
    return f"exited with status {p.returncode} (its traceback is above)"


def _kept(out: Path, flag: str | None = None) -> str:
    """What the ranks left: the checkpoint in `out` (with `flag`, how to continue from it: after a failure
    it may be another run's, which the failing rank refused to overwrite)."""
    from ..train.checkpoint import load_checkpoint
    path = out / "checkpoint.npz"
    if not path.exists():
        return "no checkpoint was written" + ("; run the same command again to start afresh" if flag else "")
    try:
        step = load_checkpoint(path).config["step"]
    except RnnGraphError as e:
        return f"the checkpoint could not be read back: {e}"
    if flag is None:
        return f"checkpoint {path} (step {step}) is intact"
    return f"checkpoint {path} holds step {step}; continue with rnngraph train --resume {path} {flag}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
