"""`rnngraph demo`: the whole path in about a minute. It builds an LSTM and prints its schedule, trains it
briefly on the bundled Shakespeare, prints a sample and draws the training curve.

On the CPU it uses the numpy backend; with a usable GPU (cupy) it runs there and says so.
"""
from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

from ..ir.loading import load_cell
from ..run.backends import CHOICES as BACKEND_CHOICES
from ..train.data import Vocab, read_text
from ..errors import Interrupted
from ..train.lock import hold_folder
from ..train.runs import check_folder, new_run_id, out_folder, run_in
from ..plan.schedule import build_schedule
from ..train.loop import TrainConfig, train

# (hidden, streams, bptt, steps, sample length) of the full and the --quick demo
FULL = dict(hidden=256, streams=32, bptt=32, max_steps=1000, sample=400)
QUICK = dict(hidden=32, streams=8, bptt=16, max_steps=12, sample=80)


def backend_line(backend: str) -> tuple[str, str]:
    """(backend name to use, a sentence saying which device runs the demo and why)."""
    from ..run.backends import get_backend
    be = get_backend(backend)
    if be.name == "cupy":
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        name = name.decode() if isinstance(name, bytes) else name
        return "cupy", f"running on the GPU ({name}, cupy backend)"
    label = f"{be.name} backend" + (": compiled loops" if be.name == "cpu" else "")
    if backend == "auto":
        from ..run.backends import gpu_problem
        return be.name, f"running on the CPU ({label}); no GPU: {gpu_problem()}"
    return be.name, f"running on the CPU ({label})"


def run_demo(quick: bool = False, out="rnngraph-demo", backend: str = "auto", echo=print,
             overwrite: bool = False) -> dict:
    """Runs the demo and returns {"val_bpc", "sample", "figure", "checkpoint", "seconds"}. It holds `out` for
    its whole life (a second run into it refuses) and replaces its own earlier output there, but another
    run's checkpoint only when overwrite is True."""
    out = out_folder(out)
    hold = hold_folder(out)
    try:
        return _demo(quick, out, backend, echo, overwrite)
    finally:
        hold.release()


def _demo(quick: bool, out: Path, backend: str, echo, overwrite: bool) -> dict:
    from ..train.sample import generate, load_model
    from .curves import draw_training_curves

    t0 = time.perf_counter()
    size = QUICK if quick else FULL
    run_id = new_run_id("demo")
    if not overwrite:
        check_folder(out, run_id)       # before any output: the demo may replace only an earlier demo
    name, line = backend_line(backend)
    echo(f"rnngraph demo: {line}\n")
    vocab = Vocab.from_text(read_text())
    echo(f"1. An LSTM over {len(vocab)} characters, hidden size {size['hidden']}: its schedule\n")
    echo(build_schedule(load_cell("lstm", len(vocab), size["hidden"])))
    echo(f"\n2. Training it for {size['max_steps']} steps on the bundled Shakespeare "
         f"({size['streams']} streams × bptt {size['bptt']})\n")
    cfg = TrainConfig(hidden=size["hidden"], streams=size["streams"], bptt=size["bptt"], epochs=1,
                      max_steps=size["max_steps"], schedule="constant", backend=name,
                      mode="graph" if name == "cupy" else "staged", out=str(out),
                      checkpoint_every=size["max_steps"], run_id=run_id)
    result = train(cfg, echo=echo, overwrite=True)      # checked above
    first = result.history[0]["bpc"]
    echo(f"   training bpc {first:.2f} -> {result.history[-1]['bpc']:.2f}; validation bpc "
         f"{result.val_bpc:.3f} after {result.seconds:.0f} s")
    echo("\n3. A sample (temperature 0.8):\n")
    lm, vocab = load_model(result.checkpoint, name)
    sample = generate(lm, vocab, "\n", size["sample"], temperature=0.8)
    echo(sample.rstrip() + "\n")
    figure = draw_training_curves([out], out / "training_curve.png", labels=["demo"])
    echo(f"4. Drew the training curve: {figure}")
    seconds = time.perf_counter() - t0
    echo(f"\nrnngraph demo: done in {seconds:.0f} s. Next: `rnngraph train` (a few minutes on the CPU), "
         "then `rnngraph sample runs/train/checkpoint.npz`.")
    return {"val_bpc": result.val_bpc, "sample": sample, "figure": figure, "checkpoint": result.checkpoint,
            "seconds": seconds}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a few seconds' version, for tests")
    p.add_argument("--out", default="rnngraph-demo", metavar="DIR",
                   help="where the checkpoint, logs and figure go (default: %(default)s)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="auto takes the GPU when cupy finds one (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the checkpoint and logs of a training run in --out (an earlier demo's always are)")


def run(args: argparse.Namespace) -> None:
    try:
        run_demo(args.quick, args.out, args.backend, partial(print, flush=True), args.overwrite)
    except KeyboardInterrupt:
        there = run_in(args.out)
        raise Interrupted(f"kept {there.path} ({there})" if there else f"nothing was saved in {args.out}") from None
