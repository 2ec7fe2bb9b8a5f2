"""Weight initialisers: PyTorch's default uniform(±1/√H) and orthogonal, drawn from a seeded numpy Generator,
and the recurrent layer's in-place initialisers built on them (init_uniform_, init_orthogonal_).

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


# -- a recurrent layer's parameters, in place --------------------------------------------------
def init_uniform_(layer):
    """PyTorch's default: every parameter ~ U(-1/√H, 1/√H), H = hidden_size, drawn from layer.rng
    in state-dict order."""
    for p in layer._params.values():
        p[...] = layer.backend.asarray(init_uniform(layer.rng, p.shape, layer.hidden_size, layer.dtype))
    init_constants_(layer)


def init_orthogonal_(layer, gain: float = 1.0):
    """Each matrix block (one gate's W_ih or W_hh, each head of a head-wise one) a (semi-)orthogonal matrix
    times `gain`; every vector parameter (biases, peepholes, diagonal weights) zero. Draws from layer.rng."""
    blocks = [b for per_l in layer._views for per_d in per_l for b in per_d.values()]  # row views
    blocks = [h for b in blocks for h in (b if b.ndim == 3 else [b])]       # head-wise [k, o, i]: its k heads
    for block in blocks:
        if block.ndim == 1:
            block[...] = 0
        else:
            block[...] = layer.backend.asarray(init_orthogonal(layer.rng, block.shape, gain, layer.dtype))
    init_constants_(layer)


def init_constants_(layer):
    """The parameters a cell starts at a constant (CellGraph.inits: a norm's gain 1 and bias 0), after the
    built-in initialisers have drawn everything (so the draws of the others do not change)."""
    for cell, per_l in zip(layer.cells, layer._views):
        for per_d in per_l:
            for p, value in cell.inits.items():
                per_d[p][...] = value
