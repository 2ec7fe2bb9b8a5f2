"""A run's exclusive hold on its folder: `rnngraph train` (and --resume) and `rnngraph demo` lock their --out
for their whole life, so a second run into the same folder refuses in one line naming the holder.

The lock is an OS lock (fcntl.flock) on FOLDER/.rnngraph.lock, which also holds the holder's pid, host, start time and
command (filelock 3 truncates its lock file on every attempt, and filelock 4 needs Python 3.11). The kernel
releases it when the holder's process ends, however it ends, so a lock left by a killed run never blocks: the
next run takes it and rewrites the file. A hold is reentrant within a process (the demo holds its folder
while its training run holds it too); the last release removes the file, and the folder when the hold
created it and nothing else was written there.
"""
from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from ..errors import RnnGraphError

LOCK_FILE = ".rnngraph.lock"
READ_TRIES = 20          # a new holder writes its name just after taking the lock: wait up to 20 × 10 ms for it


class FolderHold:
    """This process's hold on one folder; `release` (idempotent) gives it back."""

    def __init__(self, key: Path):
        self.key, self.released = key, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            _release(self.key)


_HELD: dict = {}     # resolved folder -> [open lock file, hold count, folders the first hold created]


def hold_folder(folder, option: str = "--out") -> FolderHold:
    """Takes the exclusive lock on `folder` (created if missing), or raises one line naming the process that
    holds it. Example::

        hold = hold_folder("runs/train")
        try:
            ...                     # write the run's files
        finally:
            hold.release()
    """
    folder = Path(folder)
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RnnGraphError(f"cannot create {option} {folder}: {e.strerror or e}; pass another {option}") from None
    key = folder.resolve()
    if key in _HELD:
        _HELD[key][1] += 1
        return FolderHold(key)
    try:
        f = _lock(key / LOCK_FILE)
    except OSError as e:
        _remove_empty(created)
        raise RnnGraphError(f"cannot lock {option} {folder}: {e.strerror or e}; pass another {option}") from None
    if f is None:
        _remove_empty(created)
        raise _in_use(folder, holder(folder), option)
    f.truncate(0)
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "command": shlex.join(["rnngraph", *sys.argv[1:]])}).encode() + b"\n")
    f.flush()
    _HELD[key] = [f, 1, created]
    return FolderHold(key)


def check_free(folder, option: str = "--out") -> None:
    """One line when another process holds `folder`; takes nothing (a launcher asks before it starts ranks)."""
    who = holder(folder)
    if who is not None:
        raise _in_use(folder, who, option)


def _in_use(folder, who: str | None, option: str) -> RnnGraphError:
    return RnnGraphError(f"{folder} is in use by {who or 'another rnngraph process'}; wait for it to end or stop "
                         f"it, or pass another {option}")


def holder(folder) -> str | None:
    """Who holds the lock on `folder` ('pid 123 on host, since 2025-01-31 12:00:00: rnngraph train ...'), or
    None when no process does."""
    path = Path(folder) / LOCK_FILE
    if Path(folder).resolve() in _HELD:
        return f"this process (pid {os.getpid()})"
    try:
        with open(path, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                return None                      # free (a killed holder's file): closing gives the lock back
            for _ in range(READ_TRIES):
                f.seek(0)
                try:
                    who = json.loads(f.read() or b"null")
                except ValueError:
                    who = None
                if isinstance(who, dict):
                    return (f"pid {who.get('pid')} on {who.get('host')}, since {who.get('started')}: "
                            f"{who.get('command')}")
                time.sleep(0.01)
    except FileNotFoundError:
        return None
    return "another rnngraph process (it has not written its name)"


def _lock(path: Path):
    """The open lock file, locked, or None when another process holds it. A file a releasing holder
    unlinked after this process opened it is not the lock: it is opened again."""
    while True:
        f = open(path, "a+b")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        try:
            same = os.path.samestat(os.fstat(f.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return f
        f.close()


def _release(key: Path) -> None:
    entry = _HELD[key]
    entry[1] -= 1
    if entry[1]:
        return
    del _HELD[key]
    f, created = entry[0], entry[2]
    try:
        (key / LOCK_FILE).unlink(missing_ok=True)       # while still locked: a waiter then opens a new file
    finally:
        f.close()
    _remove_empty(created)


def _remove_empty(created: list) -> None:
    """Removes the folders a hold created (innermost first) where nothing was written."""
    for p in created:
        try:
            p.rmdir()
        except OSError:
            return
