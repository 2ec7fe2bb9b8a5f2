"""Loop strategy 'persistent' on the CPU: its stages in one compiled function a direction, as 'stages' runs
them (stages.py); a CPU has no on-chip memory to hold the weights in beyond what BLAS blocks for."""
from .stages import compile

__all__ = ["compile"]
