"""What every generated CPU source shares: the op table's C expressions (ir/ops.py KERNEL) translated into
Python for numba by one small table, the element types of each storage dtype, and array windows.

Pure strings and numpy: the generators run without numba; only compiling them needs it (jit.py).
"""
from __future__ import annotations

import math

import re

import numpy as np

from ....arrays import dtype_name, is_half

# C function of a KERNEL expression -> the Python numba compiles, for float32 and for float64 math. The float32
# ones are the prelude's vectorisable forms; float64 keeps libm's, so float64 results match numpy's to rounding.
FUNCTIONS = {"exp": ("exp32", "math.exp"), "tanh": ("tanh32", "math.tanh"), "log1p": ("log1p32", "math.log1p"),
             "fabs": ("abs", "abs"), "rsqrt": ("rsqrt32", "rsqrt64")}

# storage dtype -> (math type, load of a stored element e, store of a math value v); half storage is uint16 bits
STORAGE = {"float32": ("np.float32", "{e}", "{v}"), "float64": ("np.float64", "{e}", "{v}"),
           "bfloat16": ("np.float32", "bf16_load({e})", "bf16_store({v})")}

_TERNARY = re.compile(r"\(([^()?]+?) \? ([^():]+?) : ([^()]+?)\)")                  # (c ? a : b)
_CALL = re.compile(r"\b(" + "|".join(FUNCTIONS) + r")\(")
_NUMBER = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:e[+-]?\d+)?)(?![\w.])")


def python_expr(c: str, storage: str) -> str:
    """A C expression of the op table (operands already named) as Python for numba: ternaries, the math
    functions of FUNCTIONS, and every number a constant of the math type (else float32 would widen)."""
    math_type = STORAGE[storage][0]
    col = 0 if math_type == "np.float32" else 1
    out = _TERNARY.sub(r"(\2 if \1 else \3)", c)
    out = _CALL.sub(lambda m: FUNCTIONS[m.group(1)][col] + "(", out)
    return _NUMBER.sub(lambda m: f"{math_type}({m.group(1)})", out)


def python_statement(line: str, storage: str) -> str:
    """A C statement of a generated kernel body ('T v0 = …;', 'd1 += …;') as Python."""
    line = line.rstrip(";")
    if line.startswith("T "):
        line = line[2:]
    name, op, expr = line.split(" ", 2)
    return f"{name} {op} {python_expr(expr, storage)}"


def storage_of(a) -> str | None:
    """The STORAGE key of an array's dtype, or None where the compiled loops do not run it (float16)."""
    name = dtype_name(a.dtype)
    return name if name in STORAGE else None


def window(a) -> tuple | None:
    """(w, ld): a as a 1-D window from its first element, row r's feature f at w[r·ld + f]; a is a vector [F]
    (ld = 0) or rows [R, F] / [N, B, F] with unit feature stride and frame-major rows. Half storage comes as
    its uint16 bits. None where a is laid out otherwise."""
    if is_half(a):
        a = a.view(np.uint16)
    it, F = a.itemsize, a.shape[-1]
    if a.ndim == 1:
        return (a, 0) if a.strides[0] == it or F <= 1 else None
    if a.flags.c_contiguous:            # rows back to back (a hoisted GEMM's operands): itself, flat
        return a.reshape(-1), F
    lead = [(n, s // it, math.prod(a.shape[k + 1:-1])) for k, (n, s) in enumerate(zip(a.shape[:-1], a.strides))]
    lds = {s // inner for n, s, inner in lead if n > 1}        # each leading axis: its stride over the rows inside it
    ld = lds.pop() if len(lds) == 1 else F if not lds else None
    if ld is None or ld < F or (F > 1 and a.strides[-1] != it) or \
            any(n > 1 and s != ld * inner for n, s, inner in lead):
        return None
    rows = math.prod(a.shape[:-1])
    return np.lib.stride_tricks.as_strided(a, (max((rows - 1) * ld + F, 0),), (it,)), ld
