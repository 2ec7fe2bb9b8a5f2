"""A per-frame d-operand product in parts (split-K without its reduce kernel): dh [B, K] += g [B, M] · W [M, K]
over a long M (an LSTM's 4H) as S products of M/S rows each, written as float32 parts [S, B, K] by one
strided-batched cuBLAS GEMM, and added in order by whoever reads dh next: the next frame's fused backward kernel
(fused.KernelSpec.parts), or, where none can, ADD_PARTS. One frame's products then cost one GEMM and no
reduce kernel. cuBLAS's own choice for these shapes is a split-K GEMM plus a reduce kernel; measured on the
H200 (bfloat16, µs a product, one CUDA graph of 200, cuBLAS's GemmEx against the parts alone):

    H = 1024 (M = 4096), B = 16 / 64 / 128 / 256:  6.4 / 6.7 / 7.3 / 9.1  against  3.5 / 4.0 / 4.6 / 5.9
    H = 512 (M = 2048),  B = 16 / 64 / 128 / 256:  4.9 / 5.1 / 5.0 / 5.4  against  2.8 / 3.0 / 3.4 / 3.7

A separate kernel adding the parts costs about 1.6 µs more, so the parts pay where the reader adds them."""
from __future__ import annotations

from dataclasses import replace

from .fused import KernelSpec
from .source import CTYPES, math_type

HALF = ("bfloat16", "float16")     # measured in half storage only: float32 keeps cuBLAS's own product
MIN_M = 2048                       # the reduction's rows from which parts were measured to pay (LSTM H = 512)
SLICE = ((64, 256), (128, 512))    # (B at most, rows a part at least), else LONG_SLICE: bigger B, longer parts
LONG_SLICE = 1024
MAX_PARTS = 8

ADD_PARTS = r"""
extern "C" __global__ void rg_add_parts_{TY}({TY}* out, long long ld, const float* __restrict__ parts, int S,
        long long rows, int F) {{
    // out [rows, F] (row stride ld) += parts [S, rows, F], added in order s = 0, 1, ...
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * F) return;
    long long r = e / F;
    int f = (int)(e - r * F);
    {MT} v = out[r * ld + f];
    for (int s = 0; s < S; ++s) v += parts[(s * rows + r) * F + f];
    out[r * ld + f] = v;
}}
"""


def parts_for(B: int, M: int, dtype) -> int:
    """How many parts a d-operand product of B rows over a reduction of M rows runs in (0: one GEMM as cuBLAS
    chooses): at most MAX_PARTS, each a whole number of rows, a multiple of 8 (16-byte aligned half rows), no
    shorter than the measured slice for B."""
    if str(dtype) not in HALF or M < MIN_M:
        return 0
    least = next((rows for most, rows in SLICE if B <= most), LONG_SLICE)
    for S in range(min(MAX_PARTS, M // least), 1, -1):
        if M % S == 0 and (M // S) % 8 == 0:
            return S
    return 0


def parts_with(spec, node: str, B: int, M: int, dtype) -> int:
    """The parts (parts_for) a product of B rows over M runs in where `spec`, its reader's fused backward kernel,
    can add them to node's gradient (with_parts), else 0."""
    S = parts_for(B, M, dtype)
    return S if S and spec and with_parts(spec, {node: S}) is not None else 0


class Parts:
    """The launchable 'kernel' of a product in parts: parts [S, B, K] = the S products (cublas.Cublas.parts)."""

    def __init__(self, blas, g, w, parts):
        self.blas, self.g, self.w, self.parts = blas, g, w, parts

    def __call__(self, grid, block, args):
        self.blas.parts(self.g, self.w, self.parts)


def product_parts(be, g, w, spec, node, parts=None):
    """(launchable, parts [S, B, K] float32) of a per-frame d-operand product g [B, M] · w [M, K] in parts, where
    parts_for gives some for its shape and `spec`, its reader's fused backward kernel, can add them to node's
    gradient; else None (the product runs as cuBLAS chooses). parts: an earlier frame's buffer, written again."""
    S = parts_with(spec, node, *g.shape, g.dtype) if be.blas and g.ndim == 2 and be.blas.usable(g, w) else 0
    if not S:
        return None
    shape = (S, g.shape[0], w.shape[1])
    parts = parts if parts is not None and parts.shape == shape else be.xp.empty(shape, be.xp.float32)
    return ((Parts(be.blas, g, w, parts), None, None, None),), parts


def add_parts_launch(be, out, parts) -> tuple:
    """(kernel, grid, block, args): out [B, K] += parts [S, B, K] in order."""
    ctype = CTYPES[str(out.dtype)]
    kernel = be.raw(f"rg_add_parts_{ctype}", ADD_PARTS.format(TY=ctype, MT=math_type(ctype)))
    (S, rows, F), cp = parts.shape, be.xp
    return kernel, ((rows * F + 255) // 256,), (256,), (out, cp.int64(out.strides[0] // out.itemsize), parts,
                                                        cp.int32(S), cp.int64(rows), cp.int32(F))


def with_parts(spec, parts: dict):
    """A fused backward kernel's spec that also adds parts (node -> S, arrays [S, B, F] in that order after its
    other arguments) to the gradients it reads of those nodes, or None where it cannot: a row kernel, or a gradient
    it does not read."""
    if type(spec) is not KernelSpec:
        return None
    read = set(spec.read_inputs()) | set(spec.arrivals())
    names = {key: nm for (kind, key), nm in zip(spec.inputs + spec.outputs, spec.in_names + spec.out_names)
             if kind == "grad" and nm in read}
    if not set(parts) <= set(names):
        return None
    return replace(spec, parts=tuple((names[n], S) for n, S in parts.items()))
