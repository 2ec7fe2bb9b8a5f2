"""Optimizers (SGD, Adam with torch.optim's exact update formulas), global-norm clipping and learning-rate schedules.

Optimizers hold a dict name -> live parameter array (e.g. `model.parameters()`) and update it in place from a
dict name -> gradient: `opt.step(model.grads)`. The math is written once against the arrays' module.
"""
from __future__ import annotations

import math

import numpy

from ..arrays import array_module, to_numpy
from ..errors import RnnGraphError


class Optimizer:
    """Shared bookkeeping: parameter dict, per-parameter state, checked gradient dicts, state dicts."""
    hyper_names: tuple = ()

    def __init__(self, params: dict, lr: float):
        if not isinstance(params, dict) or not params:
            raise RnnGraphError("an optimizer takes a non-empty dict name -> array, e.g. model.parameters()")
        if lr < 0:
            raise RnnGraphError(f"lr must be >= 0, got {lr}")
        self.params = dict(params)
        self.lr = lr
        self.state = {}                   # name -> {"step": int, buffer name: array}

    def _pairs(self, grads: dict):
        """(name, param, grad) for every parameter with a gradient; a parameter without one is skipped, as in torch."""
        unknown = [k for k in grads if k not in self.params]
        if unknown:
            raise RnnGraphError(f"{type(self).__name__}.step: gradients for unknown parameters {unknown}")
        for name, p in self.params.items():
            g = grads.get(name)
            if g is None:
                continue
            if tuple(g.shape) != tuple(p.shape) or g.dtype != p.dtype:
                raise RnnGraphError(f"{type(self).__name__}.step: {name!r} expected a gradient of shape "
                                    f"{tuple(p.shape)} and dtype {p.dtype}, got {tuple(g.shape)} {g.dtype}")
            yield name, p, g

    def state_dict(self) -> dict:
        """Hyperparameters and per-parameter state as plain numpy arrays and ints, for checkpoints."""
        state = {name: {k: (v if isinstance(v, int) else to_numpy(v)) for k, v in st.items()}
                 for name, st in self.state.items()}
        return {"hyper": {k: getattr(self, k) for k in ("lr",) + self.hyper_names}, "state": state}

    def load_state_dict(self, d: dict) -> None:
        """Restores what state_dict() returned; the parameter names must be this optimizer's."""
        unknown = [k for k in d["state"] if k not in self.params]
        if unknown:
            raise RnnGraphError(f"{type(self).__name__}.load_state_dict: state for unknown parameters {unknown}")
        for k, v in d["hyper"].items():
            setattr(self, k, tuple(v) if isinstance(v, list) else v)
        self.state = {}
        for name, st in d["state"].items():
            p = self.params[name]
            self.state[name] = {k: (int(v) if k == "step" else array_module(p).asarray(v, dtype=p.dtype).copy())
                                for k, v in st.items()}


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD:
    g += wd·p; buf = g (first step) or momentum·buf + (1-dampening)·g; g = g + momentum·buf (Nesterov) or buf;
    p -= lr·g.

    Example::

        opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt.step(model.grads)
    """
    hyper_names = ("momentum", "dampening", "weight_decay", "nesterov")

    def __init__(self, params: dict, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, dampening: float = 0.0):
        super().__init__(params, lr)
        if momentum < 0 or weight_decay < 0:
            raise RnnGraphError(f"momentum and weight_decay must be >= 0, got {momentum}, {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise RnnGraphError("Nesterov momentum needs momentum > 0 and dampening = 0")
        self.momentum, self.dampening, self.weight_decay, self.nesterov = momentum, dampening, weight_decay, nesterov

    def step(self, grads: dict) -> None:
        """Updates the parameters in place from grads (name -> array); the gradient arrays are not modified."""
        for name, p, g in self._pairs(grads):
            if self.weight_decay != 0:
                g = g + self.weight_decay * p
            if self.momentum != 0:
                st = self.state.setdefault(name, {})
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = st["momentum_buffer"] = g.copy()
                else:
                    buf *= self.momentum
                    buf += (1 - self.dampening) * g
                g = g + self.momentum * buf if self.nesterov else buf
            p -= self.lr * g


def _lerp_(a, b, w: float, t=None) -> None:
    """a = a + w·(b - a) in place, split at w = 0.5 the way torch's lerp is; t: a scratch like a (else a temporary)."""
    xp = array_module(a)
    t = xp.subtract(b, a, out=t)
    if w < 0.5:
        t *= w
        a += t
    else:
        t *= 1 - w
        xp.subtract(b, t, out=a)


