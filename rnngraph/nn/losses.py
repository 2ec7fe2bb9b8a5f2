"""Losses with a forward and a backward: softmax cross-entropy (integer targets, ignore index, padding mask) and MSE.

`loss = l(input, target, mask=None)` keeps that call's cache, so `l.backward()` returns the gradient of the
loss with respect to the input. All math is written once against the array module of the inputs.
"""
from __future__ import annotations

import numpy

from ..arrays import array_module, check_float, saved_cache
from ..errors import RnnGraphError


def log_softmax(xp, x, axis: int = -1):
    """x - logsumexp(x) along `axis`, shifted by the max so that exp never overflows."""
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


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
        check_float(logits, "CrossEntropyLoss")
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
        logp, safe, valid, count = saved_cache(self, cache)
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
        check_float(input, "MSELoss")
        check_float(target, "MSELoss target", array_module(input), input.dtype)
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
        diff, count = saved_cache(self, cache)
        return 2 * diff * self._grad_scale(array_module(diff), grad, count, diff.dtype)
