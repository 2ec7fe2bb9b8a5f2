"""Helpers shared by the recurrent layers, Dense, the losses and the optimizers: the array module of an array,
float dtypes, host copies, seeded generators, float-array checks and the state-dict check."""
from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping

import numpy

from .errors import RnnGraphError

FLOAT_DTYPES = ("float32", "float64")
HALF_DTYPES = ("bfloat16", "float16")       # stored in half precision, computed in float32 (recurrent layers)


def array_module(a):
    """numpy or cupy, whichever owns `a`. Never imports cupy: if cupy is not loaded, `a` cannot be a cupy array.

    >>> array_module(numpy.zeros(3)) is numpy
    True
    """
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return cupy.get_array_module(a)
    return numpy


def float_dtype(dtype, half: bool = False) -> numpy.dtype:
    """'float32' / 'float64' (or the numpy dtypes) as a numpy dtype, and with half=True also 'bfloat16'
    (ml_dtypes' numpy type) and 'float16'; anything else is an error."""
    allowed = FLOAT_DTYPES + (HALF_DTYPES if half else ())
    if str(dtype) == "bfloat16" or getattr(dtype, "__name__", None) == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise RnnGraphError("dtype bfloat16 needs the ml_dtypes package (numpy has no bfloat16): "
                                "pip install ml_dtypes") from None
        dtype = ml_dtypes.bfloat16
    try:
        dt = numpy.dtype(dtype)
    except TypeError as e:
        raise RnnGraphError(f"dtype must be one of {allowed}, got {dtype!r}") from e
    if dt.name not in allowed:
        raise RnnGraphError(f"dtype must be one of {allowed}, got {dt.name!r}"
                            + ("; half precision runs in the recurrent layers only" if dt.name in HALF_DTYPES else ""))
    return dt


@functools.lru_cache(maxsize=None)
def dtype_name(dtype) -> str:
    """dtype.name ('float32', 'bfloat16', ...), worked out once a dtype: numpy's takes microseconds a call, and
    calls ask it on every product and conversion."""
    return dtype.name


def is_half(a) -> bool:
    """Whether array `a` is stored in half precision (and so computed in float32)."""
    return a.dtype.itemsize == 2 and a.dtype.kind in "fV"


def to_numpy(a) -> numpy.ndarray:
    """A host numpy copy of `a`: a numpy, cupy or torch (CPU or GPU) array, a scalar or nested lists.

    >>> to_numpy([1.0, 2.0])
    array([1., 2.])
    """
    if hasattr(a, "detach"):                                # torch.Tensor
        a = a.detach().cpu().numpy()
    elif array_module(a) is not numpy:                      # cupy.ndarray
        return a.get()
    return numpy.array(a, copy=True)


