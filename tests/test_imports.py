"""The house has floors: a module imports only from its own floor or those below, and no import circles."""
import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rnngraph"
# Lowest first. A module's floor is its longest matching prefix; the facade (rnngraph/__init__, __main__ and
# the plain modules optim, layers, losses) sits on top. The cupy backend's room, run/backends/cuda, holds every
# CUDA source generator (pure strings, below the backends) and, above them, what runs them on a GPU.
CUDA_GENERATORS = ("source", "fused", "rows", "pair", "matmul", "param_grad", "scan", "elementwise", "persistent",
                   "chunks", "split", "x3")
# The compiled CPU backend's room, run/backends/cpu, translates the CUDA generators' specs (so sits above them):
# its generators, then numba's prelude and module cache, the strategy runners, and its backend above the base.
CPU_ROOM = ("source", "fused", "blas", "jit", "prelude", "stages", "scan", "elementwise", "persistent")
FLOORS = ("version", "errors", "arrays", "ir", "plan", "run", "run.backends.cuda",
          *(f"run.backends.cuda.{m}" for m in CUDA_GENERATORS), "run.backends.cpu",
          *(f"run.backends.cpu.{m}" for m in CPU_ROOM),
          "run.backends.base", "run.backends.numpy_backend", "run.backends.cuda.cublas", "run.backends.cuda.recordings",
          "run.backends.cuda.backend", "run.backends.cpu.backend", "run.backends", "run.workspace", "run.chunks",
          "run.handlers", "run.executor",
          "nn", "torch", "train", "distributed", "lab")
FACADE = ("rnngraph", "rnngraph.__main__", "rnngraph.optim", "rnngraph.layers", "rnngraph.losses")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    """rnngraph module name -> (its path, whether it is a package)."""
    return {module_name(p): (p, p.name == "__init__.py") for p in PACKAGE.rglob("*.py")}


def imports(name: str, path: Path, is_package: bool, known) -> set:
    """Every rnngraph module that `name` imports, at module level or inside functions."""
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "rnngraph"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "rnngraph":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & set(known)   # `from . import checks`
            out |= subs or {target}
    return out - {name}


def floor(name: str) -> int:
    rest = name.split(".", 1)[1] if "." in name else ""
    matches = [k for k, f in enumerate(FLOORS) if rest == f or rest.startswith(f + ".")]
    return max(matches, key=lambda k: len(FLOORS[k])) if matches else len(FLOORS)    # else the facade


def import_graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    for name, (path, is_package) in known.items():
        g.add_node(name)
        g.add_edges_from((name, t) for t in imports(name, path, is_package, known))
    return g


def test_every_module_has_a_floor():
    unplaced = [m for m in modules() if floor(m) == len(FLOORS) and m not in FACADE]
    assert not unplaced, f"modules outside every floor: {unplaced}; add their package to FLOORS"


def test_no_module_imports_from_a_higher_floor():
    upward = [f"{u} ({FLOORS[floor(u)]}) imports {v} ({FLOORS[floor(v)] if floor(v) < len(FLOORS) else 'the facade'})"
              for u, v in import_graph().edges if floor(v) > floor(u)]
    assert not upward, "\n".join(upward)


def test_no_import_circles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, cycles


def test_the_checker_sees_imports_of_every_form(tmp_path):
    """The parser resolves relative, nested and `from . import module` imports (a test of the test)."""
    known = {"rnngraph.nn.checks": None, "rnngraph.nn.layers": None, "rnngraph.ir.ops": None}
    src = tmp_path / "x.py"
    src.write_text("from . import checks as chk\nfrom ..ir.ops import OpKind\n"
                   "def f():\n    from .layers import Dense\n    import rnngraph.lab.cli\n")
    assert imports("rnngraph.nn.recurrent", src, False, known) == {
        "rnngraph.nn.checks", "rnngraph.ir.ops", "rnngraph.nn.layers", "rnngraph.lab.cli"}
    assert floor("rnngraph.run.backends.cuda.fused") < floor("rnngraph.run.backends.cuda.backend") \
        < floor("rnngraph.run.executor") < floor("rnngraph.nn")
    assert floor("rnngraph.run.backends.cuda.persistent.kernels") == floor("rnngraph.run.backends.cuda.persistent")


def test_rnngraph_imports_without_torch_until_rnngraph_torch_is_used():
    """Everything but rnngraph.torch (and the lab's torch references, imported by the commands that need
    them) imports without torch; rnngraph.torch imports it."""
    code = ("import sys, rnngraph, rnngraph.nn, rnngraph.train.loop, rnngraph.lab.cli, rnngraph.lab.bench\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "import rnngraph.torch\nassert 'torch' in sys.modules\n")
    import subprocess
    import sys
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def private_imports() -> list:
    """(module, imported module, name) for every `from rnngraph... import _name`."""
    known, out = modules(), []
    for name, (path, is_package) in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("rnngraph")):
                out += [(name, node.module, a.name) for a in node.names if a.name.startswith("_") and a.name != "__version__"]
    return out


def test_no_module_imports_another_modules_private_names():
    assert not private_imports(), private_imports()


def test_every_cuda_source_generator_lives_in_the_cuda_room():
    """CUDA text (an extern "C" __global__ kernel) appears in run/backends/cuda alone."""
    outside = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if "__global__" in p.read_text() and "run/backends/cuda" not in p.as_posix()]
    assert not outside, outside
