"""The evaluation's experiments as data (a grid and a measurement each), run by one runner that writes JSON
results with full metadata (format: experiments/README.md)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median
from typing import Callable

import numpy as np

from . import bench
from ..ir.cells import CELLS
from ..ir.loading import load_cell
from .options import positive_int, writable_folder
from .outputs import check_replaceable, write_text_output
from ..errors import Interrupted, RnnGraphError
from ..run.executor import Executor
from ..ir.builder import Cell
from ..plan.schedule import Gemm, Schedule, build_schedule, schedule_flops

REPO = Path(__file__).resolve().parents[2]      # the checkout rnngraph runs from (site-packages if installed)
RESULTS = REPO / "experiments" / "results"      # the committed results, found from any working directory
SCRATCH = {False: Path("runs") / "experiments", True: Path("runs") / "experiments-quick"}   # default --out
FIGURES = Path("figures")    # `rnngraph figures`' default --out for the committed results (runs/figures for others)
QUICK_LABEL = "sample from a --quick run (tiny sizes, CPU-sized): not the evaluation's GPU results"
ANALYSIS_LABEL = "schedule analysis: no timing, the same on any machine"
TIMED_IMPLS = ("naive", "staged", "graph", "cudnn")
PAPER_CELLS = ("lstm", "peephole_lstm", "gru", "min_gru", "mgu")


# -- timed experiments, through bench.measure -------------------------------------------------------

def _measure(cfg: dict, opts: dict) -> dict:
    """bench.measure for one configuration: medians forward_ms / train_ms, or {'skipped': reason}."""
    kw = {k: cfg[k] for k in ("impl", "T", "B", "H", "layers", "loop") if k in cfg}
    return bench.measure(cfg["cell"], what=tuple(cfg.get("what", ("forward", "train"))),
                         repeats=cfg.get("repeats", opts["repeats"]), warmup=cfg.get("warmup", opts["warmup"]),
                         **kw)


def _speedup_grid(quick: bool) -> list:
    Hs, T = ((16, 32), 10) if quick else ((128, 256, 512, 1024, 2048), 100)
    return [dict(cell=c, H=H, impl=i, T=T, B=1) for c in PAPER_CELLS for H in Hs for i in TIMED_IMPLS]


def _streams_grid(quick: bool) -> list:
    """S parallel streams are the batch B of one training step."""
    S, H, T = ((1, 2, 4, 8), 32, 10) if quick else (tuple(2 ** k for k in range(9)), 512, 100)
    return [dict(cell="lstm", H=H, T=T, B=B, impl=i, what=["train"]) for B in S for i in TIMED_IMPLS]


def _length_grid(quick: bool) -> list:
    """T = 10 … 10,000. Long runs get fewer repeats; naive (≈60 ms of launches per 100 GPU frames
    forward) stops at T = 1,000 in the full run."""
    Ts, H = ((10, 30, 100, 300), 32) if quick else ((10, 30, 100, 300, 1000, 3000, 10000), 512)
    out = []
    for T in Ts:
        for i in TIMED_IMPLS:
            if i == "naive" and T > 1000:
                continue
            few = dict(repeats=3, warmup=1) if T >= 3000 else {}
            out.append(dict(cell="lstm", H=H, B=1, T=T, impl=i, **few))
    return out


def _scan_grid(quick: bool) -> list:
    """minGRU at one stream: each loop strategy in graph mode (staged in a --quick CPU run) and the JAX
    associative scan, T = 100 … 16,384. Long runs get fewer repeats."""
    Ts, H, mode = ((10, 30, 100, 300), 16, "staged") if quick else ((100, 300, 1000, 4096, 16384), 512, "graph")
    out = []
    for T in Ts:
        few = dict(repeats=3, warmup=1) if T >= 4096 else {}
        out += [dict(cell="min_gru", H=H, B=1, T=T, impl=mode, loop=loop, **few)
                for loop in ("stages", "elementwise", "scan")]
        out.append(dict(cell="min_gru", H=H, B=1, T=T, impl="jax_scan", **few))
    return out


# -- CUDA-stream lanes: a stacked LSTM against the wavefront LSTM cell -----------------------------

def wavefront_lstm(layers: int):
    """A cell function: `layers` LSTM layers in one cell, layer l+1 reading layer l's h one frame
    back. The output lags the input by layers-1 frames; in exchange every layer's recurrent product
    lands in the same stage (one merged GEMM per h_l@t-1), so k CUDA-stream lanes can run them at
    once, and all layers' elementwise work is one fused kernel: 2 stages per frame, not 2·layers."""
    def build(input_size: int, hidden_size: int, bias: bool = True):
        c, H = Cell(f"wavefront_lstm{layers}"), hidden_size
        inp = c.input("x", input_size)
        for l in range(layers):
            h, cs = c.state(f"h{l}", H), c.state(f"c{l}", H)
            a = {k: c.linear(inp, f"W_i{k}{l}", H, bias=f"b_{k}{l}" if bias else None)
                 + c.linear(h, f"W_h{k}{l}", H) for k in ("i", "f", "g", "o")}
            c_new = c.bind(cs, c.sigmoid(a["f"]) * cs + c.sigmoid(a["i"]) * c.tanh(a["g"]), name=f"c{l}")
            out = c.bind(h, c.sigmoid(a["o"]) * c.tanh(c_new), name=f"h{l}")
            inp = h                     # the next layer reads h_l at t-1
        c.output(out)
        return c.build()
    return build


