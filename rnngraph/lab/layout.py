"""The package's layout read from the tree: its floors in import order, each with what lives there (the first
sentence of its docstring) and its modules, as the Markdown table `rnngraph report` renders into a page that
holds the layout markers (docs/architecture.md).

Example::

    print(layout_table())       # | floor | what lives there | modules |
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1]          # the rnngraph folder


def floors(package: Path = PACKAGE) -> list:
    """(floor, what lives there, its modules) for the package's own modules, then each subpackage, lowest
    first: a floor comes after every floor it imports (ties by name)."""
    subs = sorted(p.parent for p in package.glob("*/__init__.py"))
    graph = nx.DiGraph()
    graph.add_nodes_from(p.name for p in subs)
    for sub in subs:
        for path in sub.rglob("*.py"):
            graph.add_edges_from((t, sub.name) for t in _imported_floors(path, package) if t in graph and t != sub.name)
    top = [(f"{package.name}/", _first_sentence(package / "__init__.py"),
            sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py"))]
    return top + [(f"{name}/", _first_sentence(package / name / "__init__.py"),
                   sorted(str(p.relative_to(package / name)) for p in (package / name).rglob("*.py")
                          if p.name != "__init__.py" or p.parent != package / name))
                  for name in nx.lexicographical_topological_sort(graph)]


def layout_table(package: Path = PACKAGE) -> str:
    rows = [f"| `{name}` | {what} | {', '.join(f'`{m}`' for m in modules)} |" for name, what, modules in floors(package)]
    return "\n".join(["| floor | what lives there | modules |", "|---|---|---|", *rows])


def _imported_floors(path: Path, package: Path) -> set:
    """The first name below the package of every rnngraph module that the file imports (anywhere in it)."""
    here = path.relative_to(package.parent).with_suffix("").parts[:-1]      # the file's package, as parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(here[:len(here) - node.level + 1]) if node.level else []
            targets = [base + (node.module.split(".") if node.module else [])]
        else:
            continue
        out |= {t[1] for t in targets if len(t) > 1 and t[0] == package.name}
    return out


def _first_sentence(path: Path) -> str:
    """The docstring's first sentence (up to its first period followed by a space, or its first paragraph)."""
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0].split())
    head, dot, _ = doc.partition(". ")
    return (head + "." if dot else doc).replace("|", "\\|")
