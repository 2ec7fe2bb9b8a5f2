"""Argument checks of the recurrent layers, each raising RnnGraphError that says expected versus got
and, where the mistake is a common one, what was probably meant."""
from __future__ import annotations

import warnings
from numbers import Real

import numpy as np

from ..arrays import array_module, dtype_fix, to_numpy
from ..errors import RnnGraphError, RnnGraphWarning
from ..ir.ops import OpKind


def check_finite(name: str, a):
    """Raises RnnGraphError naming `name` if the array (or scalar) `a` holds NaN or inf; returns `a`.

    Usable on losses and gradients in a training loop: ``check_finite("loss", loss)``.
    """
    xp = array_module(a)
    arr = xp.asarray(a)
    if arr.dtype.kind not in "fc":
        return a
    bad = ~xp.isfinite(arr)
    if bool(bad.any()):
        nan, n_bad = int(xp.isnan(arr).sum()), int(bad.sum())
        first = tuple(int(i) for i in xp.argwhere(bad)[0]) if arr.ndim else ()
        where = f"; first at index {first}" if first else ""
        raise RnnGraphError(f"{name} is not finite: {nan} NaN and {n_bad - nan} inf among {arr.size} "
                            f"values{where}")
    return a


def first_nonfinite(cell, ws, unstored=frozenset()) -> str | None:
    """Where a forward on workspace `ws` first stored a NaN or inf: its earliest frame, then the first op
    in evaluation order there ("op 'add17' (add) at frame 3"), or a parameter; None where all are finite.
    unstored: the nodes whose values the backend's forward keeps inside a fused pass (their buffers are stale)."""
    xp = array_module(ws.vals[next(iter(cell.inputs))])
    for p in cell.params:
        if not bool(xp.isfinite(ws.vals[p]).all()):
            return f"parameter '{p}' is not finite"
    found = []
    for k, n in enumerate(cell.frame_order()):
        if cell.op(n).kind is not OpKind.INPUT and n not in unstored:
            frames = xp.flatnonzero(~xp.isfinite(ws.frames(ws.vals[n]).reshape(ws.T, -1)).all(axis=1))
            found += [(int(frames[0]), k, n)] if frames.size else []
    if not found:
        return None
    t, _, n = min(found)
    return f"op '{n}' ({cell.op(n).kind.value}) at frame {t}"


def check_stored(runs, dtype):
    """check_finite's look inside a recurrent layer's forward: every value it stored must be finite (a
    float16 overflow that a saturating sigmoid hides too), else one error naming the layer, the direction
    and the first op. runs: [layer][direction] objects with the executor as .ex."""
    for l, per_l in enumerate(runs):
        for d, run in enumerate(per_l):
            ex = run.ex
            where = first_nonfinite(ex.cell, ex.ws, ex.backend.unstored(ex.sched))
            if where:
                hint = ("; float16 holds at most 65504: scale the inputs or weights down, or use bfloat16"
                        if dtype.name == "float16" else "")
                raise RnnGraphError(f"layer {l}{' (reverse direction, time-reversed frames)' if d else ''} stored a "
                                    f"value that is not finite: {where}{hint}")


def check_config(input_size, hidden_size, num_layers, dropout):
    for name, v in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
        if isinstance(v, bool) or not isinstance(v, Real) or not v >= 1 or v % 1:
            raise RnnGraphError(f"{name} must be a positive integer, got {v!r}")
    if not 0.0 <= dropout < 1.0:
        raise RnnGraphError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    if dropout > 0 and num_layers == 1:
        warnings.warn("dropout acts between stacked layers only (not after the last one); with "
                      "num_layers=1 it does nothing", RnnGraphWarning, stacklevel=4)


def resolve_init(init, table: dict):
    if callable(init):
        return init
    if isinstance(init, str) and init in table:
        return table[init]
    raise RnnGraphError(f"unknown init {init!r}; choose {', '.join(map(repr, table))} or pass a function "
                        "that fills the layer's parameters")


def check_cell(cell, input_size: int, layer: int):
    if len(cell.inputs) != 1 or len(cell.outputs) != 1:
        raise RnnGraphError(f"a recurrent layer needs a cell with one input and one output; cell "
                            f"'{cell.name}' has inputs {list(cell.inputs)} and outputs {list(cell.outputs)}")
    (name, got), = cell.inputs.items()
    if got != input_size:
        why = "input_size" if layer == 0 else f"layer {layer}'s input (previous output × directions)"
        raise RnnGraphError(f"cell '{cell.name}' takes input '{name}' of {got} features but {why} is "
                            f"{input_size}; pass a cell function or name so each layer is built for its size")


def check_array(name: str, a, backend, dtype):
    """`a` itself if it is an array of the layer's backend and dtype; otherwise a clear error."""
    xp = backend.xp
    if not isinstance(a, xp.ndarray):
        kind = type(a).__module__.split(".")[0]
        hint = {"torch": f"pass {name}.detach().cpu().numpy()" if backend.name == "numpy" else
                         f"convert it with {xp.__name__}.asarray",
                "cupy": f"move it to the host with {name}.get(), or build the layer with backend='cupy'",
                "numpy": f"move it to the GPU with cupy.asarray({name}), or build the layer with "
                         "backend='numpy'"}.get(kind, f"convert it with {xp.__name__}.asarray")
        raise RnnGraphError(f"{name} is a {type(a).__module__}.{type(a).__name__} but this layer runs on "
                            f"the {backend.name} backend and takes {xp.__name__} arrays; {hint}")
    if a.dtype != dtype:
        raise RnnGraphError(f"{name} has dtype {a.dtype} but the layer is {dtype}; "
                            + dtype_fix(name, a.dtype, dtype))
    return a