def _lanes_grid(quick: bool) -> list:
    """Per layer count L: the stacked LSTM (2·L stages per frame) on one stream, and the wavefront
    cell on one stream and on k lanes."""
    Ls, lanes, H, T = ((2, 3), (1, 2), 32, 10) if quick else ((2, 3, 4), (1, 2, 4), 512, 100)
    out = []
    for impl in ("staged", "graph"):
        for L in Ls:
            out.append(dict(cell="lstm", layers=L, lanes=1, H=H, T=T, B=1, impl=impl))
            out += [dict(cell="wavefront_lstm", layers=L, lanes=k, H=H, T=T, B=1, impl=impl) for k in lanes]
    return out


def _lanes(cfg: dict, opts: dict) -> dict:
    """Forward and training step of an nn.Recurrent on a cupy backend with cfg['lanes'] streams (on
    the CPU: numpy, one stream)."""
    from ..run.backends import get_backend
    from ..run.backends import gpu_problem
    from ..nn.recurrent import Recurrent
    if opts["quick"] or gpu_problem():     # the CPU: one stream, eager numpy
        if cfg["lanes"] > 1 or cfg["impl"] == "graph":
            return {"skipped": f"{cfg['impl']} with {cfg['lanes']} lane(s) needs cupy on a GPU "
                               f"({'--quick runs on the CPU' if opts['quick'] else gpu_problem()})"}
        be = get_backend("numpy")
    else:
        be = get_backend("cupy", cfg["impl"], lanes=cfg["lanes"])
    H, T, B, L = cfg["H"], cfg["T"], cfg["B"], cfg["layers"]
    wave = cfg["cell"] == "wavefront_lstm"
    layer = Recurrent(wavefront_lstm(L) if wave else "lstm", H, H, num_layers=1 if wave else L, backend=be,
                      mode=cfg["impl"])
    rng = np.random.default_rng(0)
    x, gy = (be.asarray(rng.standard_normal((T, B, H)), dtype="float32") for _ in range(2))

    def train():
        layer(x)
        layer.backward(gy)
    out = {"backend": be.name}
    for what, fn in (("forward", lambda: layer(x)), ("train", train)):
        out[f"{what}_all"] = bench.time_ms(fn, repeats=opts["repeats"], warmup=opts["warmup"],
                                           device="gpu" if be.name == "cupy" else "cpu")
        out[f"{what}_ms"] = median(out[f"{what}_all"])
    return out


# -- stage breakdown: forward variants that leave one part out ------------------------------------

PARTS = ("hoisted", "per_frame_gemm", "fused_elementwise", "launch_overhead")


def schedule_variants(s: Schedule) -> dict:
    """The schedule and three variants, each without one part: the hoisted sections (pre, post),
    the per-frame GEMMs, or the per-frame fused groups. What a removed item would write stays zero,
    which changes no remaining kernel's cost."""
    def loop_keeping(keep):
        stages = (tuple(it for it in st if keep(it)) for st in s.loop)
        return tuple(st for st in stages if st)
    return {"full": s, "no_hoisted": replace(s, pre=(), post=()),
            "no_per_frame_gemm": replace(s, loop=loop_keeping(lambda it: not isinstance(it, Gemm))),
            "no_fused_elementwise": replace(s, loop=loop_keeping(lambda it: isinstance(it, Gemm)))}


