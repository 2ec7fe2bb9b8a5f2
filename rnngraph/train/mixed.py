"""Mixed precision for a half-precision model (--dtype bfloat16 | float16): the recurrent layers compute
in half precision (rnngraph.nn's reference arithmetic), the head and the loss in float32, and the optimiser
updates float32 master copies of every half parameter, rounded into the model after each step. float16's
narrow range needs dynamic loss scaling (the loss gradient times S; a step whose gradients overflow is
skipped and S halved; S doubles after `interval` good steps: torch.cuda.amp.GradScaler's rule and
defaults); bfloat16 has float32's range and needs none."""
from __future__ import annotations

import numpy as np

from ..arrays import is_half
from ..nn.layers import Module


class ToFloat32(Module):
    """Feed-forward module between the half-precision recurrent layers and the float32 head."""

    def forward(self, x):               # x: [..., F] half -> float32, cache: x's dtype
        return x.astype(np.float32), x.dtype

    def backward(self, grad_y, cache=None):
        return grad_y.astype(cache or self._cache)


class Precision:
    """What a run in half precision adds around a step: master weights and (float16) loss scaling.

    params: the model's parameters (name -> array, updated in place). `masters` is what the optimiser
    updates: float32 copies of the half ones, the float32 ones themselves."""

    def __init__(self, params: dict, dtype: str, scale: float = 2.0 ** 16, interval: int = 2000):
        self.model = params
        self.masters = {k: p.astype(np.float32) if is_half(p) else p for k, p in params.items()}
        self.scaling = dtype == "float16"
        self.scale, self.interval, self.good, self.skipped = (scale if self.scaling else 1.0), interval, 0, 0

    def backward(self, model, grad_loss) -> dict:
        """The model's backward from the loss's gradient (times the loss scale), as float32 gradients of the
        masters (unscaled; with float16 possibly not finite: `check` them, after any all-reduce)."""
        grads = model.backward(grad_loss * self.scale if self.scaling else grad_loss)
        return {k: g.astype(np.float32) / self.scale if self.scaling else g.astype(np.float32)
                for k, g in grads.items()}

    def check(self, grads: dict, step: int, echo) -> dict | None:
        """grads, or None when float16 overflowed: the step is then skipped (said through echo) and the
        scale halved. Ranks decide on their all-reduced gradients, so they all skip the same steps."""
        if self.scaling and not all(bool(np.isfinite(g).all()) for g in grads.values()):
            self.scale, self.good, self.skipped = self.scale / 2, 0, self.skipped + 1
            echo(f"step {step}: the float16 gradients overflowed; no update, the loss scale is now "
                 f"{self.scale:g} ({self.skipped} steps skipped so far)")
            return None
        return grads

    def stepped(self) -> None:
        """After the optimiser's step: the masters rounded into the half parameters; the scale grows."""
        for k, p in self.model.items():
            if p is not self.masters[k]:
                p[...] = self.masters[k]
        if self.scaling:
            self.good += 1
            if self.good == self.interval:
                self.scale, self.good = self.scale * 2, 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good": self.good, "skipped": self.skipped}

    def load_state_dict(self, d: dict, masters: dict) -> None:
        """The scaler's state, and the masters from a checkpoint's (float32) model arrays."""
        self.scale, self.good, self.skipped = d["scale"], d["good"], d["skipped"]
        for k, m in self.masters.items():
            m[...] = masters[k]
