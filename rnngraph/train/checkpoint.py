"""Checkpoints: one .npz file holding the arrays (weights, optimizer buffers, stream states) and a JSON
config (model, vocabulary, optimizer hyperparameters, RNG states, step), written atomically.

The file is an ordinary zip that ``numpy.load`` opens: one ``NAME.npy`` member per array plus a
``config.json`` member (``unzip -p checkpoint.npz config.json`` shows it). It is written to a
temporary file in the same folder, synced, then renamed over the old one with ``os.replace``, so an
interrupted write never destroys the last good checkpoint; a Ctrl-C or SIGTERM during the write takes effect
once it is done (held.py).
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import RnnGraphError
from .held import signals_held

FORMAT = "rnngraph-checkpoint"
VERSION = 2           # 2: the model config holds the cell graphs (cellio); 1: only the cell's name
READS = (1, 2)
CONFIG = "config.json"


@dataclass
class Checkpoint:
    """What a checkpoint file holds: `config` (plain JSON data) and `arrays` (name -> numpy array)."""
    path: Path
    config: dict
    arrays: dict


def save_checkpoint(path, config: dict, arrays: dict) -> Path:
    """Writes `config` (JSON-able) and `arrays` (name -> array) to `path` atomically; returns the path.

    >>> save_checkpoint("run/checkpoint.npz", {"step": 10}, {"model/weight": numpy.zeros((2, 3))})
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    body = json.dumps({"format": FORMAT, "version": VERSION, **config}, indent=1)
    try:
        with signals_held():                 # a Ctrl-C or SIGTERM now takes effect once the file is in place
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
                    z.writestr(CONFIG, body)
                    for name, a in arrays.items():
                        with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                            np.lib.format.write_array(member, np.ascontiguousarray(a), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException as e:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise RnnGraphError(f"cannot write checkpoint {path}: {e.strerror or e}; the previous one, if any, "
                                "is intact") from None
        raise
    return path


def checkpoint_file(path) -> Path:
    """The checkpoint `path` names: the file itself, or a run folder's checkpoint.npz (what `train --out` made)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "checkpoint.npz").is_file():
            raise RnnGraphError(f"folder {path} holds no checkpoint.npz; give a run folder that `rnngraph train` "
                                "wrote, or a checkpoint file")
        return path / "checkpoint.npz"
    return path


def load_checkpoint(path) -> Checkpoint:
    """Reads a checkpoint (a file, or a run folder's checkpoint.npz); a missing, truncated, corrupt or foreign
    file is one clear RnnGraphError."""
    path = checkpoint_file(path)
    if not path.is_file():
        raise RnnGraphError(f"checkpoint {path} not found" + ("" if path.suffix == ".npz" else
                            " (a checkpoint is an .npz file, e.g. runs/train/checkpoint.npz, or its run folder)"))
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            if CONFIG not in names:
                raise RnnGraphError(f"{path} is not an rnngraph checkpoint: it has no {CONFIG}")
            config = json.loads(z.read(CONFIG).decode("utf-8"))
            arrays = {}
            for name in names:
                if name.endswith(".npy"):
                    with z.open(name) as member:
                        arrays[name[:-4]] = np.lib.format.read_array(member, allow_pickle=False)
    except RnnGraphError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, ValueError, OSError,
            UnicodeDecodeError) as e:
        reason = str(e) if len(str(e)) < 100 else str(e)[:100] + "..."
        raise RnnGraphError(f"checkpoint {path} is truncated or corrupt ({type(e).__name__}: {reason}); "
                            "resume from an earlier copy or start a new run") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise RnnGraphError(f"{path} is not an rnngraph checkpoint (its {CONFIG} has no format "
                            f"'{FORMAT}')")
    if config.get("version") not in READS:
        raise RnnGraphError(f"checkpoint {path} has format version {config.get('version')}; this rnngraph "
                            f"reads version {' or '.join(map(str, READS))}; upgrade rnngraph to load it")
    return Checkpoint(path, config, arrays)


# -- flattening training state into (JSON, arrays) --------------------------------------------

def pack_optimizer(state: dict):
    """An optimizer's state_dict() -> (JSON part, arrays 'optim/<param>/<buffer>')."""
    arrays, steps = {}, {}
    for name, st in state["state"].items():
        steps[name] = {k: v for k, v in st.items() if isinstance(v, int)}
        arrays.update({f"optim/{name}/{k}": v for k, v in st.items() if not isinstance(v, int)})
    return {"hyper": state["hyper"], "ints": steps}, arrays


def unpack_optimizer(meta: dict, arrays: dict) -> dict:
    """The inverse of pack_optimizer: an optimizer state_dict()."""
    state = {name: dict(ints) for name, ints in meta["ints"].items()}
    for key, a in arrays.items():
        if key.startswith("optim/"):
            name, _, buf = key[len("optim/"):].rpartition("/")
            state.setdefault(name, {})[buf] = a
    return {"hyper": meta["hyper"], "state": state}


def pack_states(states: list):
    """Stream states (per module: None, an array, or a tuple of arrays [L, S, H]) -> (JSON, arrays)."""
    meta, arrays = [], {}
    for i, s in enumerate(states):
        if s is None:
            meta.append(None)
            continue
        parts = s if isinstance(s, (tuple, list)) else (s,)
        meta.append({"parts": len(parts), "tuple": isinstance(s, (tuple, list))})
        arrays.update({f"state/{i}/{j}": p for j, p in enumerate(parts)})
    return meta, arrays


def unpack_states(meta: list, arrays: dict) -> list:
    """The inverse of pack_states, as host numpy arrays."""
    out = []
    for i, m in enumerate(meta):
        if m is None:
            out.append(None)
            continue
        parts = tuple(arrays[f"state/{i}/{j}"] for j in range(m["parts"]))
        out.append(parts if m["tuple"] else parts[0])
    return out


def model_arrays(arrays: dict) -> dict:
    """The model's weights ('model/<name>' entries) as name -> array."""
    return {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}


def check_same(path, saved: dict, requested: dict) -> None:
    """Raises one error listing every requested setting that differs from the checkpoint's."""
    diffs = [f"--{k.replace('_', '-')} {requested[k]} (the checkpoint has {saved.get(k)})"
             for k in requested if requested[k] is not None and requested[k] != saved.get(k)]
    if diffs:
        raise RnnGraphError(f"checkpoint {path} does not match the requested model: " + "; ".join(diffs)
                            + "; drop these options to continue the checkpoint's run, or start a new one")
