"""`rnngraph train` and `rnngraph sample`: their options, resume handling, Ctrl-C (and SIGTERM, SIGHUP) and
closing summaries."""
from __future__ import annotations

import argparse
import os
from dataclasses import fields, replace
from functools import partial
from pathlib import Path

from .options import LOOP_CHOICES, positive_int
from ..errors import Interrupted, RnnGraphError
from ..run.backends import CHOICES as BACKEND_CHOICES
from ..train import sample
from ..train.distributed import World, share
from ..train.config import TrainConfig, config_for_resume
from ..train.loop import Trainer

D = TrainConfig()   # the defaults, shown in --help


def train_arguments(p: argparse.ArgumentParser) -> None:
    """`rnngraph train`. Every option defaults to None so that --resume can tell what was asked for from what was not."""
    m = p.add_argument_group("model")
    m.add_argument("--cell", help=f"a built-in cell, module:function or path/to/file.py:function (default: {D.cell})")
    m.add_argument("--layers", type=positive_int, metavar="N", help=f"stacked recurrent layers (default: {D.layers})")
    m.add_argument("--hidden", type=positive_int, metavar="H", help=f"hidden features per layer (default: {D.hidden})")
    m.add_argument("--dropout", type=float, metavar="P",
                   help=f"dropout between layers and before the output layer (default: {D.dropout})")
    m.add_argument("--dtype", choices=("float32", "float64", "bfloat16", "float16"),
                   help=f"(default: {D.dtype}; bfloat16/float16: half-precision recurrence, float32 head, "
                        "float32 master weights, loss scaling for float16)")
    d = p.add_argument_group("data")
    d.add_argument("--text", metavar="FILE", help="a UTF-8 text file (default: the bundled Shakespeare, 1.6 MB)")
    d.add_argument("--streams", type=positive_int, metavar="S", help=f"parallel training streams, the batch (default: {D.streams})")
    d.add_argument("--bptt", type=positive_int, metavar="K", help=f"frames per truncated-BPTT chunk (default: {D.bptt})")
    d.add_argument("--val-fraction", type=float, metavar="F",
                   help=f"the text's last fraction held out for validation (default: {D.val_fraction})")
    o = p.add_argument_group("optimisation")
    o.add_argument("--optimizer", choices=("adam", "sgd"), help=f"sgd uses --momentum (default: {D.optimizer})")
    o.add_argument("--lr", type=float, help=f"learning rate (default: {D.lr})")
    o.add_argument("--momentum", type=float, help=f"SGD momentum (default: {D.momentum})")
    o.add_argument("--clip", type=float, help=f"global gradient-norm limit, 0 for none (default: {D.clip})")
    o.add_argument("--schedule", choices=("cosine", "step", "constant"),
                   help=f"cosine decays to lr/10 over the run, step halves lr each epoch (default: {D.schedule})")
    o.add_argument("--epochs", type=positive_int, metavar="N", help=f"passes over the training text (default: {D.epochs})")
    o.add_argument("--max-steps", type=positive_int, metavar="N", help="stop after N steps in total (default: all epochs)")
    o.add_argument("--seed", type=int, help=f"initialisation and dropout seed (default: {D.seed})")
    r = p.add_argument_group("run")
    r.add_argument("--backend", choices=BACKEND_CHOICES,
                   help=f"auto takes the GPU when cupy finds one (default: {D.backend})")
    r.add_argument("--mode", choices=("naive", "staged", "graph"),
                   help=f"executor mode; graph (CUDA-graph replay) needs cupy (default: {D.mode})")
    r.add_argument("--loop", choices=LOOP_CHOICES,
                   help=f"loop strategy (default: {D.loop}, the best one the cell admits)")
    r.add_argument("--out", metavar="DIR", help=f"where checkpoint.npz, log.csv and log.json go (default: {D.out}; "
                   "with --resume, the checkpoint's folder)")
    r.add_argument("--checkpoint-every", type=positive_int, metavar="N",
                   help=f"write the checkpoint every N steps, and at the end (default: {D.checkpoint_every})")
    r.add_argument("--gpus", type=positive_int, metavar="N",
                   help="data parallel on N GPUs of this machine: one process each, NCCL, the streams split "
                        "evenly (--streams must be a multiple of N)")
    r.add_argument("--procs", type=positive_int, metavar="N",
                   help="the same with N processes on the CPU (numpy), communicating through gloo (needs torch)")
    r.add_argument("--resume", metavar="CKPT", help="continue the run saved in CKPT (a checkpoint, or the run "
                   "folder holding it) exactly where it stopped")
    r.add_argument("--overwrite", action="store_true",
                   help="write into --out even if it holds the checkpoint and logs of another run, replacing them")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction,
                   help="show the progress bar (default: on a terminal)")
    r.add_argument("--progress-every", type=float, metavar="SECONDS",
                   help="without the bar, print a progress line this often; 0: every step "
                        f"(default: {D.progress_every:g})")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name, None) is not None}
    if args.resume:
        return config_for_resume(args.resume, **given)
    return TrainConfig(**given)


