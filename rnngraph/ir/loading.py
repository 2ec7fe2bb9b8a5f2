"""Loading a cell from what a user names: a built-in's name, 'module:function', 'path/to/file.py:function', a
cell function or a CellGraph; the cell function's own options; errors that name the user's file and line."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
import traceback
from typing import Callable

from ..errors import RnnGraphError
from .cells import CELLS
from .graph import CellGraph


def load_cell(spec, input_size: int, hidden_size: int, bias: bool = True, **options) -> CellGraph:
    """A CellGraph from a built-in name, 'module:function', 'path/to/file.py:function', a cell function or a
    CellGraph; options are passed to the cell function as keywords, e.g. ``load_cell("slstm", 64, 256, heads=8)``.

    Whatever goes wrong in the user's function (an exception, a wrong signature, a result that is not a
    CellGraph) is one RnnGraphError naming the spec and, for an exception, the user's file:line; so is an
    option the function does not take.
    """
    if isinstance(spec, CellGraph):
        if options:
            raise RnnGraphError(f"cell options {sorted(options)} apply to a cell function; cell '{spec.name}' is a "
                                "CellGraph, already built: build it with those options instead")
        return spec
    fn, what = _cell_function(spec)
    try:
        sig = inspect.signature(fn)
    except ValueError:               # a builtin without a signature: calling it tells
        sig = None
    kw = {"bias": bias} if sig and "bias" in sig.parameters else {}
    if sig and options:
        _check_options(sig, options, what)
    kw.update(options)
    try:
        if sig:
            sig.bind(input_size, hidden_size, **kw)
    except TypeError:
        raise RnnGraphError(f"{what} must take (input_size, hidden_size, bias=True), but its signature is "
                            f"{sig}") from None
    try:
        cell = fn(input_size, hidden_size, **kw)
    except Exception as e:           # the user's error and line, not our frames
        where = _user_line(e.__traceback__)
        if isinstance(e, RnnGraphError):
            if not where:            # a built-in cell: the message says it all
                raise
            raise RnnGraphError(f"{e} ({what}{where})") from None
        raise RnnGraphError(f"{what} raised {type(e).__name__}: {e}{where}") from None
    if not isinstance(cell, CellGraph):
        raise RnnGraphError(f"{what} returned {type(cell).__name__}, not a CellGraph (did you forget .build()?)")
    return cell


def cell_options(spec) -> tuple | None:
    """The options (keywords) the cell function `spec` names takes beyond (input_size, hidden_size, bias), e.g.
    ('heads',) for 'slstm'; () for a CellGraph; None where it takes any (**kw) or shows no signature."""
    if isinstance(spec, CellGraph):
        return ()
    try:
        return _taken(inspect.signature(_cell_function(spec)[0]))
    except ValueError:
        return None


def _taken(sig) -> tuple | None:
    """The keywords after (input_size, hidden_size) and bias in a cell function's signature; None for **kw."""
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return tuple(p.name for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "bias")


def _check_options(sig, options: dict, what: str):
    """Raises naming the options a cell function's signature does not take, and those it does."""
    takes = _taken(sig)
    if takes is None:
        return
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise RnnGraphError(f"{what} takes no option {', '.join(map(repr, unknown))}; its options: "
                            f"{', '.join(takes) or 'none'}")


def _import_from_cwd(mod: str):
    """Imports `mod` with the working directory first on sys.path for that import only (as `python -m`
    would find it there), so a user's cell module is found without leaving the folder on the path."""
    return _with_path(os.getcwd(), lambda: importlib.import_module(mod))


def _import_file(path: str):
    """The module in the .py file `path` (absolute, or relative to the working directory), run once per file
    under a name made from its path, with the file's folder first on sys.path while it runs (for its own
    imports)."""
    full = os.path.abspath(path)
    name = f"rnngraph_cells_{os.path.splitext(os.path.basename(full))[0]}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, full))
    sys.modules[name] = module
    try:
        _with_path(os.path.dirname(full), lambda: module.__spec__.loader.exec_module(module))
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _with_path(folder: str, load: Callable):
    sys.path.insert(0, folder)
    try:
        return load()
    finally:
        sys.path.remove(folder)        # the first occurrence: the one inserted above


def _cell_function(spec) -> tuple[Callable, str]:
    """The cell function `spec` names, and how to name it in an error."""
    if callable(spec):
        return spec, f"cell function {getattr(spec, '__qualname__', spec)!r}"
    if isinstance(spec, str) and spec in CELLS:
        return CELLS[spec][0], f"cell '{spec}'"
    if not isinstance(spec, str) or ":" not in spec:
        raise RnnGraphError(f"unknown cell {spec!r}; built-in cells: {', '.join(CELLS)}; "
                            "or pass 'module:function' or 'path/to/file.py:function'")
    mod, _, attr = spec.rpartition(":")
    is_file = mod.endswith(".py") or os.sep in mod or bool(os.altsep and os.altsep in mod)
    if is_file and not os.path.isfile(mod):
        raise RnnGraphError(f"cell file '{mod}' not found (in {os.getcwd()}); give the path of a .py file, or "
                            "module:function for a module in the working folder or on the path")
    try:
        module = _import_file(mod) if is_file else _import_from_cwd(mod)
    except Exception as e:  # show the user's own import error, not our frames
        raise RnnGraphError(f"cannot import cell {'file' if is_file else 'module'} '{mod}': {type(e).__name__}: {e}"
                            f"{_user_line(e.__traceback__)}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise RnnGraphError(f"{'file' if is_file else 'module'} '{mod}' has no cell function '{attr}'")
    if not callable(fn):
        raise RnnGraphError(f"'{spec}' is not callable (type {type(fn).__name__}); expected a cell function "
                            "fn(input_size, hidden_size, bias=True) -> CellGraph")
    return fn, f"cell function '{spec}'"


def _user_line(tb) -> str:
    """', at FILE:LINE' of the innermost frame outside rnngraph and the Python installation, or ''."""
    python = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    ours = (os.path.dirname(os.path.dirname(__file__)) + os.sep, "<frozen ", *python)
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(ours)]
    return f", at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
