"""Running a plan: preallocated buffers (workspace), the interpreter (executor), the backends (numpy, cupy,
cuBLAS) and CUDA source generation for fused groups (kernels)."""