def _breakdown_grid(quick: bool) -> list:
    if quick:
        return [dict(cell=c, H=H, T=10, B=1) for c in ("lstm", "gru", "mgu") for H in (16, 64)]
    return [dict(cell="lstm", H=H, T=100, B=1) for H in (128, 512, 2048)] + \
        [dict(cell=c, H=512, T=100, B=1) for c in PAPER_CELLS if c != "lstm"]


def _breakdown(cfg: dict, opts: dict) -> dict:
    """Forward time per frame, split by leave-one-out differences. The parts are measured with CUDA-
    graph replay where there is a GPU (device time without launch cost); launch/host overhead is then
    eager minus replayed. On the CPU the parts come from eager numpy and overhead is not separable."""
    from ..run.backends import get_backend
    eager = get_backend("numpy" if opts["quick"] else "auto")
    replay = None
    if eager.name == "cupy":
        replay = get_backend("cupy", "graph")
    cell, T = load_cell(cfg["cell"], cfg["H"], cfg["H"]), cfg["T"]
    variants = schedule_variants(build_schedule(cell))
    times = {}
    for mode, be in (("staged", eager), ("graph", replay)):
        if be is None:
            continue
        params, inputs = _random_run(cell, be, T, cfg["B"])
        for name, sched in variants.items():
            ex = Executor(cell, be, schedule=sched)
            times[f"{mode}/{name}"] = median(bench.time_ms(
                lambda: ex.forward(params, inputs, {}), repeats=opts["repeats"], warmup=opts["warmup"],
                device="gpu" if be.name == "cupy" else "cpu"))
    base = "graph" if replay else "staged"
    us = lambda ms: 1000.0 * ms / T     # noqa: E731  ms per run -> µs per frame
    parts = {p: us(times[f"{base}/full"] - times[f"{base}/no_{p}"]) for p in PARTS[:3]}
    parts["launch_overhead"] = us(times["staged/full"] - times["graph/full"]) if replay else None
    out = {"backend": eager.name, "parts_from": base, "times_ms": times, "parts_us_per_frame": parts,
           "total_us_per_frame": us(times["staged/full"]),
           "replay_us_per_frame": us(times["graph/full"]) if replay else None}
    if replay is None:
        out["launch_overhead_skipped"] = "needs CUDA-graph replay (cupy backend on a GPU)"
    return out


def _random_run(cell, be, T: int, B: int, seed: int = 0):
    """Parameters U(±0.1) and inputs x [T, B, D] ~ N(0, 1), float32, on backend `be`."""
    rng = np.random.default_rng(seed)
    params = {p: be.asarray(rng.uniform(-0.1, 0.1, shape), dtype="float32") for p, shape in cell.params.items()}
    inputs = {n: be.asarray(rng.standard_normal((T, B, D)), dtype="float32") for n, D in cell.inputs.items()}
    return params, inputs


# -- schedule statistics: pure analysis ------------------------------------------------------------

def _stats_grid(quick: bool) -> list:
    return [dict(cell=c, D=512, H=512) for c in CELLS]   # analysis: quick changes nothing


def _stats(cfg: dict, opts: dict) -> dict:
    s = build_schedule(load_cell(cfg["cell"], cfg["D"], cfg["H"]))
    summary, flops = s.summary(), schedule_flops(s)
    training = {k: flops["forward"][k] + flops["backward"][k] for k in ("hoisted", "per_frame")}
    share = lambda f: f["hoisted"] / (f["hoisted"] + f["per_frame"])   # noqa: E731
    return {"ops": summary["ops"], "pre_kernels": len(s.pre), "post_kernels": len(s.post),
            "stages_per_frame": len(s.loop), "kernels_per_frame": summary["kernels_per_frame"],
            "flops_per_row": flops,
            "hoisted_flop_fraction": {"forward": share(flops["forward"]), "training": share(training)}}


# -- the registry and the runner ------------------------------------------------------------------

@dataclass(frozen=True)
class Experiment:
    description: str
    grid: Callable[[bool], list]        # quick -> configurations
    run: Callable[[dict, dict], dict]   # (configuration, options) -> measured fields or {'skipped': why}
    fields: tuple                       # keys of every record that was neither skipped nor failed
    timed: bool = True                  # False: analysis, the same on any machine


