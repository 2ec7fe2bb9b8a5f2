"""A training run's configuration (TrainConfig: every option of `rnngraph train`), its checks, the optimiser and
learning-rate schedule it names, what a run returns, and the configuration a checkpoint resumes with."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..errors import RnnGraphError
from ..nn.optim import SGD, Adam, CosineLR, StepLR
from .charlm import MODEL_KEYS, check_model_config
from .checkpoint import load_checkpoint
from .runs import out_folder


@dataclass
class TrainConfig:
    """Every option of a run; `rnngraph train --help` describes each."""
    text: str | None = None          # a UTF-8 text file; None: the bundled corpus
    cell: str = "lstm"
    layers: int = 1
    hidden: int = 256
    dropout: float = 0.0
    dtype: str = "float32"
    streams: int = 32                # S, the batch
    bptt: int = 32                   # K, frames per chunk
    val_fraction: float = 0.05
    optimizer: str = "adam"          # adam | sgd (with momentum)
    lr: float = 1e-2
    momentum: float = 0.9
    clip: float = 5.0                # global gradient-norm limit; 0: none
    schedule: str = "cosine"         # cosine (to lr/10) | step (halve each epoch) | constant
    seed: int = 0
    epochs: int = 2
    max_steps: int | None = None     # stop early after this many steps in total
    backend: str = "auto"
    mode: str = "staged"
    loop: str = "auto"               # loop strategy: auto | stages | elementwise | scan
    out: str = "runs/train"
    checkpoint_every: int = 200
    progress: bool | None = None     # tqdm bar; None: only on a terminal
    progress_every: float = 10.0     # seconds between progress lines while the bar is off; 0: every step
    run_id: str | None = None        # the run's identity, kept across resumes; None: a new id (runs.py)


# Settings a resumed run must share with its checkpoint; the others (epochs, backend, out, ...) may change.
FIXED = MODEL_KEYS + ("streams", "bptt", "val_fraction", "optimizer", "lr", "momentum", "clip", "schedule",
                      "seed")


@dataclass
class Result:
    """What a run returns: its log rows (one per step), final validation bpc, time and files."""
    history: list
    val_bpc: float
    seconds: float
    checkpoint: Path
    log_csv: Path
    log_json: Path
    backend: str = ""
    steps: int = 0
    trained: int = 0                 # steps run by this call (0: the checkpoint was already at the stop)


def check_train_config(cfg: TrainConfig) -> None:
    """Clear errors for options no run can use."""
    check_model_config(asdict(cfg))
    for k in ("streams", "bptt", "epochs", "checkpoint_every"):
        if int(getattr(cfg, k)) <= 0:
            raise RnnGraphError(f"--{k.replace('_', '-')} must be a positive integer, got {getattr(cfg, k)}")
    if cfg.max_steps is not None and cfg.max_steps <= 0:
        raise RnnGraphError(f"--max-steps must be a positive integer, got {cfg.max_steps}")
    if not cfg.progress_every >= 0:
        raise RnnGraphError(f"--progress-every must be a number of seconds >= 0, got {cfg.progress_every}")
    out_folder(cfg.out)
    if cfg.optimizer not in ("adam", "sgd"):
        raise RnnGraphError(f"--optimizer must be 'adam' or 'sgd', got {cfg.optimizer!r}")
    if cfg.schedule not in ("cosine", "step", "constant"):
        raise RnnGraphError(f"--schedule must be 'cosine', 'step' or 'constant', got {cfg.schedule!r}")
    if not (cfg.lr > 0 and math.isfinite(cfg.lr)) or cfg.clip < 0 or cfg.momentum < 0:
        raise RnnGraphError(f"need --lr > 0, --clip >= 0 and --momentum >= 0, got {cfg.lr}, {cfg.clip}, "
                            f"{cfg.momentum}")


def make_optimizer(cfg: TrainConfig, params: dict):
    if cfg.optimizer == "adam":
        return Adam(params, lr=cfg.lr)
    return SGD(params, lr=cfg.lr, momentum=cfg.momentum)


def make_schedule(cfg: TrainConfig, total_steps: int, steps_per_epoch: int):
    """step -> learning rate."""
    if cfg.schedule == "cosine" and total_steps > 1:
        return CosineLR(cfg.lr, total_steps, min_lr=cfg.lr / 10)
    if cfg.schedule == "step":
        return StepLR(cfg.lr, steps_per_epoch, gamma=0.5)
    return lambda step: cfg.lr


def config_for_resume(path, **overrides) -> TrainConfig:
    """The checkpoint's TrainConfig with `overrides` (non-None values) applied; out defaults to its folder.
    `path` is a checkpoint file or the run folder holding it."""
    ckpt = load_checkpoint(path)
    check_resumable(ckpt)
    names = {f.name for f in fields(TrainConfig)}
    saved = {k: v for k, v in ckpt.config["train"].items() if k in names}
    saved["out"] = str(ckpt.path.parent)
    saved.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**saved)


def check_resumable(ckpt) -> None:
    """One error naming what a checkpoint lacks to be resumed."""
    missing = [k for k in ("model", "vocab", "train", "text_sha256", "step", "optimizer", "rng", "history")
               if k not in ckpt.config]
    if missing:
        raise RnnGraphError(f"checkpoint {ckpt.path} is incomplete: its config lacks {', '.join(missing)}")
