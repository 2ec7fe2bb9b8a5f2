"""The compiled CPU backend's room: numba functions generated from the op table's kernel rules (source, fused,
stages and its strategy runners), numpy's BLAS (blas), the numba prelude and the module cache (prelude, jit)."""
