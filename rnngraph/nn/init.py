"""Weight initialisers: PyTorch's default uniform(±1/√H) and orthogonal, drawn from a seeded numpy Generator.

They return host numpy arrays; a layer moves them to its backend. Drawing on the host keeps the same seed
bit-identical whatever the backend.
"""
from __future__ import annotations

import math

import numpy

from ..arrays import float_dtype
from ..errors import RnnGraphError


def init_uniform(rng: numpy.random.Generator, shape, H: int, dtype="float64") -> numpy.ndarray:
    """uniform(-1/√H, 1/√H) of `shape`: PyTorch's default for RNN weights (H = hidden_size) and for
    nn.Linear weight and bias (H = in_features; torch's kaiming_uniform(a=√5) reduces to this bound).

    >>> w = init_uniform(numpy.random.default_rng(0), (8, 4), H=4)   # w: [8, 4], |w| <= 0.5
    """
    if H <= 0:
        raise RnnGraphError(f"init_uniform needs H > 0, got {H}")
    bound = 1.0 / math.sqrt(H)
    return rng.uniform(-bound, bound, size=tuple(shape)).astype(float_dtype(dtype, half=True), copy=False)


def init_orthogonal(rng: numpy.random.Generator, shape, gain: float = 1.0, dtype="float64") -> numpy.ndarray:
    """A (semi-)orthogonal matrix of `shape` [rows, *rest], torch.nn.init.orthogonal_'s algorithm:
    QR of a Gaussian [rows, prod(rest)] matrix with the signs of R's diagonal folded into Q.
    rows >= cols gives orthonormal columns (WᵀW = I), rows < cols orthonormal rows (WWᵀ = I).

    >>> w = init_orthogonal(numpy.random.default_rng(0), (6, 6))   # w: [6, 6], wᵀw = I
    """
    shape = tuple(shape)
    if len(shape) < 2:
        raise RnnGraphError(f"init_orthogonal needs at least 2 dimensions, got shape {shape}")
    rows, cols = shape[0], math.prod(shape[1:])
    flat = rng.standard_normal((rows, cols))               # [rows, cols]
    if rows < cols:
        flat = flat.T
    q, r = numpy.linalg.qr(flat)
    q *= numpy.sign(numpy.diag(r))
    if rows < cols:
        q = q.T
    return (gain * q).reshape(shape).astype(float_dtype(dtype, half=True), copy=False)
