"""The `rnngraph bench` command: its options, and a run timing every (cell, T, B, H) × implementation in one
process through bench.measure, a table printed and, with --json, every measurement written with
bench.machine_info()."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from ..errors import Interrupted, RnnGraphError
from ..ir.loading import cell_options, load_cell
from ..plan.schedule import build_schedule
from . import bench
from .bench import DEFAULT_CELLS, DEFAULT_IMPLS, DTYPES, IMPLS, MODES, QUICK
from .bench_report import format_table, header
from .options import LOOP_CHOICES, writable_folder
from .outputs import check_replaceable, write_text_output


def _list(kind):
    """An argparse type: one value or a comma list, e.g. '128,256,512'."""
    from argparse import ArgumentTypeError

    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ArgumentTypeError(f"expected a comma list of {kind.__name__}, got {text!r}") from None
        if kind is int and any(v <= 0 for v in values):
            raise ArgumentTypeError(f"sizes must be positive, got {text!r}")
        return values
    return parse


def add_arguments(p) -> None:
    """`rnngraph bench` options; list options are repeatable or comma lists."""
    p.add_argument("--cell", action="extend", type=_list(str), metavar="CELL",
                   help=f"built-in or module:function (default: {','.join(DEFAULT_CELLS)})")
    p.add_argument("-T", action="extend", type=_list(int), metavar="N", help="frames (default: 100)")
    p.add_argument("-B", action="extend", type=_list(int), metavar="N", help="streams, i.e. batch (default: 1)")
    p.add_argument("-H", action="extend", type=_list(int), metavar="N", help="hidden sizes (default: 512)")
    p.add_argument("-D", type=int, metavar="N", help="input features (default: H)")
    p.add_argument("--layers", type=int, metavar="N", help="stacked layers (default: 1; with --model: 2)")
    p.add_argument("--heads", type=int, metavar="N", help="heads of the cells that take heads (slstm, mh_lstm; "
                   "default: theirs)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--loop", action="extend", type=_list(str), metavar="LIST",
                   help=f"loop strategies of rnngraph's modes, each timed, of {','.join(LOOP_CHOICES)} (default: auto, "
                        "the best one the cell admits); with several, a cell skips those it does not admit")
    p.add_argument("--impls", type=_list(str), metavar="LIST",
                   help=f"implementations to time, of {','.join(IMPLS)} (default: {','.join(DEFAULT_IMPLS)}); "
                        "impl@dtype runs one in another dtype than --dtype, e.g. cudnn@float16")
    p.add_argument("--repeats", type=int, metavar="N", help="timed calls; the median is reported (default: 20)")
    p.add_argument("--warmup", type=int, metavar="N", help="untimed calls first (default: 3)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 in torch, cupy and rnngraph float32 matmuls "
                   "(default: off)")
    p.add_argument("--json", metavar="FILE", help="write every measurement and machine_info() to FILE (in a "
                   "folder that exists: checked before measuring)")
    p.add_argument("--overwrite", action="store_true",
                   help="let --json replace a file rnngraph did not write (its own earlier results it always may)")
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test: T=8, B=2, H=16, 3 repeats")
    p.add_argument("--model", choices=("charlm",), help="time a whole model's training step instead of one layer: "
                   "charlm is Embedding, --layers layers of --cell (default lstm), a Linear head, cross-entropy, "
                   "clip_grad_norm_ and AdamW (T=128, B=1,32,128, H=512 unless given), --impls of torch (torch.nn's "
                   "layer, cuDNN on CUDA), default (rnngraph.torch as it ships), staged, graph; --repeats steps timed")
    p.add_argument("--precision", type=_list(str), metavar="LIST", help="with --model: fp32, bf16 and/or fp16, the "
                   "last two under torch.autocast (default: fp32,bf16)")


def run(args) -> int:
    """Times every (cell, T, B, H) × implementation in one process; prints a table; 1 if any failed."""
    bench.set_tf32(args.tf32)                       # before anything imports cupy
    if args.model:
        if bench.torch_problem():
            raise RnnGraphError(f"--model {args.model} times torch models: {bench.torch_problem()}")
        from .bench_model import run_model
        return run_model(args, bench.machine_info)
    q = QUICK if args.quick else {}
    st = {"cells": args.cell or list(DEFAULT_CELLS), "T": args.T or q.get("T", [100]),
          "B": args.B or q.get("B", [1]), "H": args.H or q.get("H", [512]), "D": args.D, "layers": args.layers or 1,
          "dtype": args.dtype, "impls": args.impls or list(DEFAULT_IMPLS),
          "repeats": args.repeats or q.get("repeats", 20),
          "warmup": args.warmup or q.get("warmup", 3), "tf32": args.tf32, "loops": args.loop or ["auto"],
          "heads": args.heads}
    for i in st["impls"]:
        bench.impl_dtype(i, args.dtype)
    bad = [v for v in st["loops"] if v not in LOOP_CHOICES]
    if bad:
        raise RnnGraphError(f"unknown loop strateg{'ies' if len(bad) > 1 else 'y'} {bad}; choose from "
                            f"{', '.join(LOOP_CHOICES)}")
    if args.json is not None:
        writable_folder(Path(args.json).parent, "--json FILE", missing=0, raw=args.json)
        if Path(args.json).is_dir():
            raise RnnGraphError(f"--json {args.json} is a folder; give a file, e.g. {Path(args.json) / 'bench.json'}")
        check_replaceable(args.json, args.overwrite)
    threads = _torch_threads(1 if args.quick else None)   # tiny ops: threads only contend (seen: 100x)
    try:
        info = bench.machine_info()
        print(header(info) + ("\nquick: torch runs on 1 CPU thread" if args.quick else ""), flush=True)
        configs = [(c, t, b, h) for c in st["cells"] for t in st["T"] for b in st["B"] for h in st["H"]]
        with contextlib.closing(_progress(configs)) as bar:   # closed before a Ctrl-C's message is printed
            results = [_measure_or_error(c, impl, st, t, b, h, loop) for c, t, b, h in bar for impl in st["impls"]
                       for loop in (st["loops"] if bench.impl_dtype(impl, "")[0] in MODES[1:] else ["auto"])]    # naive: stages
    except KeyboardInterrupt:
        raise Interrupted("no measurements were kept" + (f"; {args.json} was not written" if args.json else "")) \
            from None
    finally:
        _torch_threads(threads)
    print(format_table(results))
    if args.json:
        write_text_output(args.json, json.dumps({"machine": info, "settings": st, "results": results},
                                                indent=1, default=str) + "\n", args.overwrite)
        print(f"rnngraph: wrote {args.json}", file=sys.stderr)
    return 1 if any("error" in r for r in results) else 0


def _measure_or_error(cell, impl, st, T, B, H, loop) -> dict:
    """bench.measure(), or the configuration plus 'error' when it raised (e.g. out of memory); a bad
    cell or option (RnnGraphError) still ends the command, except a loop strategy the cell does not
    admit among several asked for: that is a skipped row."""
    kw = {k: st[k] for k in ("D", "layers", "dtype", "repeats", "warmup")} | {"loop": loop}
    if st.get("heads") and "heads" in (cell_options(cell) or ()):
        kw["cell_options"] = {"heads": st["heads"]}
    if len(st["loops"]) > 1 and loop != "auto":
        graph = load_cell(cell, st["D"] or H, H)
        admits = build_schedule(graph).loop_strategies
        if loop not in admits:
            return {"impl": impl, "cell": graph.name, "T": T, "B": B, "H": H, **kw, "D": st["D"] or H,
                    "skipped": f"loop {loop}: the cell admits {', '.join(admits)}"}
    try:
        return bench.measure(cell, impl, T=T, B=B, H=H, **kw)
    except RnnGraphError:
        raise
    except Exception as e:
        return {"impl": impl, "cell": str(cell), "T": T, "B": B, "H": H, **kw, "D": st["D"] or H,
                "error": f"{type(e).__name__}: {e}"}


def _progress(configs):
    """tqdm on stderr; a plain line per configuration where tqdm is not installed (the GPU machine)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return (print(f"bench {k + 1}/{len(configs)}: {c}", file=sys.stderr, flush=True) or c
                for k, c in enumerate(configs))
    return tqdm(configs, desc="bench", unit="config", file=sys.stderr, disable=None, leave=False)   # no bar when piped


def _torch_threads(n):
    """Sets torch's CPU threads to n (None: leave them); returns the previous count."""
    if n is None or bench.torch_problem():
        return None
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    return old
