"""The `rnngraph` command line: one table of subcommands, each an (add_arguments, run) pair.

To add a subcommand, write its two functions (in any module) and add one entry to COMMANDS.
Keep heavy imports (torch, cupy, matplotlib) inside `run`, so `rnngraph --help` stays fast.
Every RnnGraphError (and MemoryError) ends the program with status 2 and one line on stderr, Ctrl-C with
status 130 and one line saying what was kept (errors.Interrupted, or the command's `interrupted` text).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Callable

from . import __version__
from .cells import CELLS, load_cell
from .errors import Interrupted, RnnGraphError
from .graph import CellGraph
from .schedule import build_schedule


@dataclass(frozen=True)
class Command:
    help: str                                               # one line, shown by `rnngraph --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], "int | None"]       # exit status; None means 0
    interrupted: str = "nothing was written"                # what a bare Ctrl-C leaves behind


# -- shared arguments -------------------------------------------------------------------------

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


# -- cells ------------------------------------------------------------------------------------

def _cells_arguments(p: argparse.ArgumentParser) -> None:
    pass


def _cells_run(args: argparse.Namespace) -> None:
    width = max(map(len, CELLS))
    for name, (_, description) in CELLS.items():
        print(f"{name:<{width}}  {description}")


# -- schedule ---------------------------------------------------------------------------------

def _schedule_arguments(p: argparse.ArgumentParser) -> None:
    add_cell_arguments(p)
    p.add_argument("--json", action="store_true", help="print the schedule's summary as JSON")
    p.add_argument("--draw", metavar="FILE.png", help="also draw the scheduled graph to an image file")


def _schedule_run(args: argparse.Namespace) -> None:
    if args.draw is not None:
        from .viz import check_image_path, draw_schedule   # matplotlib only when drawing
        check_image_path(args.draw)
    schedule = build_schedule(cell_from_args(args))
    print(json.dumps(schedule.summary()) if args.json else schedule)
    if args.draw is not None:
        try:
            draw_schedule(schedule, args.draw)
        except OSError as e:
            raise RnnGraphError(f"cannot write {args.draw}: {e.strerror or e}") from None
        print(f"rnngraph: drew {args.draw}", file=sys.stderr)


def _lazy(module: str, help: str, add: str = "add_arguments", run: str = "run") -> Command:
    """A subcommand whose module is imported only when it is used (keeps `rnngraph --help` fast)."""
    def load():
        return importlib.import_module(f"{__package__}.{module}")
    return Command(help, lambda p: getattr(load(), add)(p), lambda a: getattr(load(), run)(a))


COMMANDS: dict[str, Command] = {
    "cells": Command("list the built-in cells", _cells_arguments, _cells_run),
    "schedule": Command("print (or draw) a cell's schedule: hoisted, per-frame stages, merged kernels",
                        _schedule_arguments, _schedule_run),
    "bench": _lazy("bench", "time rnngraph's modes against cuDNN and a torch eager loop, side by side"),
    "doctor": _lazy("doctor", "print versions, GPU and driver state, and self-check every available backend"),
    "train": _lazy("train_cli", "train a character-level language model on the bundled text (or --text FILE)"),
    "sample": _lazy("sample", "generate text from a checkpoint written by rnngraph train"),
    "demo": _lazy("demo", "build an LSTM, print its schedule, train it briefly, sample from it, draw its curve"),
    "experiment": _lazy("experiments", "run one evaluation experiment and write its JSON results "
                                      "(--quick: a CPU sample)"),
    "figures": _lazy("experiments", "rebuild every evaluation figure from stored results (no GPU, nothing "
                                   "re-measured)", "add_figures_arguments", "run_figures"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rnngraph",
        description="Recurrent cells as dataflow graphs, scheduled after Hwang & Sung (ICASSP 2015).")
    parser.add_argument("--version", action="version", version=f"rnngraph {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(run=command.run, interrupted=command.interrupted)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand; returns the exit status: 2 with one line for an RnnGraphError or MemoryError,
    130 with one line for Ctrl-C."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except RnnGraphError as e:
        return _say(f"error: {e}", 2)
    except MemoryError as e:            # numpy's message names the size it tried to allocate
        return _say(f"error: out of memory: {e or 'an allocation failed'}; try smaller sizes", 2)
    except Interrupted as e:
        return _say(f"interrupted; {e}", 130)
    except KeyboardInterrupt:
        return _say(f"interrupted; {args.interrupted}", 130)


def _say(message: str, status: int) -> int:
    print(f"rnngraph: {' '.join(message.splitlines())}", file=sys.stderr)
    return status
