"""The `rnngraph` command line: one table of subcommands, each an (add_arguments, run) pair.

To add a subcommand, write its two functions (in any module) and add one entry to COMMANDS.
Keep heavy imports (torch, cupy, matplotlib) inside `run`, so `rnngraph --help` stays fast.
Every RnnGraphError (and MemoryError) ends the program with status 2 and one line on stderr, Ctrl-C with
status 130 and one line saying what was kept (errors.Interrupted, or the command's `interrupted` text);
SIGTERM and SIGHUP end a command as Ctrl-C does (status 143 and 129, `rnngraph: stopped by SIGTERM; ...`).
A command whose stdout is a pipe closed by its reader (`rnngraph schedule lstm | head -2`) ends at once with
status 141 (128 + SIGPIPE, as a shell reports it) and no word.
In one rank of a data parallel run that line names the rank; a rank `rnngraph train --gpus N` started hands
it to that launcher (lab/launch.py) instead, which prints one line for the run.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import select
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Callable

from ..errors import Interrupted, RnnGraphError
from ..ir.cells import CELLS
from ..plan.schedule import build_schedule
from ..version import __version__
from .options import LOOP_CHOICES, add_cell_arguments, cell_from_args, positive_int
from .gpu_loop import gpu_loop
from .outputs import check_replaceable, write_output


@dataclass(frozen=True)
class Command:
    help: str                                               # one line, shown by `rnngraph --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], "int | None"]       # exit status; None means 0
    interrupted: str = "nothing was written"                # what a bare Ctrl-C leaves behind


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
    p.add_argument("--loop", choices=LOOP_CHOICES, default="auto",
                   help="loop strategy (default: %(default)s, the best one the cell admits)")
    p.add_argument("--json", action="store_true", help="print the schedule's summary as JSON")
    p.add_argument("--draw", metavar="FILE.png", help="also draw the scheduled graph to an image file")
    p.add_argument("--overwrite", action="store_true",
                   help="let --draw replace a file rnngraph did not write (its own earlier drawing it always may)")
    p.add_argument("--batch", type=positive_int, metavar="B",
                   help="also say which loop the GPU runs at this batch size (with --dtype)")
    p.add_argument("--dtype", choices=("float32", "float64", "bfloat16", "float16"), default="float32",
                   help="the dtype --batch asks about (default: %(default)s)")
    p.add_argument("--tf32", action="store_true",
                   help="with --batch and float32: as where TF32 is allowed (torch's allow_tf32, "
                        "rnngraph bench --tf32)")


def _schedule_run(args: argparse.Namespace) -> None:
    if args.draw is not None:
        from .drawing import check_image_path, draw_schedule   # matplotlib only when drawing
        check_image_path(args.draw)
        check_replaceable(args.draw, args.overwrite)
    schedule = build_schedule(cell_from_args(args), loop=args.loop)
    summary = schedule.summary()
    if args.batch:
        summary["gpu_loop"] = gpu_loop(schedule, args.batch, args.dtype, auto=args.loop == "auto", tf32=args.tf32)
    print(json.dumps(summary) if args.json else schedule)
    if args.batch and not args.json:
        tf32 = " with TF32 allowed" if args.tf32 and args.dtype == "float32" else ""
        print(f"  on the GPU at B={args.batch} in {args.dtype}{tf32}: {summary['gpu_loop']}")
    if args.draw is not None:
        write_output(args.draw, lambda tmp: draw_schedule(schedule, tmp), args.overwrite)
        print(f"rnngraph: drew {args.draw}", file=sys.stderr)


# -- figures (here: --help needs no matplotlib) --------------------------------------------------

def _figures_arguments(p: argparse.ArgumentParser) -> None:
    """`rnngraph figures [--results DIR] [--out DIR] [--runs DIR] [--overwrite]`."""
    from .experiments import FIGURES, RESULTS, SCRATCH
    p.add_argument("--results", metavar="DIR",
                   help=f"folder of NAME.json results (default: the committed {RESULTS}; "
                        f"{RESULTS / 'quick'}: CPU samples)")
    p.add_argument("--out", metavar="DIR", help=f"where figures go (default, in the working directory: {FIGURES} for "
                   f"the committed results, {SCRATCH[False].parent / 'figures'} for any other --results)")
    p.add_argument("--runs", metavar="DIR", default="runs",
                   help="training runs (DIR/*/log.csv) for the training curves, if any (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files in --out that rnngraph did not write (its own earlier figures it always may)")


def _figures_run(args: argparse.Namespace) -> None:
    from .figures import run_figures     # matplotlib only when drawing
    run_figures(args)


def _lazy(module: str, help: str, add: str = "add_arguments", run: str = "run") -> Command:
    """A subcommand whose module (a path below rnngraph) is imported only when it is used (keeps `rnngraph --help` fast)."""
    def load():
        return importlib.import_module(f"rnngraph.{module}")
    return Command(help, lambda p: getattr(load(), add)(p), lambda a: getattr(load(), run)(a))


COMMANDS: dict[str, Command] = {
    "cells": Command("list the built-in cells", _cells_arguments, _cells_run),
    "schedule": Command("print (or draw) a cell's schedule: hoisted, per-frame stages, merged kernels",
                        _schedule_arguments, _schedule_run),
    "bench": _lazy("lab.bench_command", "time rnngraph's modes against cuDNN and a torch eager loop, side by side"),
    "doctor": _lazy("lab.doctor", "print versions, GPU and driver state, and self-check every available backend"),
    "train": _lazy("lab.commands", "train a character-level language model on the bundled text (or --text FILE)",
                   "train_arguments", "train_run"),
    "sample": _lazy("lab.commands", "generate text from a checkpoint written by rnngraph train",
                    "sample_arguments", "sample_run"),
    "demo": _lazy("lab.demo", "build an LSTM, print its schedule, train it briefly, sample from it, draw its curve"),
    "experiment": _lazy("lab.experiments", "run one evaluation experiment and write its JSON results "
                                      "(--quick: a CPU sample)"),
    "figures": Command("rebuild every evaluation figure from stored results (no GPU, nothing re-measured)",
                       _figures_arguments, _figures_run),
    "report": _lazy("lab.report", "render docs/performance.md and the README's headline table from stored results "
                    "(--check: exit 1 if they differ)"),
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
    130 with one line for Ctrl-C (129 and 143 for SIGHUP and SIGTERM, which end a command as Ctrl-C does),
    141 and no word when stdout is a pipe its reader closed."""
    from .launch import as_rank
    as_rank()
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # what a launcher repeats for every rank
    status, received = None, [signal.SIGINT]
    try:
        with _signals_as_ctrl_c() as received:
            status = _run(args, received)
    except KeyboardInterrupt:       # a SIGTERM or SIGHUP while the command ended: its outcome stands, if it had one
        if status is None:
            status = 128 + received[-1]
    return status