class Adam(Optimizer):
    """Adam as torch.optim.Adam (L2 weight decay added to the gradient, bias-corrected moments, eps outside the sqrt).

    Example::

        opt = Adam(model.parameters(), lr=1e-3)
        opt.step(model.grads)
    """
    hyper_names = ("betas", "eps", "weight_decay")

    def __init__(self, params: dict, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr)
        if not all(0 <= b < 1 for b in betas) or len(betas) != 2:
            raise RnnGraphError(f"betas must be two numbers in [0, 1), got {betas}")
        if eps < 0 or weight_decay < 0:
            raise RnnGraphError(f"eps and weight_decay must be >= 0, got {eps}, {weight_decay}")
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        self._scratch: dict = {}

    def step(self, grads: dict) -> None:
        """Updates the parameters in place from grads (name -> array); the gradient arrays are not modified."""
        b1, b2 = self.betas
        for name, p, g in self._pairs(grads):
            xp = array_module(p)
            st = self.state.get(name)
            if st is None:
                st = self.state[name] = {"step": 0, "exp_avg": xp.zeros_like(p), "exp_avg_sq": xp.zeros_like(p)}
            st["step"] += 1
            if self.weight_decay != 0:
                g = g + self.weight_decay * p
            m, v = st["exp_avg"], st["exp_avg_sq"]
            t = self._scratch.get(name)
            if t is None:                                   # one buffer for every intermediate: no temporaries
                t = self._scratch[name] = xp.empty_like(p)  # (not state: checkpoints never hold it)
            _lerp_(m, g, 1 - b1, t)
            v *= b2
            xp.multiply(g, g, out=t)
            t *= 1 - b2
            v += t
            step_size = self.lr / (1 - b1 ** st["step"])
            xp.sqrt(v, out=t)                               # denom = sqrt(v) / sqrt(1 - b2^step) + eps
            t /= (1 - b2 ** st["step"]) ** 0.5
            t += self.eps
            xp.divide(m, t, out=t)
            t *= step_size
            p -= t


def clip_grad_norm(grads: dict, max_norm: float, error_if_nonfinite: bool = False):
    """Scales all gradients in place so that their global L2 norm is at most max_norm; returns the norm before.

    torch.nn.utils.clip_grad_norm_'s formula: coef = min(max_norm / (total + 1e-6), 1), every gradient *= coef.
    The norm comes back as a 0-d array (no host round-trip on the GPU).

    Example::

        total = clip_grad_norm(model.grads, max_norm=1.0)
    """
    gs = [g for g in grads.values() if g is not None]
    if not gs:
        return numpy.asarray(0.0)
    xp = array_module(gs[0])
    total = xp.asarray(xp.linalg.norm(xp.stack([xp.linalg.norm(g.ravel()) for g in gs])))   # []
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RnnGraphError(f"the total gradient norm is {float(total)}; the gradients hold NaN or inf")
    coef = xp.minimum(max_norm / (total + 1e-6), 1.0)
    for g in gs:
        g *= coef
    return total


class StepLR:
    """lr · gamma^(step // step_size), as torch.optim.lr_scheduler.StepLR. Call it with the step number:

    Example::

        sched = StepLR(0.1, step_size=100, gamma=0.5)
        opt.lr = sched(step)
    """

    def __init__(self, lr: float, step_size: int, gamma: float = 0.1):
        if step_size <= 0:
            raise RnnGraphError(f"step_size must be > 0, got {step_size}")
        self.lr, self.step_size, self.gamma = lr, step_size, gamma

    def __call__(self, step: int) -> float:
        return self.lr * self.gamma ** (step // self.step_size)


class CosineLR:
    """Linear warmup to lr over warmup_steps (lr·(step+1)/warmup_steps), then cosine decay to min_lr at total_steps,
    flat after that. With warmup_steps=0 it is torch's CosineAnnealingLR(T_max=total_steps, eta_min=min_lr).

    Example::

        sched = CosineLR(1e-3, total_steps=10_000, warmup_steps=500)
        opt.lr = sched(step)
    """

    def __init__(self, lr: float, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0):
        if not 0 <= warmup_steps < total_steps:
            raise RnnGraphError(f"need 0 <= warmup_steps < total_steps, got {warmup_steps}, {total_steps}")
        self.lr, self.total_steps, self.warmup_steps, self.min_lr = lr, total_steps, warmup_steps, min_lr

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = min((step - self.warmup_steps) / (self.total_steps - self.warmup_steps), 1.0)
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
