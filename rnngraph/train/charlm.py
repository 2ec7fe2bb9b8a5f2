"""The character-level language model that `rnngraph train`, `sample` and `demo` share: one-hot characters
into a stack of recurrent layers (any cell), dropout, then Dense to logits over the vocabulary.

    ids [T, B] -> one-hot [T, B, V] -> Recurrent -> [T, B, F] -> Dropout -> Dense -> logits [T, B, V]
"""
from __future__ import annotations

import math
import sys

import numpy as np

from ..arrays import HALF_DTYPES, dropout_mask, is_half
from ..ir.cells import CELLS
from ..ir.loading import load_cell
from ..ir.cellio import cell_from_dict, cell_to_dict, first_difference
from ..errors import RnnGraphError
from ..nn.layers import CrossEntropyLoss, Dense, Sequential
from ..nn.recurrent import Recurrent
from .mixed import ToFloat32

MODEL_KEYS = ("cell", "layers", "hidden", "dropout", "dtype")   # what fixes the model's shapes and math


class Dropout:
    """Inverted dropout as a feed-forward module (mask computed on the device, keyed by its own seeded generator)."""
    recurrent = False

    def __init__(self, p: float, backend, seed: int):
        self.p, self.backend, self.training = p, backend, True
        self.rng = np.random.default_rng(seed)
        self.grads, self._mask = {}, None
        self.window = None          # (offset, total): x's batch is that part of a larger one (dropout_mask)

    def __call__(self, x):   # x: [..., F] -> same
        if not self.training or self.p == 0:
            self._mask = None
            return x
        self._mask = dropout_mask(self.rng, x.shape, self.p, self.backend.xp, x.dtype, self.window)
        return x * self._mask

    def backward(self, grad_y):
        return grad_y if self._mask is None else grad_y * self._mask

    def train(self, mode: bool = True):
        self.training = bool(mode)
        return self

    def parameters(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass


def check_stored_cell(model: dict, path, given: bool = False) -> None:
    """Checks the cell of checkpoint `path` (its model config `model`) against the code its name builds today.

    A user's module is imported only when `given` (the user named the cell again with --cell): a built-in
    cell whose graph changed is noted in one line (the stored graph runs); a given module:function cell
    that differs is refused; a version-1 checkpoint (no stored graphs) of a module:function cell needs `given`.
    """
    spec, user = model["cell"], model["cell"] not in CELLS
    if "graphs" not in model:
        if user and not given:
            raise RnnGraphError(f"checkpoint {path} predates stored cell graphs: it names the cell {spec} but does "
                                "not hold it, and loading a checkpoint imports no module by itself; if "
                                f"{spec.partition(':')[0]} still holds the cell this run was trained with, pass "
                                f"--cell {spec} to build it from there")
        _note(f"checkpoint {path} predates stored cell graphs; building the cell {spec} from "
              f"{'its module' if user else 'rnngraph'}")
        return
    try:
        stored = [cell_from_dict(g) for g in model["graphs"]]
    except RnnGraphError as e:
        raise RnnGraphError(f"checkpoint {path}: {e}; resume from an earlier copy or start a new run") from None
    if user and not given:
        _note(f"running the graph of {spec} stored in checkpoint {path} (its module is not imported)")
        return
    diff = _first_change(spec, stored, model["hidden"])
    if diff and user:
        raise RnnGraphError(f"cell {spec} differs from the one checkpoint {path} was trained with: {diff}; drop "
                            "--cell to continue with the stored graph, or train the new cell in a new run")
    if diff:
        _note(f"the built-in cell {spec} now builds another graph than checkpoint {path} stores ({diff}); "
              "running the stored graph")


def _first_change(spec: str, stored: list, hidden: int) -> str | None:
    """How the cell `spec` builds today differs from its stored graphs (one per layer), or None."""
    for cell in stored:
        diff = first_difference(load_cell(spec, next(iter(cell.inputs.values())), hidden), cell, spec,
                                "the checkpoint")
        if diff:
            return diff
    return None


def _note(text: str) -> None:
    print(f"rnngraph: {text}", file=sys.stderr)


class CharLM:
    """A character model from a config dict: MODEL_KEYS, 'vocab_size', 'seed' and, in a checkpoint's config,
    'graphs' (the cell's stored graphs, one per layer: built from them, not from the cell's name).
    ``lm.config`` always holds the graphs.

    Example::

        lm = CharLM({"cell": "lstm", "layers": 1, "hidden": 128, "dropout": 0.0, "dtype": "float32",
                     "vocab_size": 80, "seed": 0})
        logits, states = lm(ids)               # ids: [T, B] ints -> logits: [T, B, 80]
    """

    def __init__(self, config: dict, backend: str = "numpy", mode: str = "staged", loop: str = "auto"):
        self.config = dict(config)
        V, H = config["vocab_size"], config["hidden"]
        if "graphs" in config:
            spec = [cell_from_dict(g) for g in config["graphs"]]
        else:
            spec = config["cell"]
        self.rnn = Recurrent(spec, V, H, num_layers=config["layers"],
                             dropout=config["dropout"] if config["layers"] > 1 else 0.0,
                             backend=backend, dtype=config["dtype"], mode=mode, seed=config["seed"], loop=loop)
        self.config["graphs"] = [cell_to_dict(c) for c in self.rnn.cells]
        self.backend = self.rnn.backend
        self.xp = self.backend.xp
        F = self.rnn.cells[-1].op(self.rnn.cells[-1].outputs[0]).size
        self.drop = Dropout(config["dropout"], self.backend, config["seed"] + 1)
        half = config["dtype"] in HALF_DTYPES       # half-precision recurrence, float32 head (train/mixed.py)
        self.dense = Dense(F, V, dtype="float32" if half else config["dtype"], seed=config["seed"] + 2,
                           backend=self.backend)
        self.model = Sequential(self.rnn, *([ToFloat32()] if half else []), self.drop, self.dense)
        self.onehot = self.xp.eye(V, dtype=self.rnn.dtype)   # [V, V]

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    def __call__(self, ids, states=None):
        """ids: [T, B] host or device ints; states: from the previous chunk or None.
        Returns (logits [T, B, V], states for the next chunk)."""
        x = self.onehot[self.xp.asarray(ids)]             # [T, B, V]
        return self.model(x, states)

    def step(self, ids, state=None):
        """One character per stream: ids [B] ints; state: the recurrent layers' (None, or from the last call's
        states[0] or step). Returns (logits [B, V], state): the recurrent step (one frame, never padded: one
        replay in graph mode), then the feed-forward modules."""
        y, state = self.rnn.step(self.onehot[self.xp.asarray(ids)], state)      # [B, F]
        for m in self.model.modules[1:]:
            y = m(y)
        return y, state

    def backward(self, grad_logits) -> dict:
        """Parameter gradients of the last call, name -> array (also in self.grads)."""
        self.model.backward(grad_logits)
        return self.grads

    @property
    def grads(self) -> dict:
        return self.model.grads

    def parameters(self) -> dict:
        return self.model.parameters()

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state_dict(self, d: dict) -> None:
        self.model.load_state_dict(d)

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def count_parameters(self) -> int:
        return sum(int(np.prod(p.shape)) for p in self.parameters().values())

    # -- generators and states ----------------------------------------------------------------
    def rng_states(self) -> dict:
        """The bit-generator states of every random source (dropout masks), JSON-able."""
        return {"rnn": self.rnn.rng.bit_generator.state, "dropout": self.drop.rng.bit_generator.state}

    def set_rng_states(self, states: dict) -> None:
        self.rnn.rng.bit_generator.state = states["rnn"]
        self.drop.rng.bit_generator.state = states["dropout"]

    def states_to_host(self, states) -> list:
        """Stream states (per module: None, an array or a tuple of arrays) as host numpy copies (half ones
        widened to float32, exactly: checkpoints store no half types)."""
        return map_states(states, lambda a: np.array(self.backend.to_numpy(a), dtype=np.float32 if is_half(a) else None))

    def states_from_host(self, states) -> list:
        """The inverse of states_to_host: arrays on this model's backend, in its dtype."""
        return map_states(states, lambda a: self.backend.asarray(a, dtype=self.rnn.dtype))

    def share_streams(self, offset: int, total: int) -> None:
        """Calls will carry streams offset .. offset + B of `total` (a rank's share): dropout draws that part
        of the whole batch's masks, as one process running every stream would."""
        self.rnn.stream_window = self.drop.window = (offset, total)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self, streams) -> float:
        """Bits per character over every chunk of `streams` (a data.Streams), state carried, no dropout."""
        total, count = self.loss_sums(streams)
        return total / count / math.log(2)

    def loss_sums(self, streams) -> tuple:
        """(the summed cross-entropy in nats, the number of characters) over every chunk of `streams`."""
        ce = CrossEntropyLoss(reduction="sum")
        self.eval()
        total, count, states = 0.0, 0, None
        try:
            for k in range(streams.chunks):
                x, y = streams.chunk(k)                           # [K, S] each
                logits, states = self(x, states)
                total += float(ce(logits, self.xp.asarray(y)))
                count += y.size
        finally:
            self.train()
        return total, count


def map_states(states, fn) -> list:
    """fn applied to every array of a model's stream states (per module: None, an array or a tuple)."""
    out = []
    for s in states:
        if s is None:
            out.append(None)
        else:
            out.append(tuple(fn(a) for a in s) if isinstance(s, tuple) else fn(s))
    return out


def check_model_config(config: dict) -> None:
    """Clear errors for sizes and options a model cannot be built with."""
    for k in ("layers", "hidden"):
        if int(config[k]) <= 0:
            raise RnnGraphError(f"--{k} must be a positive integer, got {config[k]}")
    if not 0 <= config["dropout"] < 1:
        raise RnnGraphError(f"--dropout must lie in [0, 1), got {config['dropout']}")
