"""Command-line options shared by several subcommands: positive integers, a cell with its sizes, and an
output folder checked before any work is done."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..errors import RnnGraphError
from ..ir.loading import load_cell
from ..ir.graph import CellGraph
from ..plan.loops import NAMES

LOOP_CHOICES = NAMES     # --loop of train and bench: auto, then each strategy best first


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def add_cell_arguments(p: argparse.ArgumentParser) -> None:
    """CELL plus its sizes; for every subcommand that builds a cell."""
    p.add_argument("cell", metavar="CELL",
                   help="a built-in cell (see `rnngraph cells`), or module:function or path/to/file.py:function "
                        "returning a CellGraph")
    p.add_argument("--input-size", type=positive_int, default=32, metavar="N",
                   help="input features D (default: %(default)s)")
    p.add_argument("--hidden-size", type=positive_int, default=64, metavar="N",
                   help="hidden features H (default: %(default)s)")


def cell_from_args(args: argparse.Namespace) -> CellGraph:
    """The cell named on the command line; `module:function` is found in the working directory too."""
    return load_cell(args.cell, args.input_size, args.hidden_size)


def writable_folder(folder, option: str, *, missing: int | None = 1, raw=None) -> Path:
    """`folder` as a Path, once it is known that it can be written: it exists, or at most `missing` levels
    of it do not (None: any) and the nearest folder that exists is writable. Creates nothing; raises a
    one-line RnnGraphError naming `option` otherwise, so a bad path fails before any work is done."""
    if raw is not None and not str(raw).strip():
        raise RnnGraphError(f"{option} is empty; give a path")
    folder = Path(folder)
    chain = [folder, *folder.parents]
    base = next(p for p in chain if p.exists() or p == chain[-1])
    if missing is not None and chain.index(base) > missing:
        raise RnnGraphError(f"cannot write to {folder}: {chain[missing]} does not exist; create it or pass "
                            f"another {option}")
    if not base.is_dir():
        raise RnnGraphError(f"cannot write to {folder}: {base} is not a folder; pass another {option}")
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as e:
        raise RnnGraphError(f"cannot write to {folder}: {e.strerror or e} in {base}; pass another {option}") from None
    return folder
