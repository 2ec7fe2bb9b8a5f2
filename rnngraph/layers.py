"""Feed-forward layers, losses and the Sequential container that sit on top of the recurrent layers.

Forward and backward are paired through an explicit cache of saved activations:
`y, cache = m.forward(x)` and `grad_x = m.backward(grad_y, cache)`. Calling `m(x)` keeps that call's
cache, so `m.backward(grad_y)` serves the usual one-forward-one-backward loop. Parameter gradients land
in `m.grads` (name -> array), overwritten, never accumulated, by each backward. All math is written once
against the array module of the inputs (numpy, or cupy on the GPU).
"""
from __future__ import annotations

import numpy

from .arrays import array_module, float_dtype, make_rng, to_numpy
from .backends import get_backend
from .errors import RnnGraphError
from .init import init_uniform


def check_state_dict(owner: str, expected: dict, got: dict) -> None:
    """Raises one error listing every missing key, unexpected key and wrong shape (expected: name -> shape)."""
    problems = [f"missing key {k!r} (shape {tuple(s)})" for k, s in expected.items() if k not in got]
    problems += [f"unexpected key {k!r}" for k in got if k not in expected]
    problems += [f"{k!r}: expected shape {tuple(s)}, got {tuple(numpy.shape(got[k]))}"
                 for k, s in expected.items() if k in got and tuple(numpy.shape(got[k])) != tuple(s)]
    if problems:
        raise RnnGraphError(f"{owner}.load_state_dict: " + "; ".join(problems))


def _check_float(x, who: str, xp=None, dtype=None) -> None:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise RnnGraphError(f"{who}: expected an array, got {type(x).__name__}")
    if xp is not None and array_module(x) is not xp:
        raise RnnGraphError(f"{who}: expected a {xp.__name__} array (where the parameters or the other "
                            f"inputs live), got a {array_module(x).__name__} array; move it with {xp.__name__}.asarray")
    if dtype is not None and x.dtype != dtype:
        raise RnnGraphError(f"{who}: dtype mismatch, expected {dtype}, got {x.dtype}; convert with "
                            f".astype('{dtype}') (or build the layer with dtype='{x.dtype}')")
    if dtype is None and x.dtype.kind != "f":
        raise RnnGraphError(f"{who}: expected a float array, got dtype {x.dtype}")


def log_softmax(xp, x, axis: int = -1):
    """x - logsumexp(x) along `axis`, shifted by the max so that exp never overflows."""
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


class Module:
    """Base of the feed-forward modules: `m(x) -> y`, `m.backward(grad_y) -> grad_x`, torch-style state dicts."""
    recurrent = False

    def __init__(self):
        self._params = {}                 # name -> live array; optimizers update these in place
        self.grads = {}                   # name -> gradient of the last backward
        self._cache = None

    def __call__(self, x):
        y, self._cache = self.forward(x)
        return y

    def _cached(self, cache):
        cache = self._cache if cache is None else cache
        if cache is None:
            raise RnnGraphError(f"{type(self).__name__}.backward needs a forward call (or an explicit cache) first")
        return cache

    def parameters(self) -> dict:
        """name -> the live parameter array (updating it in place updates the layer)."""
        return dict(self._params)

    def state_dict(self) -> dict:
        """name -> host numpy copy, with PyTorch's names and shapes."""
        return {k: to_numpy(v) for k, v in self._params.items()}

    def load_state_dict(self, d: dict) -> None:
        """Copies `d` (numpy arrays, e.g. a torch state_dict converted with .numpy()) into the parameters in place."""
        check_state_dict(type(self).__name__, {k: v.shape for k, v in self._params.items()}, d)
        for k, p in self._params.items():
            p[...] = array_module(p).asarray(d[k], dtype=p.dtype)


