"""The files commands write for the user (`bench --json`, `schedule --draw`, experiment results, figures), under
one rule: nothing is overwritten silently.

A file is written whole (to a hidden file beside it, then renamed over it) and recorded, with its sha256, in
its folder's .rnngraph-outputs.json. An existing file is replaced only when that record shows rnngraph wrote
it and it is unchanged since; any other file (the user's, or one edited since) is refused in one line, before
any work is done, unless the command is given --overwrite.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from ..errors import RnnGraphError

MANIFEST = ".rnngraph-outputs.json"      # file name -> sha256 of what rnngraph last wrote there


def check_replaceable(path, overwrite: bool = False) -> Path:
    """`path` as a Path, once it is known that writing it loses nothing: it does not exist, rnngraph wrote it
    (unchanged since), or overwrite is True; else one line naming it and --overwrite."""
    path = Path(path)
    if path.is_dir():
        raise RnnGraphError(f"{path} is a folder; give a file name, e.g. {path / 'out'}{path.suffix or '.json'}")
    if overwrite or not path.exists() or _written_here(path):
        return path
    raise RnnGraphError(f"{path} already exists and rnngraph did not write it (or it was changed since); pass "
                        "--overwrite to replace it, or choose another name")


def write_output(path, write: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Calls write(tmp) for a hidden file beside `path` (same suffix, so formats follow it), renames it to
    `path` and records it; refuses as check_replaceable does. Returns the path."""
    path = check_replaceable(path, overwrite)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        tmp.replace(path)
        _record(path)
    except OSError as e:
        raise RnnGraphError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_output(path, text: str, overwrite: bool = False) -> Path:
    """write_output for a text file."""
    return write_output(path, lambda tmp: tmp.write_text(text), overwrite)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(folder: Path) -> dict:
    try:
        record = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _written_here(path: Path) -> bool:
    return _manifest(path.parent).get(path.name) == _sha256(path)


def _record(path: Path) -> None:
    """Adds `path` to its folder's record (replaced whole; entries of files gone since are dropped)."""
    folder = path.parent
    record = {name: sha for name, sha in _manifest(folder).items() if (folder / name).is_file()}
    record[path.name] = _sha256(path)
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tmp.replace(folder / MANIFEST)
