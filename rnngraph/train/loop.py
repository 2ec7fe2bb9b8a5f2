"""Training a character-level language model over S continuous streams with truncated BPTT: the loop,
validation, logs, checkpoints and exact resume. `rnngraph train` (lab/commands.py) is a thin layer on `train`.

Each step reads chunk k of every stream (inputs and targets [K, S]), runs the model from the state the
previous chunk left, backpropagates through those K frames only, clips the global gradient norm and
updates. Streams restart from zero states at each epoch. Step n always reads the same chunk, draws the
same dropout masks and uses the same learning rate, so a resumed run repeats an uninterrupted one bit
for bit on the CPU.

A loss that is not finite or beyond DIVERGED × log2(V) bits per character (V characters; log2(V) is a uniform
guess) has diverged: at a step (before the update), at a validation, or for the weights about to be saved.
The run stops with one line, and the last good checkpoint stays as it was.
"""
from __future__ import annotations

import math
import time
import weakref
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from .charlm import MODEL_KEYS, CharLM, check_stored_cell
from .config import FIXED, Result, TrainConfig, check_resumable, check_train_config, make_optimizer, make_schedule
from .checkpoint import (check_same, load_checkpoint, model_arrays, pack_optimizer, pack_states,
                         save_checkpoint, unpack_optimizer, unpack_states)
from .data import Vocab, make_streams, read_text, split, text_digest, validation_streams
from ..arrays import HALF_DTYPES
from ..errors import RnnGraphError
from ..nn.layers import CrossEntropyLoss
from ..nn.optim import clip_grad_norm
from .held import signals_held
from .lock import hold_folder
from .logs import RunLog, read_log
from .mixed import Precision
from .ranks import CHECK_EVERY, Ranks
from .runs import check_folder, new_run_id

VAL_STREAMS = 64   # validation reads at least this many streams (fewer calls; forward only)
# A loss beyond DIVERGED × log2(V) bits per character (V: the vocabulary; log2(V) is a uniform guess, where
# every run starts) has diverged: the run stops with one line, its last good checkpoint kept.
DIVERGED = 4.0
__all__ = ["DIVERGED", "Result", "TrainConfig", "Trainer", "read_log", "train"]


