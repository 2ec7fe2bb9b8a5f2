"""The cupy backend's room: every CUDA source generator (source, fused, rows, matmul, pair, param_grad, gather, and
one module per loop strategy that has a kernel: scan, elementwise, persistent/), the cuBLAS wrapper, the
recordings of CUDA graphs, and the backend that runs them (backend.py). Generators are pure strings: they
run without a GPU."""