def train_run(args: argparse.Namespace) -> int | None:
    cfg, ranks = config_from_args(args), _ranks(args)
    if ranks > 1:
        cfg = replace(cfg, backend="cupy" if args.gpus else "numpy")
        flag = f"--{'gpus' if args.gpus else 'procs'} {ranks}"
        if "RANK" not in os.environ:            # the launcher: start the ranks, which run the lines below
            from .launch import check_gpus, launch
            share(cfg.streams, World(0, ranks))                  # S must divide: say so before starting
            if args.gpus:
                check_gpus(ranks)
            return launch(ranks, args.argv, Path(cfg.out), flag)
        started = World.from_env().size
        if started != ranks:
            raise RnnGraphError(f"{flag} under a launcher that started {started} ranks; give the launcher's "
                                "number or drop the option")
    trainer = Trainer(cfg, args.resume, partial(print, flush=True), args.overwrite,
                      cell_given=args.cell is not None)
    try:
        result = trainer.run()
    except KeyboardInterrupt:
        raise Interrupted(kept(trainer)) from None
    if trainer.ranks.rank > 0:                 # rank 0 speaks for the run (torchrun shows every rank's output)
        return
    if not result.trained:
        print(nothing_trained(trainer))
        return
    ranks = trainer.ranks
    over = (f" × {ranks.size} ranks (the gradients' all-reduce: {1e3 * ranks.reduce_s / ranks.reduces:.2f} ms a "
            "step)" if ranks.reduces else "")
    print(f"done: {result.steps} steps on {result.backend}{over} in {result.seconds:.0f} s; validation bpc "
          f"{result.val_bpc:.3f}; checkpoint {result.checkpoint}; logs {result.log_csv}, {result.log_json}")


def _ranks(args: argparse.Namespace) -> int:
    """The ranks --gpus or --procs asks for (1: neither), with one line for what cannot go together."""
    if args.gpus and args.procs:
        raise RnnGraphError("pass --gpus N (GPUs, NCCL) or --procs N (CPU processes, gloo), not both")
    if args.gpus and args.backend == "numpy" or args.procs and args.backend == "cupy":
        raise RnnGraphError(f"--{'gpus' if args.gpus else 'procs'} runs on {'cupy' if args.gpus else 'numpy'}, "
                            f"not --backend {args.backend}; use --{'procs' if args.gpus else 'gpus'} instead")
    if args.procs and args.mode == "graph":
        raise RnnGraphError("--procs runs on the CPU, where --mode graph does not; use --gpus for graph mode")
    return args.gpus or args.procs or 1


def kept(t: Trainer) -> str:
    """What a Ctrl-C leaves: the last checkpoint and how to continue it, or that nothing was saved."""
    if t.saved_step is None:
        return (f"nothing was saved yet (the first checkpoint comes at step {min(t.cfg.checkpoint_every, t.stop)});"
                " run the same command again to start afresh")
    out = "" if t.saved_path.parent == t.out else f" --out {t.out}"
    if t.ranks.size > 1:
        out += f" --{'gpus' if t.lm.backend.name == 'cupy' else 'procs'} {t.ranks.size}"
    return (f"checkpoint {t.saved_path} holds step {t.saved_step}; continue with rnngraph train --resume "
            f"{t.saved_path}{out}")


def nothing_trained(t: Trainer) -> str:
    """Why a resumed run trained no step: its checkpoint is already at --max-steps or its last epoch's end."""
    cfg, at = t.cfg, f"nothing trained: checkpoint {t.saved_path} is already at step {t.step}"
    if cfg.max_steps is not None and t.step >= cfg.max_steps:
        return f"{at} ≥ --max-steps {cfg.max_steps}; raise --max-steps to train further"
    return (f"{at}, the end of its --epochs {cfg.epochs} ({t.data.chunks} steps each); raise --epochs to train "
            "further")


# -- sample ----------------------------------------------------------------------------------------

def sample_arguments(p: argparse.ArgumentParser) -> None:
    """`rnngraph sample`."""
    p.add_argument("checkpoint", metavar="CKPT", help="a checkpoint written by rnngraph train (checkpoint.npz), or "
                   "the run folder holding it")
    p.add_argument("--prime", default="", help="text to start from (default: a newline)")
    p.add_argument("--length", type=int, default=500, metavar="N", help="characters to generate (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="softmax temperature; 0 picks the most likely character (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="auto takes the GPU when cupy finds one (default: %(default)s)")
    p.add_argument("--mode", choices=("naive", "staged", "graph"), default="staged",
                   help="executor mode; graph needs cupy (default: %(default)s)")
    p.add_argument("--cell", help="the checkpoint's module:function cell, imported to check that it still builds the "
                   "stored graph (needed for checkpoints written before graphs were stored)")


def sample_run(args: argparse.Namespace) -> None:
    """Prints the prime, then each character as it is generated."""
    lm, vocab = sample.load_model(args.checkpoint, args.backend, args.mode, args.cell)
    shown = []

    def show(ch: str) -> None:
        shown.append(ch)
        print(ch, end="", flush=True)

    print(args.prime, end="", flush=True)
    try:
        sample.generate(lm, vocab, args.prime, args.length, args.temperature, args.seed, on_text=show)
    except KeyboardInterrupt:
        print(flush=True)
        raise Interrupted(f"kept the {len(shown)} of --length {args.length} characters printed above") from None
    print()
