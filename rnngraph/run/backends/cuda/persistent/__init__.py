"""Loop strategy 'persistent' on the GPU, one cooperative kernel a direction: phases.py splits the loop over
blocks, kernels.py generates the source (mma.py its GEMMs on tensor cores, heads.py its head-wise GEMVs),
runner.py decides whether it runs here and launches it."""
from .elements import unstored
from .runner import auto_problem, batch_rows, compile, loop_sums, why_not

__all__ = ["auto_problem", "batch_rows", "compile", "loop_sums", "unstored", "why_not"]