EXPERIMENTS = {
    "single_stream_speedup": Experiment(
        "staged and graph modes against naive at one stream (B = 1): LSTM, peephole LSTM, GRU, minGRU "
        "and a user-defined MGU, H = 128 … 2048, forward and training step", _speedup_grid, _measure,
        ("forward_ms", "train_ms")),
    "multi_stream_throughput": Experiment(
        "training frames per second against parallel streams S = 1 … 256 (the batch), LSTM H = 512",
        _streams_grid, _measure, ("train_ms",)),
    "stage_breakdown": Experiment(
        "forward time per frame split into hoisted GEMMs, per-frame GEMM, fused elementwise and "
        "launch/host overhead, by variants that leave one part out", _breakdown_grid, _breakdown,
        ("parts_us_per_frame", "times_ms", "total_us_per_frame")),
    "sequence_length": Experiment(
        "cost per frame for T = 10 … 10,000, LSTM H = 512, one stream", _length_grid, _measure,
        ("forward_ms", "train_ms")),
    "scan": Experiment(
        "cost per frame for T = 100 … 16,384 of minGRU's loop run frame by frame (stages), by one kernel "
        "per direction walking time (elementwise) and by a parallel scan, with JAX's associative scan",
        _scan_grid, _measure, ("forward_ms", "train_ms")),
    "schedule_stats": Experiment(
        "per cell: ops, stages per frame, kernels per frame before and after merging, share of FLOPs "
        "hoisted out of the loop (D = H = 512; pure analysis)", _stats_grid, _stats,
        ("ops", "stages_per_frame", "kernels_per_frame", "hoisted_flop_fraction"), timed=False),
    "cuda_lanes": Experiment(
        "2–4 LSTM layers: stacked on one CUDA stream, against the wavefront cell (all layers' "
        "recurrent GEMMs in one stage) on one stream and on k lanes", _lanes_grid, _lanes,
        ("forward_ms", "train_ms")),
}


def run_experiment(name: str, *, quick: bool = False, out=None, repeats: int | None = None,
                   command: str | None = None, allow_cpu: bool = False, overwrite: bool = False) -> tuple[Path, int]:
    """Runs every configuration of experiment `name` and writes OUT/NAME.json (OUT: SCRATCH[quick] by
    default, never the committed RESULTS); returns (path, number of failed configurations). A full run of
    a timed experiment needs a GPU unless allow_cpu; an existing OUT/NAME.json that rnngraph did not write
    is replaced only with overwrite (outputs.py), and that is checked before anything runs.
    Example: ``run_experiment("schedule_stats", quick=True)``."""
    from tqdm import tqdm
    exp = experiment(name)
    if exp.timed and not quick and not allow_cpu and bench.gpu_problem():
        raise RnnGraphError(f"no usable GPU ({bench.gpu_problem()}); the full {name} grid is a GPU measurement "
                            "(20+ minutes on numpy): use --quick for a CPU sample, or --allow-cpu to run it anyway")
    folder = writable_folder(SCRATCH[quick] if out is None else out, "--out DIR", raw=out,
                             missing=None if out is None else 1)
    path = check_replaceable(folder / f"{name}.json", overwrite)
    opts = {"quick": quick, "repeats": repeats or (3 if quick else 10), "warmup": 1 if quick else 2}
    grid, records = exp.grid(quick), []
    try:
        with tqdm(grid, desc=name, unit="config", file=sys.stderr, dynamic_ncols=True, disable=None, leave=False) as bar:
            for cfg in bar:
                bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("what", "warmup")))
                try:
                    result = exp.run(cfg, opts)
                except Exception as e:      # recorded, reported, counted: one bad size must not lose a GPU run
                    result = {"failed": f"{type(e).__name__}: {e}"}
                    bar.write(f"{name}: {cfg}: failed: {result['failed']}")
                records.append({**cfg, **result})
        meta = dict(bench.machine_info(), command=command or _command(sys.argv[1:]))
        label = ANALYSIS_LABEL if not exp.timed else QUICK_LABEL if quick else f"measured on {meta.get('device')}"
        doc = {"experiment": name, "description": exp.description, "quick": quick, "label": label,
               "settings": {k: v for k, v in opts.items() if k != "quick"}, "metadata": meta, "records": records}
        folder.mkdir(parents=True, exist_ok=True)
        write_text_output(path, json.dumps(doc, indent=1) + "\n", overwrite)
    except KeyboardInterrupt:
        raise Interrupted(f"{name} stopped after {len(records)} of {len(grid)} configurations; nothing was written "
                          f"({path} {'is unchanged' if path.exists() else 'was not created'})") from None
    return path, sum("failed" in r for r in records)


def experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise RnnGraphError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def load_results(path) -> dict:
    """A results file, checked: raises RnnGraphError naming the file when it is missing or malformed."""
    path = Path(path)
    name = path.stem
    hint = f"rerun `rnngraph experiment {name}`"
    if not path.is_file():
        raise RnnGraphError(f"missing results file {path}; {hint}")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RnnGraphError(f"malformed results file {path}: not JSON ({e}); {hint}") from None
    missing = [k for k in ("experiment", "quick", "label", "metadata", "records")
               if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise RnnGraphError(f"malformed results file {path}: no {', '.join(missing)}; {hint}")
    if doc["experiment"] != name or not isinstance(doc["records"], list) or not doc["records"]:
        raise RnnGraphError(f"malformed results file {path}: expected a non-empty list of records of "
                            f"experiment '{name}'; {hint}")
    fields = experiment(name).fields
    for k, r in enumerate(doc["records"]):
        if not isinstance(r, dict):
            raise RnnGraphError(f"malformed results file {path}: record {k} is not an object; {hint}")
        lacks = [] if "skipped" in r or "failed" in r else [f for f in fields if f not in r]
        if "cell" not in r or lacks:
            raise RnnGraphError(f"malformed results file {path}: record {k} lacks "
                                f"{', '.join(lacks) or 'cell'}; {hint}")
    return doc


# -- command line: `rnngraph experiment NAME` and experiments/NAME.py ---------------------------------

def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a CPU-sized run (under a minute), labelled as a sample")
    p.add_argument("--out", metavar="DIR",
                   help=f"results folder (default: {SCRATCH[False]}, or {SCRATCH[True]} with --quick, in the working "
                        "directory); the committed results are replaced only when named: --out experiments/results")
    p.add_argument("--repeats", type=positive_int, metavar="N",
                   help="timed repeats per configuration; the median is kept (default: 10; 3 with --quick)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run the full grid of a timed experiment without a GPU (on numpy: 20+ minutes)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT/NAME.json even if rnngraph did not write it (its own earlier results it always "
                        "replaces)")


def _command(argv: list, script: str | None = None) -> str:
    """The command line as typed: `rnngraph …`, `python -m rnngraph …` or `python SCRIPT …`."""
    argv0 = script or sys.argv[0]
    head = ["rnngraph"] if Path(argv0).name == "rnngraph" else \
        ["python", "-m", "rnngraph"] if argv0.endswith("__main__.py") else ["python", argv0]
    return shlex.join(head + list(argv))


def _run(name: str, args: argparse.Namespace, command: str | None = None) -> int:
    path, failed = run_experiment(name, quick=args.quick, out=args.out, repeats=args.repeats, command=command,
                                  allow_cpu=args.allow_cpu, overwrite=args.overwrite)
    print(f"wrote {path}" + (f" ({failed} configurations failed: see 'failed' in its records)" if failed else ""))
    return 1 if failed else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`rnngraph experiment NAME [--quick] [--out DIR] [--repeats N] [--allow-cpu]`."""
    p.add_argument("name", metavar="NAME", choices=list(EXPERIMENTS),
                   help=f"one of: {', '.join(EXPERIMENTS)}")
    _options(p)


def run(args: argparse.Namespace) -> int:
    return _run(args.name, args)


def main(name: str, argv: list | None = None) -> int:
    """Entry point of experiments/NAME.py: ``sys.exit(main("schedule_stats"))``."""
    p = argparse.ArgumentParser(prog=f"experiments/{name}.py", description=experiment(name).description)
    _options(p)
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _run(name, p.parse_args(argv), _command(argv, f"experiments/{name}.py"))
    except RnnGraphError as e:
        print(f"{name}: error: {' '.join(str(e).splitlines())}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"{name}: interrupted; {e}", file=sys.stderr)
        return 130