class Trainer:
    """One run: data, model, optimizer and the loop's position (step, stream states, log rows).

    A resumed run runs the cell graph its checkpoint stores; with cell_given (the user named the cell
    again, `--cell`) a module:function cell is imported and must build that same graph.

    The run owns its folder cfg.out from construction until run() ends (or close()): a second run into it,
    in another process, refuses in one line naming this one (lock.py).

    Started by a launcher (`rnngraph train --gpus N`, torchrun), each process is one rank (ranks.py): it
    trains its share of the streams, and rank 0 alone locks and writes the checkpoints and logs and prints.

    Example::

        result = Trainer(TrainConfig(hidden=64, epochs=1)).run()
        print(result.val_bpc)
    """

    def __init__(self, cfg: TrainConfig, resume=None, echo=print, overwrite: bool = False,
                 cell_given: bool = False, ranks: Ranks | None = None):
        check_train_config(cfg)
        self.ranks = Ranks.join(cfg.backend) if ranks is None else ranks      # before the model: its GPU
        self.hold = hold_folder(cfg.out) if self.ranks.rank == 0 else None    # rank 0 alone writes --out
        weakref.finalize(self, self.hold.release if self.hold else _quiet)
        try:
            self._build(cfg, resume, echo, overwrite, cell_given)
        except BaseException:
            self.close()
            raise

    def _build(self, cfg: TrainConfig, resume, echo, overwrite: bool, cell_given: bool) -> None:
        ckpt = load_checkpoint(resume) if resume is not None else None
        if ckpt is not None:
            check_resumable(ckpt)
            check_same(ckpt.path, ckpt.config["train"], {k: getattr(cfg, k) for k in FIXED})
        saved_id = ckpt.config["train"].get("run_id") if ckpt else None
        cfg = replace(cfg, run_id=saved_id or cfg.run_id or new_run_id())
        if not overwrite and self.ranks.rank == 0:     # rank 0 writes; the others would race its new files
            check_folder(cfg.out, cfg.run_id, ckpt)
        self.cfg, self.echo = cfg, echo if self.ranks.rank == 0 else _quiet
        text = read_text(cfg.text)
        self.vocab = Vocab(ckpt.config["vocab"]) if ckpt else Vocab.from_text(text)
        self.digest = text_digest(text)
        if ckpt is not None and ckpt.config["text_sha256"] != self.digest:
            raise RnnGraphError(f"the text {cfg.text or '(bundled)'} differs from the one checkpoint {ckpt.path} "
                                "was trained on; pass the same --text to resume")
        train_ids, val_ids = split(self.vocab.encode(text), cfg.val_fraction)
        self.data = make_streams(train_ids, cfg.streams, cfg.bptt).part(self.ranks.mine(cfg.streams))
        val = validation_streams(val_ids, max(cfg.streams, VAL_STREAMS), cfg.bptt)
        self.val = val.part(self.ranks.part(val.streams))
        self.model_config = {**{k: getattr(cfg, k) for k in MODEL_KEYS}, "vocab_size": len(self.vocab),
                             "seed": cfg.seed}
        if ckpt is not None:
            check_stored_cell(ckpt.config["model"], ckpt.path, cell_given)
        self.lm = CharLM(ckpt.config["model"] if ckpt else self.model_config, cfg.backend, cfg.mode, cfg.loop)
        if self.ranks.size > 1:
            self.lm.share_streams(self.ranks.mine(cfg.streams).start, cfg.streams)
        self.text_file = None if cfg.text is None else str(Path(cfg.text).resolve())   # found from any cwd
        self.precision = Precision(self.lm.parameters(), cfg.dtype) if cfg.dtype in HALF_DTYPES else None
        self.opt = make_optimizer(cfg, self.lm.parameters() if self.precision is None else self.precision.masters)
        self.ce = CrossEntropyLoss()
        self.out = Path(cfg.out)
        self.logs, self.ckpt_path = RunLog(self.out), self.out / "checkpoint.npz"
        self.schedule_steps = cfg.epochs * self.data.chunks
        self.step, self.states, self.history, self.elapsed = 0, None, [], 0.0
        self.saved_step = self.saved_path = None
        if ckpt is not None:
            self._restore(ckpt)
        self.lr_at = make_schedule(cfg, self.schedule_steps, self.data.chunks)

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self) -> Path:
        """Writes the checkpoint (atomically) and the JSON log; refuses non-finite weights, and weights whose
        loss on the chunk just trained has diverged, so a diverged state never replaces the last good
        checkpoint. Every rank calls it (it gathers every stream's state and compares checksums); rank 0 writes."""
        for name, p in self.lm.parameters().items():
            if not bool(self.lm.xp.isfinite(p).all()):
                raise RnnGraphError(f"parameter {name} is not finite after step {self.step}; "
                                    f"{self._kept()} try a lower --lr or --clip")
        if self.step > 0:
            self._check_bpc(self._trained_chunk_bpc(), "the loss of the weights about to be saved",
                            "on the chunk just trained, from zero states", "not saved")
        states = None if self.states is None else self.ranks.gather_states(self.lm.states_to_host(self.states))
        self.check_ranks()
        if self.ranks.rank > 0:                 # rank 0 writes; the step is what it holds once written
            self.saved_step, self.saved_path = self.step, self.ckpt_path
            return self.ckpt_path
        opt_meta, opt_arrays = pack_optimizer(self.opt.state_dict())
        st_meta, st_arrays = (None, {}) if states is None else pack_states(states)
        run = {**asdict(self.cfg), "text": self.text_file}
        config = {"model": self.lm.config, "vocab": self.vocab.chars, "train": run,
                  "text_sha256": self.digest, "step": self.step, "elapsed_s": self.elapsed,
                  "schedule_steps": self.schedule_steps, "optimizer": opt_meta, "states": st_meta,
                  "rng": self.lm.rng_states(), "history": self.history,
                  "precision": None if self.precision is None else self.precision.state_dict()}
        weights = self.lm.state_dict() if self.precision is None else self.precision.masters     # float32 masters
        arrays = {f"model/{k}": self.lm.backend.to_numpy(v) for k, v in weights.items()}
        with signals_held():                 # a Ctrl-C now comes once the step saved is the step reported
            save_checkpoint(self.ckpt_path, config, {**arrays, **opt_arrays, **st_arrays})
            self.saved_step, self.saved_path = self.step, self.ckpt_path
            self.logs.write_json(asdict(self.cfg), self.model_config, self.lm.backend.name, self.history)
        return self.ckpt_path

    def check_ranks(self) -> None:
        """Every rank must hold the same parameters: an error naming those that differ from rank 0's."""
        self.ranks.check_same(self.lm.parameters(), self.step, f"; {self._kept()} resume from it")

    def _restore(self, ckpt) -> None:
        c = ckpt.config
        try:
            self.lm.load_state_dict(model_arrays(ckpt.arrays))
            if self.precision is not None:
                self.precision.load_state_dict(c["precision"], model_arrays(ckpt.arrays))
            self.opt.load_state_dict(unpack_optimizer(c["optimizer"], ckpt.arrays))
            self.lm.set_rng_states(c["rng"])
            if c["states"] is not None:
                every = unpack_states(c["states"], ckpt.arrays)                  # [..., S, H] per array
                self.states = self.lm.states_from_host(self.ranks.my_states(every, self.cfg.streams))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, RnnGraphError):
                raise RnnGraphError(f"checkpoint {ckpt.path} does not match the requested model: {e}") from None
            raise RnnGraphError(f"checkpoint {ckpt.path} is incomplete ({type(e).__name__}: {e}); "
                                "resume from an earlier copy or start a new run") from None
        self.step, self.elapsed, self.history = c["step"], c["elapsed_s"], list(c["history"])
        self.schedule_steps, self.saved_step, self.saved_path = c["schedule_steps"], c["step"], ckpt.path

    def close(self) -> None:
        """Gives the run's folder back (run() does when it ends); a Trainer that is not run should be closed."""
        if self.hold is not None:
            self.hold.release()

    def _kept(self) -> str:
        if self.saved_step is None:
            return "no checkpoint was written yet;"
        return f"the last good checkpoint {self.saved_path} (step {self.saved_step}) is intact;"

    # -- one step -------------------------------------------------------------------------------
    def train_step(self) -> dict:
        """Runs step self.step + 1 (chunk self.step mod chunks); returns its log row."""
        with np.errstate(all="ignore"):     # a non-finite loss or gradient norm is reported by step instead
            return self._train_step()

    def _train_step(self) -> dict:
        chunks, t0 = self.data.chunks, time.perf_counter()
        k = self.step % chunks
        if k == 0:
            self.states = None                                  # every epoch starts the streams afresh
        x, y = self.data.chunk(k)                               # [K, S] each
        logits, self.states = self.lm(x, self.states)           # [K, S/N, V]: this rank's streams
        loss = self.ranks.mean(float(self.ce(logits, self.lm.xp.asarray(y))))
        n = self.step + 1
        if not math.isfinite(loss):
            raise RnnGraphError(f"the training loss is {loss} at step {n} (epoch {self.step // chunks + 1}); "
                                f"stopped before updating the weights; {self._kept()} try a lower --lr or --clip")
        self._check_bpc(loss / math.log(2), "the training loss", f"at step {n} (epoch {self.step // chunks + 1})",
                        "stopped before updating the weights")
        grads = self.ranks.average(self.lm.backward(self.ce.backward()) if self.precision is None
                                   else self.precision.backward(self.lm, self.ce.backward()))
        if self.precision is not None:       # None: float16 overflowed (on any rank), the step is skipped
            grads = self.precision.check(grads, n, self.echo)
        norm = math.inf if grads is None else float(clip_grad_norm(grads, self.cfg.clip) if self.cfg.clip > 0
                                                     else _norm(grads))
        if grads is not None:
            if not math.isfinite(norm):
                raise RnnGraphError(f"the gradient norm is {norm} at step {n} (epoch {self.step // chunks + 1}); "
                                    f"stopped before updating the weights; {self._kept()} try a lower --lr or --clip")
            self.opt.lr = self.lr_at(self.step)
            self.opt.step(grads)
            if self.precision is not None:
                self.precision.stepped()
        self.step = n
        dt = time.perf_counter() - t0
        self.elapsed += dt
        return {"step": n, "epoch": self.step_epoch(n), "loss": loss, "bpc": loss / math.log(2),
                "val_bpc": None, "lr": self.opt.lr, "grad_norm": norm,
                "frames_per_s": self.data.bptt * self.cfg.streams / dt, "elapsed_s": self.elapsed}

    def step_epoch(self, n: int) -> float:
        """Epochs done after n steps (fractional)."""
        return n / self.data.chunks

    def validate(self) -> float:
        """Validation bpc of the current weights; a diverged one is an error (nothing is saved)."""
        t0 = time.perf_counter()
        total, count = self.ranks.sums(self.lm.loss_sums(self.val) if self.val.streams else (0.0, 0))
        self.elapsed += time.perf_counter() - t0
        bpc = float(total / count / math.log(2))
        self._check_bpc(bpc, "the validation loss", f"after step {self.step}", "stopped")
        return bpc

    # -- divergence -----------------------------------------------------------------------------
    def _check_bpc(self, bpc: float, what: str, where: str, then: str) -> None:
        """One line when `bpc` is not finite or more than DIVERGED × the uniform baseline log2(V)."""
        baseline = max(math.log2(len(self.vocab)), 1.0)
        if math.isfinite(bpc) and bpc <= DIVERGED * baseline:
            return
        raise RnnGraphError(f"{what} diverged: {bpc:.4g} bpc, more than {DIVERGED:g}× the {baseline:.2f} bpc of a "
                            f"uniform guess over {len(self.vocab)} characters, {where}; {then}; {self._kept()} try a "
                            "lower --lr or --clip")

    def _trained_chunk_bpc(self) -> float:
        """bpc of the current weights on the chunk the last step trained (eval mode: no dropout draws; zero
        states, so the stream states and random generators stay as they are)."""
        x, y = self.data.chunk((self.step - 1) % self.data.chunks)          # [K, S] each
        self.lm.eval()
        try:
            with np.errstate(all="ignore"):
                logits, _ = self.lm(x)
                loss = self.ranks.mean(float(CrossEntropyLoss()(logits, self.lm.xp.asarray(y))))
        finally:
            self.lm.train()
        return loss / math.log(2)

    # -- the loop -------------------------------------------------------------------------------
    @property
    def stop(self) -> int:   # the last epoch's end, or --max-steps if that comes first
        end = self.cfg.epochs * self.data.chunks
        return end if self.cfg.max_steps is None else min(self.cfg.max_steps, end)

    def run(self) -> Result:
        """Trains to the last epoch (or --max-steps), validating each epoch, checkpointing every N steps;
        prints a progress line every cfg.progress_every seconds while the bar is off; trains nothing (and
        writes nothing) when the run is already at its stop. The run's folder is given back when it ends."""
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> Result:
        cfg, chunks, stop, start = self.cfg, self.data.chunks, self.stop, self.step
        if start >= stop:
            return self._result(0)
        lead = self.ranks.rank == 0
        if lead:
            self.logs.open(self.history)
        over = f" over {self.ranks.size} ranks" if self.ranks.size > 1 else ""
        self.echo(f"{self.lm.rnn!r}, {self.lm.count_parameters():,} parameters; {cfg.streams} streams{over} "
                  f"× {self.data.data.shape[1]:,} characters, bptt {self.data.bptt}, {chunks} steps per epoch")
        from tqdm import tqdm
        bar = tqdm(total=stop, initial=min(self.step, stop), unit="step",
                   disable=(None if cfg.progress is None else not cfg.progress) if lead else True,
                   dynamic_ncols=True, leave=False)
        rate, shown = None, time.monotonic()
        try:
            while self.step < stop:
                row = self.train_step()
                rate = row["frames_per_s"] if rate is None else 0.9 * rate + 0.1 * row["frames_per_s"]
                if bar.disable and time.monotonic() - shown >= cfg.progress_every:
                    self.echo(f"step {self.step:,}/{stop:,}: loss {row['loss']:.3f}, bpc {row['bpc']:.3f}, "
                              f"{rate:,.0f} frames/s, {self.elapsed:.0f} s")
                    shown = time.monotonic()
                if self.step % chunks == 0 or self.step == stop:
                    row["val_bpc"] = self.validate()
                    (self.echo if bar.disable else bar.write)(self._epoch_line(row, rate))
                self.history.append(row)
                if lead:
                    self.logs.add(row)
                if self.step % CHECK_EVERY == 0:
                    self.check_ranks()
                bar.set_postfix({"loss": f"{row['loss']:.3f}", "bpc": f"{row['bpc']:.3f}",
                                 "frames/s": f"{rate:,.0f}"}, refresh=False)
                bar.update(1)
                if self.step % cfg.checkpoint_every == 0 or self.step == stop:
                    self.save()
        finally:
            bar.close()
            self.logs.close()
        if self.saved_step != self.step:
            self.save()
        return self._result(self.step - start)

    def _result(self, trained: int) -> Result:
        vals = [r["val_bpc"] for r in self.history if r["val_bpc"] is not None]
        return Result(self.history, vals[-1] if vals else float("nan"), self.elapsed, self.saved_path,
                      self.logs.csv_path, self.logs.json_path, self.lm.backend.name, self.step, trained)

    def _epoch_line(self, row: dict, rate: float) -> str:
        return (f"epoch {self.step_epoch(self.step):.2f}: step {self.step}, train bpc {row['bpc']:.3f}, "
                f"validation bpc {row['val_bpc']:.3f}, {rate:,.0f} frames/s, {self.elapsed:.0f} s")


def train(cfg: TrainConfig, resume=None, echo=print, overwrite: bool = False) -> Result:
    """Runs one training run (continuing checkpoint `resume` when given) and returns its Result.
    Refuses to write into a cfg.out holding another run's checkpoint or logs unless overwrite is True.

    Example::

        result = train(TrainConfig(hidden=128, epochs=1, out="runs/small"))
        print(f"validation bpc {result.val_bpc:.3f}")
    """
    return Trainer(cfg, resume, echo, overwrite).run()


def _norm(grads: dict) -> float:
    return math.sqrt(sum(float((g * g).sum()) for g in grads.values()))


def _quiet(*args, **kwargs) -> None:
    """The echo of ranks other than 0: they print nothing."""