def element_offsets(view, base) -> numpy.ndarray:
    """[view.size] int64: where each element of `view` (C order) lies in `base`, the flat contiguous array
    it is a view of (numpy or cupy: both speak an array interface with a data address).

    >>> base = numpy.arange(12.0)
    >>> element_offsets(base.reshape(3, 4)[1:, ::2], base).tolist()
    [4, 6, 8, 10]
    """
    item = base.itemsize
    start = (address(view) - address(base)) // item
    idx = numpy.full(view.shape, start, numpy.int64)
    for axis, (n, stride) in enumerate(zip(view.shape, view.strides)):
        idx += (numpy.arange(n, dtype=numpy.int64) * (stride // item)).reshape((n,) + (1,) * (view.ndim - axis - 1))
    idx = idx.ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= base.size):
        raise RnnGraphError(f"an array of shape {view.shape} is not a view of the buffer it was taken for")
    return idx


def address(a) -> int:
    """The device or host address of an array's first element (numpy and cupy alike)."""
    if isinstance(a, numpy.ndarray):
        return a.__array_interface__["data"][0]
    ptr = getattr(getattr(a, "data", None), "ptr", None)       # cupy: the view's own memory pointer
    return ptr if ptr is not None else a.__cuda_array_interface__["data"][0]


def make_rng(seed=0, rng=None) -> numpy.random.Generator:
    """The numpy Generator a layer owns: `rng` as given, or a new one from `seed` (0 by default, so an
    unseeded layer is still reproducible; None draws fresh entropy). Passing an rng and a seed other than
    the default is an error."""
    if rng is None:
        return numpy.random.default_rng(seed)
    if seed is not None and seed != 0:
        raise RnnGraphError("pass either seed or rng, not both")
    if not isinstance(rng, numpy.random.Generator):
        raise RnnGraphError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


# splitmix64 (Steele, Lea & Flood 2014): a counter-based hash whose outputs pass BigCrush
_GOLDEN, _MIX1, _MIX2 = (numpy.uint64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def dropout_mask(rng: numpy.random.Generator, shape: tuple, p: float, xp, dtype, window=None):
    """An inverted-dropout mask of `shape` in module `xp` (numpy or cupy) and `dtype`: 0 with probability p,
    1/(1-p) otherwise. The host draws one 64-bit key from `rng`; the mask is then computed where the
    activations live, as splitmix64 of key + element index, so a GPU run moves no mask over the bus and
    numpy and cupy give the same mask from the same generator state.

    window (offset, total): shape[1] is the part offset .. offset + shape[1] of a batch of `total` (one
    rank's streams in data parallel training); the mask is that part of the whole batch's mask, so that
    the ranks together draw what one process would.

    >>> m = dropout_mask(numpy.random.default_rng(0), (2, 3), 0.5, numpy, numpy.float32)   # m: [2, 3]
    >>> sorted(set(m.ravel().tolist())) in ([0.0, 2.0], [0.0], [2.0])
    True
    """
    if window is not None:
        offset, total = window
        whole = dropout_mask(rng, (shape[0], total, *shape[2:]), p, xp, dtype)     # [T, total, ...]
        return xp.ascontiguousarray(whole[:, offset:offset + shape[1]])
    n = math.prod(shape)
    key = numpy.uint64(rng.integers(0, 2**63, dtype=numpy.int64))
    z = (xp.arange((n + 1) // 2, dtype=xp.uint64) + key + numpy.uint64(1)) * _GOLDEN    # [ceil(n/2)] counters
    z ^= z >> numpy.uint64(30)
    z *= _MIX1
    z ^= z >> numpy.uint64(27)
    z *= _MIX2
    z ^= z >> numpy.uint64(31)
    bits = z.view(xp.uint32)[:n]                          # [n]: both 32-bit halves of every hash
    keep = bits >= numpy.uint32(min(int(p * 2.0**32), 2**32 - 1))
    mask = keep.astype(dtype).reshape(shape)
    mask *= 1.0 / (1.0 - p)
    return mask


def check_float(x, who: str, xp=None, dtype=None) -> None:
    """Raises unless `x` is a float array, of module `xp` and of `dtype` where those are given."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise RnnGraphError(f"{who}: expected an array, got {type(x).__name__}")
    if xp is not None and array_module(x) is not xp:
        raise RnnGraphError(f"{who}: expected a {xp.__name__} array (where the parameters or the other "
                            f"inputs live), got a {array_module(x).__name__} array; move it with {xp.__name__}.asarray")
    if dtype is not None and x.dtype != dtype:
        raise RnnGraphError(f"{who}: dtype mismatch, expected {dtype}, got {x.dtype}; "
                            + dtype_fix("", x.dtype, dtype))
    if dtype is None and x.dtype.kind != "f":
        raise RnnGraphError(f"{who}: expected a float array, got dtype {x.dtype}")


def dtype_fix(name: str, got, want) -> str:
    """How to fix array `name` of dtype `got` for a layer of dtype `want`: cast the array, or, for the other
    float dtype, build the layer with it (never suggests a dtype the layers reject, such as int64)."""
    if numpy.dtype(got).name in FLOAT_DTYPES:
        return f"convert with {name}.astype('{want}') or build the layer with dtype='{got}'"
    return f"convert with {name}.astype('{want}') (layers take only {' or '.join(FLOAT_DTYPES)} arrays)"


def saved_cache(owner, cache):
    """The explicit `cache` if given, else the one `owner`'s last call kept; an error before any call."""
    cache = owner._cache if cache is None else cache
    if cache is None:
        raise RnnGraphError(f"{type(owner).__name__}.backward needs a forward call (or an explicit cache) first")
    return cache


def check_state_dict(owner: str, expected: dict, got: dict, strict: bool = True) -> None:
    """One RnnGraphError listing, by name, every missing key, unexpected key and wrong shape.

    expected: name -> shape; got: name -> array (numpy, cupy or torch). With strict=False missing and
    unexpected keys are allowed (skipped by the loader); wrong shapes and values that are not arrays raise.
    """
    if not isinstance(got, Mapping):
        raise RnnGraphError(f"cannot load state dict into {owner}: expected a dict of name -> array (as "
                            f"state_dict() returns), got {type(got).__name__}")
    not_arrays = [f"{type(v).__name__} for {k}" for k, v in got.items() if not hasattr(v, "shape")]
    if not_arrays:
        raise RnnGraphError(f"cannot load state dict into {owner}: values must be arrays (numpy, cupy or torch), "
                            f"got {', '.join(not_arrays)}")
    missing = [k for k in expected if k not in got]
    unexpected = [k for k in got if k not in expected]
    wrong = [f"{k}: expected {list(s)}, got {list(got[k].shape)}"
             for k, s in expected.items() if k in got and tuple(got[k].shape) != tuple(s)]
    problems = []
    if strict and missing:
        problems.append("missing keys: " + ", ".join(missing))
    if strict and unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected))
    if wrong:
        problems.append("wrong shapes: " + "; ".join(wrong))
    if problems:
        raise RnnGraphError(f"cannot load state dict into {owner}:\n  " + "\n  ".join(problems))


def float32_copies(xp, a):
    """float32 copies of an array, or of a dict's or a list's arrays (None stays None)."""
    if isinstance(a, dict):
        return {k: float32_copies(xp, v) for k, v in a.items()}
    if isinstance(a, (list, tuple)):
        return [float32_copies(xp, v) for v in a]
    return None if a is None else a.astype(xp.float32)


def in_float32(xp, fn, args: list, written: tuple):
    """fn(xp, *args) on float32 copies of args, then the copies of the args at positions `written`
    stored back (rounded once)."""
    ups = float32_copies(xp, args)
    fn(xp, *ups)
    for k in written:
        args[k][...] = ups[k]
