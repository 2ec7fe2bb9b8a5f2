"""One compiled function per fused elementwise group, forward and backward, from the CUDA kernel's spec
(run/backends/cuda/fused.py: the same arguments, names and body, built from the op table's kernel rules),
its C statements translated into Python (source.py); and the arrays it runs on, in its order.

The function walks R rows of F features once. Each argument name nm of the spec arrives as a window, its
first element and its row stride (p_nm, s_nm, l_nm): row r's feature f is p_nm[s_nm + r·l_nm + f], and a
vector parameter [F] has l_nm = 0. Its source is named by its text, so the same group gives the same name.
"""
from __future__ import annotations

import hashlib
import re

from ....ir.ops import REDUCE
from ..cuda.fused import fusable, fused_backward_kernel, fused_forward_kernel, stored_only
from .source import STORAGE, python_statement

FUSED_SOURCE = '''
@njit(pipeline_class=NoAlias, **JIT)
def {name}(R, {args}):
    for r in range(R):
{rows}
        for f in range({F}):
{body}
'''


# a function's rows in `parts` ranges on numba's threads (its windows' starts moved to each range's first row)
SPLIT_SOURCE = '''
@njit(parallel=True, **JIT)
def {name}_split(parts, R, {args}):
    for p in prange(parts):
        r0 = R * p // parts
        {name}(R * (p + 1) // parts - r0, {moved})
'''


def group_spec(cell, nodes, direction: str, aliases=None):
    """The CUDA spec of a group's function, or None where it has no elementwise kernel (a row reduction,
    an op without a kernel rule). It stores only what the rest of the step reads (cuda.fused.stored_only): passes
    over memory bound them here. aliases: the workspace's gradient classes (plan/aliases.py), each stored once."""
    if any(cell.op(n).kind in REDUCE for n in nodes) or not fusable(cell, nodes):
        return None
    spec = fused_forward_kernel(cell, nodes) if direction == "fwd" else \
        fused_backward_kernel(cell, nodes, set(cell.params), aliases=aliases)
    return stored_only(cell, nodes, direction, spec, aliases)


def fused_source(spec, F: int, storage: str, split: bool = False) -> tuple[str, str, tuple]:
    """(function name, Python source, the spec's (kind, key) of each array argument, in order) of a spec over
    F features in a storage dtype (source.STORAGE); inputs its body never reads are left out. split: the source
    also has NAME_split(parts, R, ...), the function over its rows in parts ranges on numba's threads."""
    _, load, store = STORAGE[storage]
    body = [python_statement(ln, storage) for ln in spec.body]
    read = set(re.findall(r"\b[a-z]+\d+\b", " ".join(body + [v for _, v, _ in spec.stores])))
    keep = [k for k, nm in enumerate(spec.in_names) if nm in read] + \
        [len(spec.in_names) + k for k in range(len(spec.out_names))]
    names = [(spec.in_names + spec.out_names)[k] for k in keep]
    at = lambda nm: f"p_{nm}[np.uint64(o_{nm} + f)]"       # unsigned: no negative-index wrap to test
    loaded = [nm for nm in names if nm in spec.in_names or nm in spec.arrivals()]
    body = [f"{nm} = {load.format(e=at(nm))}" for nm in loaded] + body
    for nm, v, op in spec.stores:
        total = v if op == "=" else f"{load.format(e=at(nm))} + {v}"
        body.append(f"{at(nm)} = {store.format(v=total)}")
    text = FUSED_SOURCE.format(name="{name}", args=", ".join(f"p_{nm}, s_{nm}, l_{nm}" for nm in names), F=F,
                               rows="\n".join(f"        o_{nm} = s_{nm} + r * l_{nm}" for nm in names),
                               body="\n".join(" " * 12 + ln for ln in body))
    name = f"fused_{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    if split:
        text += SPLIT_SOURCE.format(name="{name}", args=", ".join(f"p_{nm}, s_{nm}, l_{nm}" for nm in names),
                                    moved=", ".join(f"p_{nm}, s_{nm} + r0 * l_{nm}, l_{nm}" for nm in names))
    keys = spec.inputs + spec.outputs
    return name, text.replace("{name}", name), tuple(keys[k] for k in keep)


def spec_arrays(keys, env, genv=None, targets=None) -> list:
    """The arrays behind a function's argument keys (fused_source), in order (a slice's read as its column view)."""
    pick = {"ext": lambda k: _cols(env[k[:2]], k[2]), "val": env.__getitem__, "out": env.__getitem__,
            "grad": lambda k: genv[k], "gext": lambda k: _cols(targets[k[:2]], k[2])}
    return [pick[kind](key) for kind, key in keys]


def _cols(a, cols):
    return a if cols is None else a[..., cols[0]:cols[1]]


def overlaps(spec, per_frame: bool) -> bool:
    """Whether an array the function writes may share elements with another of its arrays, which its noalias
    arguments rule out: the same node's columns met twice (two slices of one read), or, over all frames at
    once, one node read or written at two delays (their frames interleave)."""
    def where(kind, key):
        if kind in ("ext", "gext"):
            return ("grad" if kind == "gext" else "val", key[0], key[1] if per_frame else 0, key[2])
        return ("val" if kind in ("val", "out") else "grad", key, 0, None)
    places = [where(kind, key) for kind, key in spec.inputs + spec.outputs]
    written = places[len(spec.inputs):]
    return any(a[:3] == b[:3] and _meet(a[3], b[3]) for i, a in enumerate(written) for j, b in enumerate(places)
               if j != len(spec.inputs) + i)


def _meet(a, b) -> bool:
    return a is None or b is None or (a[0] < b[1] and b[0] < a[1])
