"""Run identity: a random id per run, kept across resumes, so no command replaces another run's files unasked."""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import load_checkpoint
from ..errors import RnnGraphError


def new_run_id(kind: str = "run") -> str:
    """A fresh id such as 'run-3fa2c1d0'; the demo's runs are 'demo-…', and a demo may replace a demo."""
    return f"{kind}-{secrets.token_hex(4)}"


def out_folder(out) -> Path:
    """--out as a Path; an empty one would write into the current directory, and a file is no folder: both are
    refused in one line."""
    if not str(out).strip():
        raise RnnGraphError("--out is empty; give the folder for the checkpoint and logs, e.g. --out runs/train")
    if Path(out).exists() and not Path(out).is_dir():
        raise RnnGraphError(f"--out {out} is a file, not a folder; give a folder for the checkpoint and logs, e.g. "
                            "--out runs/train")
    return Path(out)


@dataclass(frozen=True)
class RunInfo:
    """The run a folder holds: the file that names it (checkpoint.npz, else log.json), its id and step."""
    path: Path
    run_id: str | None       # None: unreadable, or written before runs had ids
    step: int | None

    def __str__(self) -> str:
        if self.step is None:
            return "a run whose file cannot be read"
        return f"{self.run_id or 'a run without an id'} at step {self.step}"


def run_in(folder) -> RunInfo | None:
    """The run whose checkpoint (or, lacking one, log.json) lies in `folder`; None when neither does."""
    ckpt, log = Path(folder) / "checkpoint.npz", Path(folder) / "log.json"
    try:
        if ckpt.exists():
            config = load_checkpoint(ckpt).config
            return RunInfo(ckpt, config.get("train", {}).get("run_id"), config.get("step"))
        if log.exists():
            body = json.loads(log.read_text())
            return RunInfo(log, body["config"].get("run_id"), body["rows"][-1][0] if body["rows"] else 0)
    except (RnnGraphError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return RunInfo(ckpt if ckpt.exists() else log, None, None)
    return None


def check_folder(out, run_id: str, resume=None) -> None:
    """Refuses, in one line, to let run `run_id` (continuing Checkpoint `resume`, if given) write into `out`
    when `out` holds the checkpoint or logs of another run; the caller skips this for --overwrite."""
    there = run_in(out)
    if (there is None or there.run_id == run_id or resume is not None and there.path.samefile(resume.path)
            or run_id.startswith("demo-") and str(there.run_id).startswith("demo-")):
        return
    held = "a checkpoint" if there.path.name == "checkpoint.npz" else "the log"
    if resume is not None:
        raise RnnGraphError(
            f"{there.path} holds {held} of another run ({there}); resuming {resume.path} ({run_id} at step "
            f"{resume.config['step']}) would replace it: drop --out to continue in {resume.path.parent}, "
            "choose another --out, or replace the other run with --overwrite")
    if run_id.startswith("demo-"):
        raise RnnGraphError(f"{there.path} holds {held} of a training run ({there}), not of a demo; give the demo "
                            "another --out, or replace that run with --overwrite")
    again = f"continue it with --resume {there.path}, " if held == "a checkpoint" else ""
    raise RnnGraphError(f"{there.path} already holds {held}; {again}start a new run elsewhere with --out DIR, "
                        f"or replace it ({there}) with --overwrite")
