"""Running a plan, backend-neutral: preallocated buffers (workspace), chunks of time (chunks), the interpreter
(executor); the backends (backends/: the registry, numpy, and the cuda/ room with every CUDA source
generator and its runners) own their kernels."""