def _run(args, received: list) -> int:
    """The command's exit status, its errors said in one line."""
    try:
        status = args.run(args) or 0
        sys.stdout.flush()                  # a closed pipe shows here, not at exit
        return status
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        return _quiet_pipe()
    except RnnGraphError as e:
        from ..train.distributed import PeerLost
        return _say(f"error: {e}", 2, peer=isinstance(e, PeerLost))
    except MemoryError as e:            # numpy's message names the size it tried to allocate
        return _say(f"error: out of memory: {e or 'an allocation failed'}; try smaller sizes", 2)
    except Interrupted as e:
        return _say(f"{_stopped(received)}; {e}", 128 + received[-1])
    except KeyboardInterrupt:
        return _say(f"{_stopped(received)}; {args.interrupted}", 128 + received[-1])


# -- signals and pipes ---------------------------------------------------------------------------

ENDING_SIGNALS = ("SIGTERM", "SIGHUP")      # raise KeyboardInterrupt, as Ctrl-C does; status 128 + the number
PIPE_STATUS = 128 + signal.SIGPIPE          # 141: what a shell shows for a command whose reader left


@contextlib.contextmanager
def _signals_as_ctrl_c():
    """SIGTERM and SIGHUP raise KeyboardInterrupt while the command runs (in the main thread, where their
    handler is the default: a SIGHUP that nohup ignores stays ignored); yields the list of signal numbers
    received, [SIGINT] until one is."""
    received, running = [signal.SIGINT], True

    def stop(signum, frame):
        received.append(signum)
        if running:                 # once the command has ended (restoring the handlers), it only counts
            raise KeyboardInterrupt

    installed = {}
    if threading.current_thread() is threading.main_thread():
        for name in ENDING_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
                installed[sig] = signal.signal(sig, stop)
    try:
        yield received
    finally:
        running = False
        for sig, old in installed.items():
            signal.signal(sig, old)


def _stopped(received: list) -> str:
    """'interrupted' for Ctrl-C, 'stopped by SIGTERM' for a signal that ended the command."""
    return "interrupted" if received[-1] == signal.SIGINT else f"stopped by {signal.Signals(received[-1]).name}"


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (the BrokenPipeError came from there, not a socket)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))


def _quiet_pipe() -> int:
    """Exit status 141 and no word: stdout now points at /dev/null, so the interpreter's last flush is silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    from .launch import write_fault
    write_fault("stdout closed", PIPE_STATUS, False)    # in a launched rank: the launcher ends quietly too
    return PIPE_STATUS


def _say(message: str, status: int, peer: bool = False) -> int:
    message = " ".join(message.splitlines())
    from .launch import write_fault
    if not write_fault(message, status, peer):
        rank = os.environ.get("RANK") if os.environ.get("WORLD_SIZE", "1") != "1" else None
        named = message.removeprefix("error: ").startswith("rank ")      # a collective's error names it already
        prefix = f"rank {rank}: " if rank is not None and not named else ""
        print(f"rnngraph: {prefix}{message}", file=sys.stderr)
    return status
