"""Feed-forward layers (Dense, Softmax, LogSoftmax) and the Sequential container that sit on top of the recurrent
layers; the losses live in rnngraph.losses and are re-exported here.

Forward and backward are paired through an explicit cache of saved activations:
`y, cache = m.forward(x)` and `grad_x = m.backward(grad_y, cache)`. Calling `m(x)` keeps that call's
cache, so `m.backward(grad_y)` serves the usual one-forward-one-backward loop. Parameter gradients land
in `m.grads` (name -> array), overwritten, never accumulated, by each backward. All math is written once
against the array module of the inputs (numpy, or cupy on the GPU).
"""
from __future__ import annotations

import numpy

from ..arrays import array_module, check_float, check_state_dict, float_dtype, make_rng, saved_cache, to_numpy
from ..run.backends import get_backend
from ..errors import RnnGraphError
from .init import init_uniform
from .losses import CrossEntropyLoss, MSELoss, log_softmax

__all__ = ["CrossEntropyLoss", "Dense", "LogSoftmax", "MSELoss", "Module", "Parameterized", "Sequential",
           "Softmax", "check_state_dict", "log_softmax"]


class Parameterized:
    """Parameters by name, in PyTorch's names and shapes, with torch-style state dicts; the base of Module
    and of the recurrent layers (rnngraph.nn.Recurrent)."""

    def __init__(self):
        self._params = {}                 # name -> live array; optimizers update these in place
        self.grads = {}                   # name -> gradient of the last backward

    def parameters(self) -> dict:
        """name -> the live parameter array (updating it in place updates the layer)."""
        return dict(self._params)

    def state_dict(self) -> dict:
        """name -> host numpy copy of each parameter, in PyTorch's names, shapes and key order."""
        return {k: to_numpy(p) for k, p in self._params.items()}

    def load_state_dict(self, d: dict, strict: bool = True):
        """Copies `d` into the parameters in place and returns self. `d` holds numpy arrays, or is a torch
        state_dict as is (``load_state_dict(torch_module.state_dict())``).

        Missing keys, unexpected keys and wrong shapes are all listed, by name, in one RnnGraphError.
        With strict=False missing and unexpected keys are skipped; wrong shapes still raise.
        """
        check_state_dict(type(self).__name__, {k: p.shape for k, p in self._params.items()}, d, strict)
        for k, v in d.items():
            if k in self._params:
                p = self._params[k]
                p[...] = array_module(p).asarray(to_numpy(v), dtype=p.dtype)
        return self


class Module(Parameterized):
    """Base of the feed-forward modules: `m(x) -> y`, `m.backward(grad_y) -> grad_x`, torch-style state dicts."""
    recurrent = False

    def __init__(self):
        super().__init__()
        self._cache = None

    def __call__(self, x):
        y, self._cache = self.forward(x)
        return y