def check_input(x, input_size: int, batch_first: bool):
    layout = "[B, T, D] (batch_first=True)" if batch_first else "[T, B, D] (batch_first=False)"
    if x.ndim != 3:
        hint = ""
        if x.ndim == 2:
            hint = (f"; for one sequence add a batch axis: x[{':, ' if not batch_first else ''}None]")
        raise RnnGraphError(f"x must be 3-D {layout}, got {x.ndim}-D shape {list(x.shape)}{hint}")
    if x.shape[2] != input_size:
        hint = ""
        if input_size in x.shape[:2]:
            hint = "; the features must be the last axis"
        raise RnnGraphError(f"x has {x.shape[2]} features (its last axis) but input_size is {input_size}; "
                            f"x is {layout}, got shape {list(x.shape)}{hint}")
    if 0 in x.shape:
        raise RnnGraphError(f"x has no frames or no sequences: shape {list(x.shape)}")


def check_lengths(lengths, T: int, B: int):
    """Host int64 lengths [B], or None when absent or every sequence fills all T frames."""
    if lengths is None:
        return None
    n = to_numpy(lengths)
    if n.shape != (B,) or n.dtype.kind not in "iu":
        raise RnnGraphError(f"lengths must be {B} integers (one per sequence), got "
                            f"{n.dtype} shape {list(n.shape)}")
    if n.min() < 0 or n.max() > T:
        raise RnnGraphError(f"lengths must lie in [0, T={T}], got min {n.min()} and max {n.max()}")
    return None if (n == T).all() else n.astype(np.int64)


def check_grad_shape(name: str, got: tuple, expected: tuple, what: str):
    if tuple(got) != tuple(expected):
        raise RnnGraphError(f"{name} must have the shape of {what}, {list(expected)}; got {list(got)}")


def split_state(state, names: tuple, owner: str, label: str) -> list:
    """The user's state as one entry (array or None) per state name."""
    if state is None:
        return [None] * len(names)
    labels = lambda: ", ".join(label.format(s) for s in names)
    if isinstance(state, (tuple, list)):
        if len(state) != len(names):
            raise RnnGraphError(f"{owner} takes {len(names)} state array(s) ({labels()}), got a "
                                f"{type(state).__name__} of {len(state)}")
        return list(state)
    if len(names) > 1:
        raise RnnGraphError(f"{owner} takes its state as a tuple ({labels()}), got a single "
                            f"{type(state).__name__}")
    return [state]


def check_state_shape(name: str, got: tuple, expected: tuple, T: int, layer):
    """Expected [L·dirs, B, S]; explains the usual mix-ups (swapped axes, batch_first, directions)."""
    if tuple(got) == tuple(expected):
        return
    K, B, S = expected
    L, nd = layer.num_layers, layer.num_directions
    head = (f"{name} must be [num_layers·num_directions, B, {S}] = [{L}·{nd}, {B}, {S}] = {list(expected)} "
            f"whatever batch_first is; got {list(got)}")
    hints = []
    if len(got) == 2 and tuple(got) == (B, S):
        hints.append(f"add the leading layers·directions axis ({name}[None] when it is {K})")
    elif len(got) == 3:
        g0, g1, g2 = got
        if (g0, g1) == (B, K) and B != K:
            hints.append("the first two axes look swapped (batch first); batch_first applies to x and y "
                         f"only, never to states: use {name}.transpose(1, 0, 2)")
        elif g0 == B and g0 != K:
            hints.append("its first axis is the batch size; states are layers·directions first, whatever "
                         "batch_first is")
        if g1 == T and g1 != B and g0 == K:
            flip = not layer.batch_first
            hints.append(f"its batch axis ({g1}) equals the time length of x as read now; x is taken as "
                         f"{'[B, T, D]' if layer.batch_first else '[T, B, D]'}: if x is actually "
                         f"{'[B, T, D]' if flip else '[T, B, D]'}, build the layer with batch_first={flip}")
        if g0 != K and (g1, g2) == (B, S):
            hints.append(_directions_hint(g0, L, nd))
        if g2 != S and (g0, g1) == (K, B):
            hints.append(f"its last axis must be the state size {S}, got {g2}")
    raise RnnGraphError(head + "".join(f"\n  hint: {h}" for h in hints))


def _directions_hint(got: int, L: int, nd: int) -> str:
    text = f"it holds {got} layer·direction slices, expected num_layers·num_directions = {L}·{nd} = {L * nd}"
    if nd == 2 and got == L:
        text += ("; a bidirectional layer needs one slice per layer and direction, ordered layer 0 "
                 "forward, layer 0 reverse, layer 1 forward, ...")
    elif nd == 1 and got == 2 * L:
        text += "; that is the count of a bidirectional layer: did you mean bidirectional=True?"
    return text
