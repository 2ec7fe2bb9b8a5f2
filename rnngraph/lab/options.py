"""Command-line options shared by several subcommands: positive integers, and a cell with its sizes."""
from __future__ import annotations

import argparse
import os
import sys

from ..ir.cells import load_cell
from ..ir.graph import CellGraph


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def add_cell_arguments(p: argparse.ArgumentParser) -> None:
    """CELL plus its sizes; for every subcommand that builds a cell."""
    p.add_argument("cell", metavar="CELL",
                   help="a built-in cell (see `rnngraph cells`) or module:function returning a CellGraph")
    p.add_argument("--input-size", type=positive_int, default=32, metavar="N",
                   help="input features D (default: %(default)s)")
    p.add_argument("--hidden-size", type=positive_int, default=64, metavar="N",
                   help="hidden features H (default: %(default)s)")


def cell_from_args(args: argparse.Namespace) -> CellGraph:
    """The cell named on the command line; `module:function` is importable from the working directory."""
    if ":" in args.cell and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return load_cell(args.cell, args.input_size, args.hidden_size)
