"""Loop strategy 'elementwise' on the CPU: its fused groups frame by frame in one compiled function, as 'stages'
runs them (stages.py): on a CPU a frame's B × F pass is already the per-feature walk the GPU kernel does."""
from .stages import compile

__all__ = ["compile"]
