"""rnngraph.optim: the optimisers and schedulers of rnngraph.nn.optim (SGD, Adam, AdamW-style weight decay,
clip_grad_norm, StepLR, CosineLR), under the name PyTorch users look for."""
from .nn.optim import SGD, Adam, CosineLR, Optimizer, StepLR, clip_grad_norm

__all__ = ["SGD", "Adam", "CosineLR", "Optimizer", "StepLR", "clip_grad_norm"]
