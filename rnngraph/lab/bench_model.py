"""`rnngraph bench --model charlm`: a whole model's training step, as PyTorch users train it, with torch.nn's
recurrent layer against rnngraph.torch in each mode.

The model: tokens [T, B] -> Embedding [V, H] -> `layers` recurrent layers of the cell (H features) -> Linear
[H, V] -> cross-entropy; then zero_grad, backward, clip_grad_norm_(1.0) and an AdamW step. Steps are
pipelined (no synchronisation between them): CUDA events (perf_counter on the CPU) around a block of steps
after the warm-up ones, so the time per step is what a training loop sees. Every implementation starts from
the same weights and reads the same batches, so their losses must agree step by step, to a tolerance set by
the precision. torch is imported by the caller (bench_command.run checks it is there).
"""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import torch

from ..errors import Interrupted, RnnGraphError
from ..ir.loading import load_cell
from .bench_report import header
from .options import writable_folder
from .references import CUDNN

MODELS = ("charlm",)
IMPLS = ("torch", "default", "staged", "graph")     # torch.nn's layer (cuDNN on CUDA); rnngraph.torch as it ships
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}    # autocast dtype of each
TOL = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2, "fp16": 1e-2}     # losses' relative difference, step by step
VOCAB = 65                                           # the Shakespeare corpus's characters
DEFAULTS = {"cells": ["lstm"], "T": [128], "B": [1, 32, 128], "H": [512], "layers": 2, "steps": 20, "warmup": 5,
            "precisions": ["fp32", "bf16"], "impls": list(IMPLS)}
QUICK = {"T": [8], "B": [1, 2], "H": [16], "steps": 3, "warmup": 2}


class CharModel(torch.nn.Module):
    """Embedding -> recurrent layers -> Linear: logits [T, B, V] of tokens [T, B]."""

    def __init__(self, rnn, vocab: int, hidden: int, features: int):
        super().__init__()
        self.embed, self.rnn, self.head = torch.nn.Embedding(vocab, hidden), rnn, torch.nn.Linear(features, vocab)

    def forward(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0])


def recurrent(cell: str, impl: str, H: int, layers: int):
    """The recurrent layers of `impl`: torch.nn's (for the cells it has) or rnngraph.torch's in a mode."""
    if impl == "torch":
        cls, kw = CUDNN[load_cell(cell, H, H).name]
        return getattr(torch.nn, cls)(H, H, num_layers=layers, **kw)
    import rnngraph.torch as rt
    return rt.Recurrent(cell, H, H, layers, mode=None if impl == "default" else impl)


def unavailable(impl: str, cell: str, device: torch.device, precision: str = "fp32") -> str | None:
    if impl == "graph" and device.type != "cuda":
        return "graph mode needs CUDA tensors"
    if impl != "torch":
        return None
    name = load_cell(cell, 8, 8).name
    if name not in CUDNN:
        return f"torch.nn has no layer for cell {cell}"
    if device.type == "cpu" and PRECISIONS[precision] is not None:
        return autocast_refused(CUDNN[name][0], precision)
    return None


@functools.lru_cache(maxsize=None)
def autocast_refused(cls: str, precision: str) -> str | None:
    """Why torch.nn's layer `cls` does not train under CPU autocast in `precision` on this machine, or None: one
    frame tried once (oneDNN may have no half-precision LSTM for this CPU's instruction set: torch 2.13 on an AVX2
    machine raises 'could not create a primitive descriptor')."""
    try:
        with torch.autocast("cpu", dtype=PRECISIONS[precision]):
            getattr(torch.nn, cls)(8, 8)(torch.zeros(1, 1, 8))
    except RuntimeError as e:
        return f"torch.nn.{cls} does not run under {precision} autocast on this CPU ({str(e).split('. ')[0]})"
    return None