class Dense(Module):
    """y = x·Wᵀ + b over the last dimension of any [..., in_features] input, as one GEMM over all leading rows.

    An LSTM's [T, B, H] output goes in as it is: Dense reshapes it to [T·B, H] internally.
    Parameters as torch.nn.Linear: `weight` [out, in] and `bias` [out], both uniform(±1/√in_features),
    which is the distribution torch's default (kaiming_uniform with a=√5) reduces to. They are drawn from
    the layer's own generator `dense.rng`, seeded by `seed` (0 by default, as nn.Recurrent) or given as `rng`.

    >>> dense = Dense(16, 4, dtype="float64", seed=0)
    >>> y = dense(numpy.zeros((10, 3, 16)))              # y: [10, 3, 4]
    >>> grad_x = dense.backward(numpy.ones_like(y))      # grad_x: [10, 3, 16]; dense.grads["weight"]: [4, 16]
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype="float32",
                 seed=0, rng=None, backend="numpy"):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise RnnGraphError(f"Dense needs positive sizes, got in_features={in_features}, "
                                f"out_features={out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.dtype = float_dtype(dtype)
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.xp = self.backend.xp
        self.rng = make_rng(seed, rng)
        w = init_uniform(self.rng, (out_features, in_features), in_features, self.dtype)    # [out, in]
        self._params["weight"] = self.xp.asarray(w)
        if bias:
            self._params["bias"] = self.xp.asarray(init_uniform(self.rng, (out_features,), in_features, self.dtype))

    @property
    def weight(self):                     # [out, in]
        return self._params["weight"]

    @property
    def bias(self):                       # [out] or None
        return self._params.get("bias")

    def forward(self, x):                 # x: [..., in] -> y: [..., out], cache
        check_float(x, "Dense", self.xp, self.dtype)
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise RnnGraphError(f"Dense(in_features={self.in_features}) expected input [..., {self.in_features}], "
                                f"got shape {tuple(x.shape)}")
        x2 = x.reshape(-1, self.in_features)                            # [N, in], N = T·B
        y2 = self.xp.empty((x2.shape[0], self.out_features), self.dtype)   # [N, out] = x2 · Wᵀ
        self.backend.gemm_frames(x2, self.weight, y2, tb=True)  # the backend's BLAS: on the cpu backend, its threads
        if self.bias is not None:
            y2 += self.bias
        return y2.reshape(x.shape[:-1] + (self.out_features,)), (x2, x.shape)

    def backward(self, grad_y, cache=None):   # grad_y: [..., out] -> grad_x: [..., in]
        x2, shape = saved_cache(self, cache)
        want = tuple(shape[:-1]) + (self.out_features,)
        check_float(grad_y, "Dense.backward", self.xp, self.dtype)
        if tuple(grad_y.shape) != want:
            raise RnnGraphError(f"Dense.backward expected grad_y of shape {want}, got {tuple(grad_y.shape)}")
        g2 = grad_y.reshape(-1, self.out_features)                      # [N, out]
        gw = self.xp.zeros((self.out_features, self.in_features), self.dtype)     # [out, in], added to
        gx = self.xp.empty((g2.shape[0], self.in_features), self.dtype)             # [N, in]
        self.backend.gemm_grads_frames(g2, self.weight, x2, gx, gw)     # gx = g2 · W, gw += g2ᵀ · x2: over all frames
        self.grads = {"weight": gw}
        if self.bias is not None:
            self.grads["bias"] = g2.sum(axis=0)                         # [out]
        return gx.reshape(shape)


class Softmax(Module):
    """softmax along `dim` (the class dimension, last by default) of e.g. [T, B, C] input.

    >>> p = Softmax()(numpy.zeros((5, 2, 3)))            # p: [5, 2, 3], each row sums to 1
    """

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):                 # x: [..., C] -> p: [..., C], cache p
        check_float(x, "Softmax")
        e = array_module(x).exp(x - x.max(axis=self.dim, keepdims=True))
        p = e / e.sum(axis=self.dim, keepdims=True)
        return p, p

    def backward(self, grad_y, cache=None):   # grad_y: [..., C] -> grad_x: [..., C]
        p = saved_cache(self, cache)
        return p * (grad_y - (grad_y * p).sum(axis=self.dim, keepdims=True))


class LogSoftmax(Module):
    """log softmax along `dim` (last by default), computed as x - logsumexp(x) so it never overflows.

    >>> logp = LogSoftmax()(numpy.zeros((5, 2, 3)))      # logp: [5, 2, 3], all log(1/3)
    """

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):                 # x: [..., C] -> logp: [..., C], cache softmax
        check_float(x, "LogSoftmax")
        xp = array_module(x)
        logp = log_softmax(xp, x, self.dim)
        return logp, xp.exp(logp)

    def backward(self, grad_y, cache=None):   # grad_y: [..., C] -> grad_x: [..., C]
        p = saved_cache(self, cache)
        return grad_y - p * grad_y.sum(axis=self.dim, keepdims=True)



def _is_recurrent(m) -> bool:
    return getattr(m, "recurrent", True)


class Sequential:
    """Modules run in order, e.g. recurrent layers, then Dense; forward, backward, parameters and state dict
    cover the whole model, with names prefixed by position as torch.nn.Sequential does ("0.weight_ih_l0", "1.weight").

    The module protocol (duck-typed):
      - recurrent modules (the default; rnngraph.nn layers, or a nested Sequential):
        `m(x, state=None, lengths=None) -> (y, state_n)` (lengths is passed only when given) and
        `m.backward(grad_y, grad_state_n=None) -> (grad_x, grad_state0, grads)`;
      - feed-forward modules set `recurrent = False`:
        `m(x) -> y` and `m.backward(grad_y) -> grad_x`, leaving parameter gradients in `m.grads`;
      - both have `parameters() -> {name: array}`, `state_dict()` and `load_state_dict(d)`.
    States are a list with one entry per module (None for feed-forward modules, or for zero initial states).
    A loss is not part of the model: it takes targets, so call it on the model's output.

    Example::

        model = Sequential(nn.LSTM(8, 32), Dense(32, 5))
        y, states = model(x)                          # x: [T, B, 8] -> y: [T, B, 5]; states[0] = (h_n, c_n)
        loss = ce(y, targets)                         # targets: [T, B] int
        grad_x, grad_states0, grads = model.backward(ce.backward())   # grads["0.weight_ih_l0"], grads["1.weight"], ...
    """
    recurrent = True

    def __init__(self, *modules):
        if not modules:
            raise RnnGraphError("Sequential needs at least one module")
        self.modules = list(modules)
        self.grads = {}

    def __len__(self):
        return len(self.modules)

    def __getitem__(self, i):
        return self.modules[i]

    def _per_module(self, states, what):
        if states is None:
            return [None] * len(self.modules)
        states = list(states)
        if len(states) != len(self.modules):
            raise RnnGraphError(f"Sequential expected {what} as a list of {len(self.modules)} entries "
                                f"(one per module, None for feed-forward ones), got {len(states)}")
        return states

    def __call__(self, x, states=None, lengths=None):   # x: [T, B, D], lengths: [B] -> y, states
        states, out = self._per_module(states, "states"), []
        extra = {} if lengths is None else {"lengths": lengths}
        for i, (m, s) in enumerate(zip(self.modules, states)):
            if _is_recurrent(m):
                x, s = m(x, s, **extra) if s is not None or extra else m(x)
            elif s is not None:
                raise RnnGraphError(f"Sequential: module {i} ({type(m).__name__}) is feed-forward; "
                                    f"its state must be None")
            else:
                x = m(x)
            out.append(s)
        return x, out

    def backward(self, grad_y, grad_states=None):   # grad_y: like y -> grad_x, grad_states0, grads
        grad_states, grad_states0 = self._per_module(grad_states, "grad_states"), [None] * len(self.modules)
        per_module = [None] * len(self.modules)
        for i in reversed(range(len(self.modules))):
            m, gs = self.modules[i], grad_states[i]
            if _is_recurrent(m):
                grad_y, grad_states0[i], g = m.backward(grad_y) if gs is None else m.backward(grad_y, gs)
            else:
                grad_y, g = m.backward(grad_y), m.grads
            per_module[i] = g
        self.grads = {f"{i}.{k}": v for i, g in enumerate(per_module) for k, v in g.items()}
        return grad_y, grad_states0, self.grads

    def train(self, mode: bool = True):
        """Training mode (dropout on) for every module that has one; returns self."""
        for m in self.modules:
            if hasattr(m, "train"):
                m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def parameters(self) -> dict:
        """'index.name' -> live parameter array, for the optimizers."""
        return {f"{i}.{k}": v for i, m in enumerate(self.modules) for k, v in m.parameters().items()}

    def state_dict(self) -> dict:
        """'index.name' -> host numpy copy."""
        return {f"{i}.{k}": v for i, m in enumerate(self.modules) for k, v in m.state_dict().items()}

    def load_state_dict(self, d: dict, strict: bool = True):
        """Checks every key and shape of the whole model first (one error lists them all), then loads each
        module; strict=False skips missing and unexpected keys, as in each module. Returns self."""
        check_state_dict("Sequential", {k: numpy.shape(v) for k, v in self.state_dict().items()}, d, strict)
        for i, m in enumerate(self.modules):
            prefix = f"{i}."
            part = {k[len(prefix):]: v for k, v in d.items() if k.startswith(prefix)}
            if not strict:                # each module gets a full dict: its own values where d has none
                part = {k: part.get(k, v) for k, v in m.state_dict().items()}
            m.load_state_dict(part)
        return self
