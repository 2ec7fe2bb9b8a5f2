"""Loop strategy 'persistent' on the GPU, one cooperative kernel a direction (per head, one ordinary kernel
with no grid barrier): phases.py splits the loop over blocks, kernels.py generates the source (heads.py its
head-wise GEMMs), runner.py decides whether it runs here and launches it."""
from .runner import compile, why_not

__all__ = ["compile", "why_not"]