def measure_model(cell: str, impl: str, *, T: int, B: int, H: int, layers: int, precision: str, steps: int,
                  warmup: int, device: torch.device, seed: int = 0, weights: dict | None = None) -> dict:
    """One implementation's ms per training step (steps timed as one pipelined block, after `warmup` steps),
    its first step's seconds (kernels built, graphs recorded) and every step's loss. weights: a state dict
    to start from (the reference's), else torch's seeded initialisation."""
    res = {"model": "charlm", "cell": cell, "impl": impl, "T": T, "B": B, "H": H, "layers": layers,
           "precision": precision, "device": device.type}
    why = unavailable(impl, cell, device, precision)
    if why:
        return {**res, "skipped": why}
    torch.manual_seed(seed)
    graph = load_cell(cell, H, H)
    model = CharModel(recurrent(cell, impl, H, layers), VOCAB, H, graph.op(graph.outputs[0]).size).to(device)
    if weights is not None:
        model.load_state_dict(weights)
    res["weights"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = torch.randint(0, VOCAB, (warmup + steps, T + 1, B), generator=torch.Generator().manual_seed(seed + 1))
    batches = batches.to(device)
    step = _step_fn(model, opt, PRECISIONS[precision], device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses = []
    start = time.perf_counter()
    losses.append(step(batches[0]))
    sync()
    res["first_s"] = round(time.perf_counter() - start, 3)
    for k in range(1, warmup):
        losses.append(step(batches[k]))
    res["ms_per_step"] = _timed(lambda: losses.extend(step(b) for b in batches[warmup:]), steps, device)
    res["losses"] = torch.stack(losses).double().cpu().tolist()
    return res


def _step_fn(model, opt, autocast_dtype, device):
    """One training step on tokens [T+1, B]; returns the loss (a device tensor: no synchronisation)."""
    def step(tokens):
        with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            logits = model(tokens[:-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()
    return step


def _timed(block, steps: int, device: torch.device) -> float:
    """ms per step of `block` (which runs `steps` steps): CUDA events on the current stream around it."""
    if device.type != "cuda":
        start = time.perf_counter()
        block()
        return (time.perf_counter() - start) * 1e3 / steps
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    block()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / steps


def compare(results: list, tf32: bool) -> list:
    """Each row's largest relative loss difference from its configuration's reference and whether it is within the
    precision's tolerance. The reference: torch.nn's row where it ran, else torch.nn's float32 row of the same
    configuration (reference 'torch@fp32': its layer refused the autocast dtype, autocast_refused), else the first
    that ran."""
    groups: dict = {}
    for r in results:
        groups.setdefault((r["cell"], r["T"], r["B"], r["H"], r["layers"], r["precision"]), []).append(r)
    torch_fp32 = {key[:-1]: r for key, rs in groups.items() for r in rs
                  if key[-1] == "fp32" and r["impl"] == "torch" and "losses" in r}
    for key, rs in groups.items():
        ran = [r for r in rs if "losses" in r]
        if not ran:
            continue
        ref, name = next(((r, "torch") for r in ran if r["impl"] == "torch"), None) or \
            ((torch_fp32[key[:-1]], "torch@fp32") if key[:-1] in torch_fp32 else (ran[0], ran[0]["impl"]))
        for r in ran:
            diff = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(r["losses"], ref["losses"]))
            tol = TOL["tf32" if tf32 and r["precision"] == "fp32" else r["precision"]]
            r.update(reference=name, loss_diff=diff, losses_agree=diff <= tol, loss_tol=tol)
    return results


def format_model_table(results: list) -> str:
    """One line per (cell, B, precision): each implementation's ms per step and its ratio to torch.nn's, then
    whether every implementation's losses agree with the reference's."""
    impls = [i for i in IMPLS if any(r["impl"] == i for r in results)]
    head = ["cell", "T", "B", "H", "layers", "precision", *(f"{i} ms" for i in impls), *(f"{i}/torch" for i in impls
                                                                                         if i != "torch"),
            "losses agree (max rel diff)"]
    rows, notes, groups = [], {}, {}
    for r in results:
        groups.setdefault((r["cell"], r["T"], r["B"], r["H"], r["layers"], r["precision"]), {})[r["impl"]] = r
    for key, by in groups.items():
        ms = {i: by[i].get("ms_per_step") for i in impls if i in by}
        base = ms.get("torch")
        ratios = [f"{ms[i] / base:.2f}x" if base and ms.get(i) else "-" for i in impls if i != "torch"]
        ran = [r for r in by.values() if "losses_agree" in r]
        agree = ("yes" if all(r["losses_agree"] for r in ran) else "NO") if ran else "-"
        worst = max((r["loss_diff"] for r in ran), default=None)
        rows.append([*map(str, key), *(f"{ms[i]:.2f}" if ms.get(i) else "-" for i in impls), *ratios,
                     agree + ("" if worst is None else f" ({worst:.1e})")])
        for r in by.values():
            why = r.get("skipped") or (f"failed: {r['error']}" if "error" in r else None)
            if why:
                notes.setdefault(f"{r['impl']}: {why}", None)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = ["  ".join(str(x).ljust(w) if k == 0 else str(x).rjust(w) for k, (x, w) in enumerate(zip(row, widths)))
             for row in [head, *rows]]
    lines.append("ms per training step (forward, loss, backward, clip_grad_norm_, AdamW), pipelined; "
                 "ratios < 1: faster than torch.nn's layer")
    return "\n".join(lines + [f"skipped {n}" for n in notes])


def model_rows(settings: dict, device: torch.device, progress=lambda c: c) -> list:
    """Every (cell, B, precision) × implementation, each from the reference's initial weights."""
    results = []
    configs = [(c, b, p) for c in settings["cells"] for b in settings["B"] for p in settings["precisions"]]
    for cell, B, precision in progress(configs):
        weights = None
        for impl in settings["impls"]:
            kw = {k: settings[k] for k in ("T", "H", "layers", "steps", "warmup")}
            try:
                r = measure_model(cell, impl, B=B, precision=precision, device=device, weights=weights, **kw)
            except RnnGraphError:
                raise
            except Exception as e:              # out of memory, a failed kernel: that row, not the command
                r = {"model": "charlm", "cell": cell, "impl": impl, "B": B, "precision": precision, **kw,
                     "error": f"{type(e).__name__}: {e}"}
            weights = weights if weights is not None else r.pop("weights", None)
            r.pop("weights", None)
            results.append(r)
    return results


def run_model(args, machine_info) -> int:
    """`rnngraph bench --model charlm` (machine_info: bench's, what the header reports): prints the table;
    1 if a row failed or its losses disagree."""
    d = {**DEFAULTS, **(QUICK if args.quick else {})}
    given = {"cells": args.cell, "layers": args.layers, "impls": args.impls, "precisions": args.precision,
             "steps": args.repeats, "warmup": args.warmup, "T": args.T, "B": args.B, "H": args.H}
    st = {"model": args.model, "tf32": args.tf32, **{k: v or d[k] for k, v in given.items()}}
    for what, given, known in (("implementation", st["impls"], IMPLS), ("precision", st["precisions"], PRECISIONS)):
        bad = [v for v in given if v not in known]
        if bad:
            raise RnnGraphError(f"unknown {what} {', '.join(bad)} for --model; choose from {', '.join(known)}")
    if args.json is not None:
        writable_folder(Path(args.json).parent, "--json FILE", missing=0, raw=args.json)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = machine_info()
    print(header(info), flush=True)
    try:
        results = []
        for T in st["T"]:
            for H in st["H"]:
                results += model_rows({**st, "T": T, "H": H}, device, _progress)
    except KeyboardInterrupt:
        raise Interrupted("no measurements were kept" + (f"; {args.json} was not written" if args.json else "")) \
            from None
    compare(results, args.tf32)
    print(format_model_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "settings": st, "results": results}, indent=1,
                                              default=str) + "\n")
        print(f"rnngraph: wrote {args.json}", file=sys.stderr)
    return 1 if any("error" in r or r.get("losses_agree") is False for r in results) else 0


def _progress(configs):
    for k, c in enumerate(configs):
        print(f"bench --model {k + 1}/{len(configs)}: {c}", file=sys.stderr, flush=True)
        yield c