class Dense(Module):
    """y = x·Wᵀ + b over the last dimension of any [..., in_features] input, as one GEMM over all leading rows.

    An LSTM's [T, B, H] output goes in as it is: Dense reshapes it to [T·B, H] internally.
    Parameters as torch.nn.Linear: `weight` [out, in] and `bias` [out], both uniform(±1/√in_features),
    which is the distribution torch's default (kaiming_uniform with a=√5) reduces to.

    >>> dense = Dense(16, 4, dtype="float64", seed=0)
    >>> y = dense(numpy.zeros((10, 3, 16)))              # y: [10, 3, 4]
    >>> grad_x = dense.backward(numpy.ones_like(y))      # grad_x: [10, 3, 16]; dense.grads["weight"]: [4, 16]
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype="float32",
                 seed=None, rng=None, backend="numpy"):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise RnnGraphError(f"Dense needs positive sizes, got in_features={in_features}, "
                                f"out_features={out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.dtype = float_dtype(dtype)
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.xp = self.backend.xp
        rng = make_rng(seed, rng)
        w = init_uniform(rng, (out_features, in_features), in_features, self.dtype)    # [out, in]
        self._params["weight"] = self.xp.asarray(w)
        if bias:
            self._params["bias"] = self.xp.asarray(init_uniform(rng, (out_features,), in_features, self.dtype))

    @property
    def weight(self):                     # [out, in]
        return self._params["weight"]

    @property
    def bias(self):                       # [out] or None
        return self._params.get("bias")

    def forward(self, x):                 # x: [..., in] -> y: [..., out], cache
        _check_float(x, "Dense", self.xp, self.dtype)
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise RnnGraphError(f"Dense(in_features={self.in_features}) expected input [..., {self.in_features}], "
                                f"got shape {tuple(x.shape)}")
        x2 = x.reshape(-1, self.in_features)                            # [N, in], N = T·B
        y2 = x2 @ self.weight.T                                         # [N, out]
        if self.bias is not None:
            y2 += self.bias
        return y2.reshape(x.shape[:-1] + (self.out_features,)), (x2, x.shape)

    def backward(self, grad_y, cache=None):   # grad_y: [..., out] -> grad_x: [..., in]
        x2, shape = self._cached(cache)
        want = tuple(shape[:-1]) + (self.out_features,)
        _check_float(grad_y, "Dense.backward", self.xp, self.dtype)
        if tuple(grad_y.shape) != want:
            raise RnnGraphError(f"Dense.backward expected grad_y of shape {want}, got {tuple(grad_y.shape)}")
        g2 = grad_y.reshape(-1, self.out_features)                      # [N, out]
        self.grads = {"weight": g2.T @ x2}                              # [out, in], one GEMM over all frames
        if self.bias is not None:
            self.grads["bias"] = g2.sum(axis=0)                         # [out]
        return (g2 @ self.weight).reshape(shape)


class Softmax(Module):
    """softmax along `dim` (the class dimension, last by default) of e.g. [T, B, C] input.

    >>> p = Softmax()(numpy.zeros((5, 2, 3)))            # p: [5, 2, 3], each row sums to 1
    """

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):                 # x: [..., C] -> p: [..., C], cache p
        _check_float(x, "Softmax")
        e = array_module(x).exp(x - x.max(axis=self.dim, keepdims=True))
        p = e / e.sum(axis=self.dim, keepdims=True)
        return p, p

    def backward(self, grad_y, cache=None):   # grad_y: [..., C] -> grad_x: [..., C]
        p = self._cached(cache)
        return p * (grad_y - (grad_y * p).sum(axis=self.dim, keepdims=True))


class LogSoftmax(Module):
    """log softmax along `dim` (last by default), computed as x - logsumexp(x) so it never overflows.

    >>> logp = LogSoftmax()(numpy.zeros((5, 2, 3)))      # logp: [5, 2, 3], all log(1/3)
    """

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):                 # x: [..., C] -> logp: [..., C], cache softmax
        _check_float(x, "LogSoftmax")
        xp = array_module(x)
        logp = log_softmax(xp, x, self.dim)
        return logp, xp.exp(logp)

    def backward(self, grad_y, cache=None):   # grad_y: [..., C] -> grad_x: [..., C]
        p = self._cached(cache)
        return grad_y - p * grad_y.sum(axis=self.dim, keepdims=True)


class _Loss:
    """Losses: `loss(input, target, mask=None) -> 0-d array` (or per-element for reduction='none')."""
    recurrent = False

    def __init__(self, reduction: str):
        if reduction not in ("mean", "sum", "none"):
            raise RnnGraphError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.reduction = reduction
        self._cache = None

    def __call__(self, input, target, mask=None):
        loss, self._cache = self.forward(input, target, mask)
        return loss

    def _grad_scale(self, xp, grad, count, dtype):
        """The upstream gradient per element: grad [] (or [...] for 'none'), divided by count for 'mean'."""
        if self.reduction == "none":
            if grad is None:
                raise RnnGraphError("reduction='none' needs grad of the per-element loss's shape")
            return xp.asarray(grad, dtype=dtype)
        g = xp.asarray(1.0 if grad is None else grad, dtype=dtype)
        return g / count if self.reduction == "mean" else g

    def _reduce(self, xp, per, count):
        if self.reduction == "none":
            return per
        total = per.sum()
        if self.reduction == "sum":
            return xp.asarray(total)          # a 0-d array, not a numpy scalar
        with numpy.errstate(invalid="ignore", divide="ignore"):
            return xp.asarray(total / count)  # like torch: nan when nothing is counted

    def _cached(self, cache):
        cache = self._cache if cache is None else cache
        if cache is None:
            raise RnnGraphError(f"{type(self).__name__}.backward needs a forward call (or an explicit cache) first")
        return cache


def _check_mask(mask, shape, who, xp):
    if mask is None:
        return None
    if array_module(mask) is not xp:
        raise RnnGraphError(f"{who}: expected the mask as a {xp.__name__} array, got {array_module(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise RnnGraphError(f"{who}: expected mask of shape {tuple(shape)}, got {tuple(mask.shape)}")
    return mask.astype(bool)


class CrossEntropyLoss(_Loss):
    """Softmax cross-entropy of logits [..., C] (classes last, e.g. [T, B, C] or [N, C]) and integer targets [...].

    Targets equal to `ignore_index`, and frames where `mask` [...] is False (padding), count for nothing;
    'mean' divides by the number of counted targets (torch's rule; nan if there are none).
    Unlike torch's [N, C, d] layout, the class dimension is the last one, which is what Dense produces.

    >>> ce = CrossEntropyLoss()
    >>> loss = ce(numpy.zeros((5, 2, 3)), numpy.zeros((5, 2), dtype=int))   # loss: [] = log 3
    >>> dlogits = ce.backward()                                            # dlogits: [5, 2, 3]
    """

    def __init__(self, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(reduction)
        self.ignore_index = ignore_index

    def _check(self, logits, target):
        _check_float(logits, "CrossEntropyLoss")
        if logits.ndim < 2:
            raise RnnGraphError(f"CrossEntropyLoss expected logits [..., C] with at least 2 dimensions, "
                                f"got shape {tuple(logits.shape)}")
        want = tuple(logits.shape[:-1])
        if not hasattr(target, "dtype") or target.dtype.kind not in "iu":
            got = getattr(target, "dtype", type(target).__name__)
            raise RnnGraphError(f"CrossEntropyLoss expected integer class-index targets, got {got}")
        if array_module(target) is not array_module(logits):
            raise RnnGraphError(f"CrossEntropyLoss: logits are a {array_module(logits).__name__} array but "
                                f"targets a {array_module(target).__name__} array; move them together")
        if tuple(target.shape) != want:
            hint = ""
            if tuple(target.shape) == tuple(logits.shape):
                hint = " (one-hot targets? pass class indices instead)"
            elif tuple(target.shape) == want[::-1]:
                hint = " (time and batch dimensions swapped?)"
            raise RnnGraphError(f"CrossEntropyLoss expected targets of shape {want} (logits.shape[:-1]), "
                                f"got {tuple(target.shape)}{hint}")

    def forward(self, logits, target, mask=None):   # logits: [..., C], target: [...] int, mask: [...] -> loss, cache
        self._check(logits, target)
        xp, C = array_module(logits), logits.shape[-1]
        valid = target != self.ignore_index                                  # [...]
        mask = _check_mask(mask, target.shape, "CrossEntropyLoss", xp)
        if mask is not None:
            valid &= mask
        if bool((valid & ((target < 0) | (target >= C))).any()):
            raise RnnGraphError(f"CrossEntropyLoss: targets must lie in [0, {C}) or equal "
                                f"ignore_index={self.ignore_index}")
        safe = xp.where(valid, target, 0)                                    # [...]
        logp = log_softmax(xp, logits)                                       # [..., C]
        picked = xp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]  # [...]
        per = xp.where(valid, -picked, 0).astype(logits.dtype)               # [...]
        count = valid.sum(dtype=logits.dtype)
        return self._reduce(xp, per, count), (logp, safe, valid, count)

    def backward(self, grad=None, cache=None):   # grad: [] ([...] for 'none') -> dlogits: [..., C]
        logp, safe, valid, count = self._cached(cache)
        xp = array_module(logp)
        onehot = xp.arange(logp.shape[-1]) == safe[..., None]               # [..., C]
        scale = self._grad_scale(xp, grad, count, logp.dtype) * valid       # [] or [...]
        scale = scale[..., None] if scale.ndim else scale
        return (xp.exp(logp) - onehot) * scale


class MSELoss(_Loss):
    """Mean squared error of input and target of equal shape [..., F]; an optional mask [T, B] (a prefix of the
    shape) drops padded frames, and 'mean' then divides by the number of counted elements.

    >>> mse = MSELoss()
    >>> loss = mse(numpy.ones((5, 2, 1)), numpy.zeros((5, 2, 1)))   # loss: [] = 1.0
    >>> grad = mse.backward()                                       # grad: [5, 2, 1]
    """

    def __init__(self, reduction: str = "mean"):
        super().__init__(reduction)

    def forward(self, input, target, mask=None):   # input, target: [..., F], mask: [T, B] -> loss, cache
        _check_float(input, "MSELoss")
        _check_float(target, "MSELoss target", array_module(input), input.dtype)
        if tuple(input.shape) != tuple(target.shape):
            raise RnnGraphError(f"MSELoss expected target of the input's shape {tuple(input.shape)}, "
                                f"got {tuple(target.shape)}")
        xp = array_module(input)
        diff = input - target                                               # [..., F]
        count = xp.asarray(diff.size, dtype=input.dtype)
        if mask is not None:
            m = _check_mask(mask, input.shape[:mask.ndim], "MSELoss", xp)
            m = m.reshape(m.shape + (1,) * (input.ndim - m.ndim))
            diff = diff * m
            count = m.sum(dtype=input.dtype) * (diff.size // m.size)
        return self._reduce(xp, diff * diff, count), (diff, count)

    def backward(self, grad=None, cache=None):   # grad: [] ([..., F] for 'none') -> grad_input: [..., F]
        diff, count = self._cached(cache)
        return 2 * diff * self._grad_scale(array_module(diff), grad, count, diff.dtype)


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

    def load_state_dict(self, d: dict) -> None:
        """Checks every key and shape of the whole model first (one error lists them all), then loads each module."""
        check_state_dict("Sequential", {k: numpy.shape(v) for k, v in self.state_dict().items()}, d)
        for i, m in enumerate(self.modules):
            prefix = f"{i}."
            m.load_state_dict({k[len(prefix):]: v for k, v in d.items() if k.startswith(prefix)})
